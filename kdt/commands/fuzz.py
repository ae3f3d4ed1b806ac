"""`kdt fuzz`: random cases of random shape on the GPU against the reference; failures shrunk and kept as
regression cases (golden/regressions/<kernel>.h5)."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Optional

import typer
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from kdt import fuzz, stages
from kdt.commands import common
from kdt.commands.common import KnobOption, RunArchOption, SmsOption, StagesArg
from kdt.console import EXIT_CHECK_FAILED, EXIT_OK, console, errors
from refs.errors import BadInput


def device_hooks(graph: bool, knobs: dict):
    """(run_case, healthy) for the GPU; tests replace this with a fake kernel."""
    return fuzz.device_runner(graph, knobs), fuzz.device_healthy


def _fuzz_table(seed: int, rows: dict[str, fuzz.FuzzProgress]) -> Table:
    table = Table(title=f"kdt fuzz (seed {seed})")
    for column in ("kernel", "now", "cases", "failures", "generator bugs", "cases/s", "seconds", "shrink runs"):
        table.add_column(column, justify="left" if column in ("kernel", "now") else "right")
    for row in rows.values():
        table.add_row(row.kernel, escape(row.phase), str(row.cases_run),
                      f"[red]{row.failures}[/]" if row.failures else "0",
                      f"[red]{row.generator_bugs}[/]" if row.generator_bugs else "0",
                      f"{row.cases_per_s:.1f}", f"{row.elapsed_s:.1f}", str(row.shrink_runs))
    return table


def _print_fuzz_report(report: fuzz.FuzzReport) -> None:
    for failure in report.failures:
        console.print(f"[red]FAIL[/] {report.kernel} case {failure.index} (seed {failure.seed}): "
                      f"{escape(failure.detail)}")
        shrunk = (f"shrunk in {failure.shrink_steps} step(s) ({failure.shrink_runs} runs) from "
                  f"{escape(fuzz.summarize(failure.original))}" if failure.shrink_steps else "not shrunk")
        console.print(f"  smallest failing case: {escape(fuzz.summarize(failure.shrunk))}; {shrunk}")
        if failure.duplicate_of is not None:
            console.print(f"  the same failure and smallest shape as case {failure.duplicate_of}: not saved again")
        elif failure.saved_to is not None:
            console.print(f"  saved as {failure.saved_as} in {failure.saved_to}: "
                          f"kdt verify {report.kernel} --golden {failure.saved_to} --case {failure.saved_as}")
        elif failure.save_error:
            console.print(f"  [red]{escape(failure.save_error)}[/]")
        console.print(f"  replay: kdt fuzz {report.kernel} {failure.replay}")
    for bug in report.generator_bugs[:5]:
        console.print(f"[red]generator bug[/] {report.kernel} case {bug.index} ({bug.where}): {escape(bug.message)}"
                      + (f" [{escape(bug.case)}]" if bug.case else ""))
    if len(report.generator_bugs) > 5:
        console.print(f"  ... and {len(report.generator_bugs) - 5} more generator bugs")
    if report.context_lost:
        console.print(f"[red]CUDA context lost[/] in {report.kernel}: {escape(report.context_lost)}")


def command(kernels: list[str] = StagesArg,
                 seconds: Optional[float] = typer.Option(None, "--seconds", min=0,
                                                         help="fuzz each kernel this long (default 60, none with --cases)"),
                 seed: Optional[int] = typer.Option(None, "--seed", min=0,
                                                    help="case i is drawn from default_rng([seed, i]) (default: new, printed)"),
                 cases: Optional[int] = typer.Option(None, "--cases", min=1, help="at most this many cases per kernel"),
                 start: int = typer.Option(0, "--start", min=0,
                                           help="index of the first case (replay one: --seed S --start I --cases 1)"),
                 golden_dir: Path = typer.Option(Path("golden"), "--golden-dir",
                                                 help="failures are saved to GOLDEN_DIR/regressions/<kernel>.h5"),
                 save: bool = typer.Option(True, "--save/--no-save", help="save shrunk failures as regression cases"),
                 graph: bool = typer.Option(False, "--graph", help="launch every case inside a CUDA graph"),
                 max_failures: int = typer.Option(fuzz.DEFAULT_MAX_FAILURES, "--max-failures", min=1,
                                                  help="stop fuzzing a kernel after this many failures"),
                 shrink_runs: int = typer.Option(fuzz.DEFAULT_SHRINK_RUNS, "--shrink-runs", min=0,
                                                 help="at most this many runs to shrink one failure"),
                 knob: Optional[list[str]] = KnobOption, arch: Optional[str] = RunArchOption,
                 sms: Optional[int] = SmsOption):
    """Random cases of random shape on the GPU against the reference; failures shrunk and saved as regressions."""
    specs = stages.select(kernels)
    if seconds is None and cases is None:
        seconds = 60.0
    if seed is None:
        seed = secrets.randbelow(2**31)
    without = [spec.name for spec in specs if spec.random_case is None]
    if without:
        raise BadInput("KERNEL", "kernels whose stage has a random_case generator", ", ".join(without))
    knobs = common.knobs_for(specs, knob)
    common.select_run(arch, sms)
    common.preflight(specs)
    errors.print(f"kdt fuzz: seed {seed} (rerun with --seed {seed}), "
                 + (f"{seconds:g} s" if seconds is not None else "no time limit")
                 + (f", at most {cases} cases" if cases is not None else "") + " per kernel"
                 + (", in CUDA graphs" if graph else ""))
    rows: dict[str, fuzz.FuzzProgress] = {}
    reports: list[fuzz.FuzzReport] = []
    with Live(_fuzz_table(seed, rows), console=errors, refresh_per_second=4, transient=True) as live:
        last = [0.0]

        def progress(state: fuzz.FuzzProgress) -> None:
            rows[state.kernel] = state
            now = time.monotonic()
            if now - last[0] >= 0.1:
                last[0] = now
                live.update(_fuzz_table(seed, rows))

        for spec in specs:
            run_case, healthy = device_hooks(graph, knobs[spec.name])
            report = fuzz.run_fuzz(spec, seconds, seed, cases, progress, run_case=run_case, healthy=healthy,
                                   start=start, regressions=fuzz.regressions_path(spec.name, golden_dir) if save else None,
                                   shrink_runs=shrink_runs, max_failures=max_failures)
            reports.append(report)
            rows[spec.name] = fuzz.FuzzProgress(spec.name, f"done ({report.stopped_by})", report.cases_run,
                                                len(report.failures), len(report.generator_bugs), report.elapsed_s,
                                                sum(f.shrink_runs for f in report.failures))
            live.update(_fuzz_table(seed, rows))
            if report.context_lost:
                break
    console.print(_fuzz_table(seed, rows))
    for report in reports:
        _print_fuzz_report(report)
    skipped = [spec.name for spec in specs[len(reports):]]
    if skipped:
        console.print(f"[red]not fuzzed[/] after the lost CUDA context: {', '.join(skipped)}")
    failed = sum(len(r.failures) for r in reports)
    bugs = sum(len(r.generator_bugs) for r in reports)
    total = sum(r.cases_run for r in reports)
    console.print(f"{total} cases, {failed} failed, {bugs} generator bugs (seed {seed})")
    raise typer.Exit(EXIT_OK if all(r.ok for r in reports) and not skipped else EXIT_CHECK_FAILED)
