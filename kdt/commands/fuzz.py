"""`kdt fuzz`: random cases of random shape on the GPU against the reference; failures shrunk and kept as
regression cases (golden/regressions/<kernel>.h5)."""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer
from rich.live import Live
from rich.markup import escape

from kdt.commands import common
from kdt.commands.common import FormatOption, KnobOption, RunArchOption, SmsOption, StagesArg
from kdt.console import EXIT_CHECK_FAILED, EXIT_OK, OutputFormat, Report, Sheet, errors, styled
from kdt.refs.errors import BadInput


def device_hooks(graph: bool, knobs: dict):
    """(run_case, healthy) for the GPU; tests replace this with a fake kernel."""
    from kdt import fuzz

    return fuzz.device_runner(graph, knobs), fuzz.device_healthy


def _fuzz_table(seed: int, rows: dict[str, fuzz.FuzzProgress]) -> Sheet:
    columns = ("kernel", "now", "cases", "failures", "generator bugs", "cases/s", "seconds", "shrink runs")
    table = Sheet(f"kdt fuzz (seed {seed})", columns, right=columns[2:])
    for row in rows.values():
        table.add_row(row.kernel, row.phase, str(row.cases_run),
                      styled(str(row.failures), "red") if row.failures else "0",
                      styled(str(row.generator_bugs), "red") if row.generator_bugs else "0",
                      f"{row.cases_per_s:.1f}", f"{row.elapsed_s:.1f}", str(row.shrink_runs))
    return table


def _report_fuzz(out: Report, report: fuzz.FuzzReport) -> None:
    from kdt import fuzz

    for failure in report.failures:
        out.say(f"[red]FAIL[/] {report.kernel} case {failure.index} (seed {failure.seed}): {escape(failure.detail)}")
        shrunk = (f"shrunk in {failure.shrink_steps} step(s) ({failure.shrink_runs} runs) from "
                  f"{escape(fuzz.summarize(failure.original))}" if failure.shrink_steps else "not shrunk")
        out.say(f"  smallest failing case: {escape(fuzz.summarize(failure.shrunk))}; {shrunk}")
        if failure.duplicate_of is not None:
            out.say(f"  the same failure and smallest shape as case {failure.duplicate_of}: not saved again")
        elif failure.saved_to is not None:
            out.say(escape(f"  saved as {failure.saved_as} in {failure.saved_to}: "
                           f"kdt verify {report.kernel} --golden {failure.saved_to} --case {failure.saved_as}"))
        elif failure.save_error:
            out.say(f"  [red]{escape(failure.save_error)}[/]")
        out.say(f"  replay: kdt fuzz {report.kernel} {failure.replay}")
    for bug in report.generator_bugs[:5]:
        out.say(f"[red]generator bug[/] {report.kernel} case {bug.index} ({escape(bug.where)}): {escape(bug.message)}"
                + (f" {escape('[' + bug.case + ']')}" if bug.case else ""))
    if len(report.generator_bugs) > 5:
        out.say(f"  ... and {len(report.generator_bugs) - 5} more generator bugs")
    if report.context_lost:
        out.say(f"[red]CUDA context lost[/] in {report.kernel}: {escape(report.context_lost)}")


def _fuzz_json(report: fuzz.FuzzReport) -> dict:
    """A FuzzReport as plain data: the cases by their shapes and parameters (fuzz.summarize), not their arrays."""
    from kdt import fuzz

    return {"kernel": report.kernel, "seed": report.seed, "start": report.start, "cases_run": report.cases_run,
            "elapsed_s": report.elapsed_s, "stopped_by": report.stopped_by, "context_lost": report.context_lost,
            "ok": report.ok, "redrawn": report.redrawn,
            "failures": [{"index": f.index, "seed": f.seed, "detail": f.detail, "original": fuzz.summarize(f.original),
                          "shrunk": fuzz.summarize(f.shrunk), "shrink_steps": f.shrink_steps,
                          "shrink_runs": f.shrink_runs, "saved_as": f.saved_as,
                          "saved_to": None if f.saved_to is None else str(f.saved_to), "save_error": f.save_error,
                          "duplicate_of": f.duplicate_of, "replay": f"kdt fuzz {report.kernel} {f.replay}"}
                         for f in report.failures],
            "generator_bugs": [asdict(bug) for bug in report.generator_bugs]}


def command(kernels: list[str] = StagesArg,
                 seconds: Optional[float] = typer.Option(None, "--seconds", min=0,
                                                         help="fuzz each kernel this long (default 60, none with --cases)"),
                 seed: Optional[int] = typer.Option(None, "--seed", min=0,
                                                    help="case i is drawn from default_rng([seed, i]) (default: new, printed)"),
                 cases: Optional[int] = typer.Option(None, "--cases", min=1, help="at most this many cases per kernel"),
                 start: int = typer.Option(0, "--start", min=0,
                                           help="index of the first case (replay one: --seed S --start I --cases 1)"),
                 golden_dir: Optional[Path] = typer.Option(None, "--golden-dir",
                                                           help="failures are saved to GOLDEN_DIR/regressions/"
                                                                "<kernel>.h5 (default: the package's golden files, "
                                                                "golden/ in a checkout)"),
                 save: bool = typer.Option(True, "--save/--no-save", help="save shrunk failures as regression cases"),
                 graph: bool = typer.Option(False, "--graph", help="launch every case inside a CUDA graph"),
                 max_failures: Optional[int] = typer.Option(None, "--max-failures", min=1,
                                                            help="stop fuzzing a kernel after this many failures "
                                                                 "(default: kdt.fuzz.DEFAULT_MAX_FAILURES, 3)"),
                 shrink_runs: Optional[int] = typer.Option(None, "--shrink-runs", min=0,
                                                           help="at most this many runs to shrink one failure "
                                                                "(default: kdt.fuzz.DEFAULT_SHRINK_RUNS, 200)"),
                 knob: Optional[list[str]] = KnobOption, arch: Optional[str] = RunArchOption,
                 sms: Optional[int] = SmsOption, output: OutputFormat = FormatOption):
    """Random cases of random shape on the GPU against the reference; failures shrunk and saved as regressions."""
    from kdt import fuzz, stages

    specs = stages.select(kernels)
    max_failures = fuzz.DEFAULT_MAX_FAILURES if max_failures is None else max_failures
    shrink_runs = fuzz.DEFAULT_SHRINK_RUNS if shrink_runs is None else shrink_runs
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
    out = Report("fuzz", output)
    out.table(_fuzz_table(seed, rows))
    for report in reports:
        _report_fuzz(out, report)
    skipped = [spec.name for spec in specs[len(reports):]]
    if skipped:
        out.say(f"[red]not fuzzed[/] after the lost CUDA context: {', '.join(skipped)}")
    failed = sum(len(r.failures) for r in reports)
    bugs = sum(len(r.generator_bugs) for r in reports)
    total = sum(r.cases_run for r in reports)
    ok = all(r.ok for r in reports) and not skipped
    redrawn = sum(r.redrawn for r in reports)
    out.say(f"{total} cases, {failed} failed, {bugs} generator bugs (seed {seed})"
            + (f"; {redrawn} generated draws redrawn off a knife's edge" if redrawn else ""))
    out.document({"ok": ok, "seed": seed, "cases": total, "failed": failed, "generator_bugs": bugs, "redrawn": redrawn,
                  "not_fuzzed": skipped, "kernels": [_fuzz_json(report) for report in reports]})
    raise typer.Exit(EXIT_OK if ok else EXIT_CHECK_FAILED)
