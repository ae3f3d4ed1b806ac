"""`kdt sanitize`: `kdt verify` under compute-sanitizer's memcheck, racecheck, initcheck and synccheck."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.text import Text

from kdt import sanitize, toolkit
from kdt.commands import common
from kdt.commands.common import FormatOption, KnobOption, RunArchOption, SmsOption, StagesArg
from kdt.console import EXIT_ENVIRONMENT, EXIT_OK, OutputFormat, Report, Sheet, errors, styled
from kdt.refs.errors import BadInput

_STATUS_STYLE = {"clean": "green", "findings": "red", "verify failed": "red", "timeout": "red", "crashed": "red",
                 "unsupported": "yellow", "environment": "yellow"}


def _cell(result: sanitize.ToolResult) -> Text:
    status = result.status
    text = f"{result.finding_count} finding{'s' if result.finding_count != 1 else ''}" if status == "findings" else status
    return Text.assemble(styled(text, _STATUS_STYLE[status]), f" ({result.elapsed_s:.0f} s)")


def _sanitize_table(kernels: list[str], tools: list[str], results: list[sanitize.ToolResult]) -> Sheet:
    table = Sheet("kdt sanitize: compute-sanitizer findings per kernel and tool", ["kernel", *tools, "verify inside"])
    by_key = {(r.kernel, r.tool): r for r in results}
    for kernel in kernels:
        cells = [_cell(by_key[(kernel, tool)]) if (kernel, tool) in by_key else "-" for tool in tools]
        summaries = sorted({by_key[(kernel, t)].verify_summary for t in tools if (kernel, t) in by_key} - {""})
        table.add_row(kernel, *cells, " / ".join(summaries))
    return table


def _report_details(out: Report, result: sanitize.ToolResult, limit: int = 10) -> None:
    if result.clean:
        return
    where = f" (log: {result.log_path})" if result.log_path else ""
    out.say(f"[{_STATUS_STYLE[result.status]}]{result.kernel} / {result.tool}: {result.status}[/]{escape(where)}")
    shown = result.findings[:limit]
    out.verbatim(shown + ([f"... {len(result.findings) - limit} more"] if len(result.findings) > limit else []))
    if not shown:  # a crash, a timeout, a verify failure: the end of the log says why (of each such case)
        for part in [part for part in result.parts if not part.clean] or [result]:
            if result.parts:
                out.say(f"  case {escape(part.case)}: {part.status}")
            out.verbatim(part.log.strip().splitlines()[-15:], prefix="  | ")


def _result_json(result: sanitize.ToolResult) -> dict:
    """A ToolResult as plain data: its status and findings; of the log only the end, where nothing was found."""
    return {"kernel": result.kernel, "tool": result.tool, "status": result.status, "returncode": result.returncode,
            "elapsed_s": result.elapsed_s, "errors": result.errors, "hazards": result.hazards,
            "race_errors": result.race_errors, "race_warnings": result.race_warnings, "findings": result.findings,
            "verify_passed": result.verify_passed, "verify_failed": result.verify_failed,
            "log_path": None if result.log_path is None else str(result.log_path), "command": result.command,
            "log_tail": [] if result.clean or result.findings else result.log.strip().splitlines()[-15:],
            "cases": [{"case": part.case, "status": part.status, "elapsed_s": part.elapsed_s, "command": part.command}
                      for part in result.parts]}


def command(kernels: list[str] = StagesArg,
                     tool: Optional[list[str]] = typer.Option(None, "--tool",
                                                              help="memcheck, racecheck, initcheck, synccheck "
                                                                   "(repeatable; default: all four)"),
                     case: Optional[str] = typer.Option(None, "--case", help="only golden cases matching this glob"),
                     keep_logs: Optional[Path] = typer.Option(None, "--keep-logs",
                                                              help="write each run's log to DIR/<kernel>.<tool>.log"),
                     timeout: float = typer.Option(sanitize.DEFAULT_TIMEOUT_S, "--timeout", min=1,
                                                   help="seconds allowed per run (a kernel under a tool; with "
                                                        "--jobs above 1, one golden case of it)"),
                     jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1,
                                                        help="runs at once, one golden case each (racecheck's "
                                                             "time is the host's); 1: one run a kernel and tool, "
                                                             "in order (default: one a core, at most "
                                                             f"{sanitize.DEFAULT_JOBS})"),
                     knob: Optional[list[str]] = KnobOption, arch: Optional[str] = RunArchOption,
                     sms: Optional[int] = SmsOption, output: OutputFormat = FormatOption):
    """`kdt verify` under compute-sanitizer memcheck, racecheck, initcheck and synccheck; exit 1 on any finding."""
    from kdt import stages

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
    names = [spec.name for spec in specs]
    # the cases each run verifies, read (and --case checked) before anything is built
    cases = {name: sanitize.golden_case_names(name, case) for name in names}
    jobs = jobs or sanitize.default_jobs()
    common.preflight(specs)  # builds every cubin here, so the runs under the sanitizer find them cached

    def started(kernel: str, name: str) -> None:
        errors.print(f"{name} on {kernel} ...")

    def finished(result: sanitize.ToolResult) -> None:
        errors.print(f"{result.tool} on {result.kernel}:", _cell(result))

    if jobs > 1:
        runs = sum(len(cases[name]) for name in names) * len(tools)
        errors.print(f"{runs} runs (a golden case under a tool each), {min(jobs, runs)} at a time")
    results = sanitize.run_sanitize(names, tools, sanitizer=sanitizer, case=case, timeout_s=timeout,
                                    keep_logs=keep_logs, on_start=started, on_result=finished,
                                    knobs=knob or (), arch=arch, sms=sms, jobs=jobs,
                                    case_names=lambda name, _: cases[name])
    out = Report("sanitize", output)
    out.table(_sanitize_table(names, tools, results))
    for result in results:
        _report_details(out, result)
    code = sanitize.exit_code(results)
    if code == EXIT_ENVIRONMENT:
        out.say("[yellow]compute-sanitizer could not check every kernel on this machine[/] "
                "(unsupported device or runtime, or no GPU): nothing was found, nothing was proven")
    elif code == EXIT_OK:
        out.say(f"clean: {', '.join(names)} under {', '.join(tools)}")
    out.document({"ok": code == EXIT_OK, "exit_code": code, "kernels": names, "tools": tools,
                  "results": [_result_json(result) for result in results]})
    raise typer.Exit(code)
