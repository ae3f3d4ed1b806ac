"""`kdt sanitize`: `kdt verify` under compute-sanitizer's memcheck, racecheck, initcheck and synccheck."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from kdt import sanitize, stages, toolkit
from kdt.commands import common
from kdt.commands.common import KnobOption, RunArchOption, SmsOption, StagesArg
from kdt.console import EXIT_ENVIRONMENT, EXIT_OK, console, errors
from refs.errors import BadInput

_STATUS_STYLE = {"clean": "green", "findings": "red", "verify failed": "red", "timeout": "red", "crashed": "red",
                 "unsupported": "yellow", "environment": "yellow"}


def _cell(result: sanitize.ToolResult) -> str:
    status = result.status
    text = f"{result.finding_count} finding{'s' if result.finding_count != 1 else ''}" if status == "findings" else status
    return f"[{_STATUS_STYLE[status]}]{text}[/] ({result.elapsed_s:.0f} s)"


def _sanitize_table(kernels: list[str], tools: list[str], results: list[sanitize.ToolResult]) -> Table:
    table = Table(title="kdt sanitize: compute-sanitizer findings per kernel and tool")
    table.add_column("kernel")
    for tool in tools:
        table.add_column(tool)
    table.add_column("verify inside")
    by_key = {(r.kernel, r.tool): r for r in results}
    for kernel in kernels:
        cells = [_cell(by_key[(kernel, tool)]) if (kernel, tool) in by_key else "-" for tool in tools]
        summaries = sorted({by_key[(kernel, t)].verify_summary for t in tools if (kernel, t) in by_key} - {""})
        table.add_row(kernel, *cells, escape(" / ".join(summaries)))
    return table


def _print_sanitize_details(result: sanitize.ToolResult, limit: int = 10) -> None:
    if result.clean:
        return
    where = f" (log: {result.log_path})" if result.log_path else ""
    console.print(f"[{_STATUS_STYLE[result.status]}]{result.kernel} / {result.tool}: {result.status}[/]{escape(where)}")
    shown = result.findings[:limit]
    for line in shown:
        console.print(f"  {escape(line)}")
    if len(result.findings) > limit:
        console.print(f"  ... {len(result.findings) - limit} more")
    if not shown:  # a crash, a timeout, a verify failure: the end of the log says why
        for line in result.log.strip().splitlines()[-15:]:
            console.print(f"  | {escape(line)}")


def command(kernels: list[str] = StagesArg,
                     tool: Optional[list[str]] = typer.Option(None, "--tool",
                                                              help="memcheck, racecheck, initcheck, synccheck "
                                                                   "(repeatable; default: all four)"),
                     case: Optional[str] = typer.Option(None, "--case", help="only golden cases matching this glob"),
                     keep_logs: Optional[Path] = typer.Option(None, "--keep-logs",
                                                              help="write each run's log to DIR/<kernel>.<tool>.log"),
                     timeout: float = typer.Option(sanitize.DEFAULT_TIMEOUT_S, "--timeout", min=1,
                                                   help="seconds allowed per kernel and tool"),
                     knob: Optional[list[str]] = KnobOption, arch: Optional[str] = RunArchOption,
                     sms: Optional[int] = SmsOption):
    """`kdt verify` under compute-sanitizer memcheck, racecheck, initcheck and synccheck; exit 1 on any finding."""
    tools = list(dict.fromkeys(tool or sanitize.TOOLS))
    for name in tools:
        if name not in sanitize.TOOLS:
            raise BadInput("--tool", "one of " + ", ".join(sanitize.TOOLS), name)
    specs = stages.select(kernels)
    sanitizer = sanitize.find_sanitizer()
    if sanitizer is None:
        raise toolkit.ToolkitMissing("compute-sanitizer not found (next to nvcc, on PATH, under CUDA_HOME or "
                                     "/usr/local/cuda, or by cuda-pathfinder); it ships with the CUDA toolkit")
    common.knobs_for(specs, knob)
    common.select_run(arch, sms)
    common.preflight(specs)  # builds every cubin here, so the runs under the sanitizer find them cached

    def started(kernel: str, name: str) -> None:
        errors.print(f"{name} on {kernel} ...")

    def finished(result: sanitize.ToolResult) -> None:
        errors.print(f"{result.tool} on {result.kernel}: {_cell(result)}")

    names = [spec.name for spec in specs]
    results = sanitize.run_sanitize(names, tools, sanitizer=sanitizer, case=case, timeout_s=timeout,
                                    keep_logs=keep_logs, on_start=started, on_result=finished,
                                    knobs=knob or (), arch=arch, sms=sms)
    console.print(_sanitize_table(names, tools, results))
    for result in results:
        _print_sanitize_details(result)
    code = sanitize.exit_code(results)
    if code == EXIT_ENVIRONMENT:
        console.print("[yellow]compute-sanitizer could not check every kernel on this machine[/] "
                      "(unsupported device or runtime, or no GPU): nothing was found, nothing was proven")
    elif code == EXIT_OK:
        console.print(f"clean: {', '.join(names)} under {', '.join(tools)}")
    raise typer.Exit(code)
