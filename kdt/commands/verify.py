"""`kdt verify`: every golden case through `kdt.ops` on the GPU, outputs poisoned, compared as the contract says."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from kdt import toolkit
from kdt.commands.common import FormatOption, KnobOption, RunArchOption, SmsOption, StagesArg, knobs_for, select_run
from kdt.console import EXIT_CHECK_FAILED, EXIT_OK, OutputFormat, Report, Sheet, styled
from kdt.refs.errors import BadInput


def command(kernels: list[str] = StagesArg,
            golden_file: Optional[Path] = typer.Option(None, "--golden", help="default golden/<kernel>.h5"),
            case: Optional[str] = typer.Option(None, "--case", help="only cases matching this glob"),
            arch: Optional[str] = RunArchOption,
            sms: Optional[int] = SmsOption,
            max_diffs: int = typer.Option(10, "--max-diffs", min=0, help="mismatches shown per output"),
            json_file: Optional[Path] = typer.Option(None, "--json", help="write the results as JSON"),
            junit_file: Optional[Path] = typer.Option(None, "--junit", help="write JUnit XML"),
            graph: bool = typer.Option(False, "--graph", help="capture each launch in a CUDA graph, replay it"),
            regressions: bool = typer.Option(False, "--regressions",
                                             help="also run golden/regressions/<kernel>.h5 (found by kdt fuzz)"),
            knob: Optional[list[str]] = KnobOption,
            output: OutputFormat = FormatOption):
    """Run kernels on the GPU against the golden files, outputs poisoned; bit-exact diffs of any mismatch."""
    from kdt import build, fuzz, golden, report, runtime, stages, verify

    specs = stages.select(kernels)
    if golden_file is not None and len(specs) != 1:
        raise BadInput("--golden", "a single kernel to go with it", [s.name for s in specs])
    knobs = knobs_for(specs, knob)
    select_run(arch, sms)
    todo = []   # (spec, file, its cases): every golden file read and checked first, with or without a GPU
    for spec in specs:
        files = [golden_file or golden.default_path(None, spec.name)]
        if regressions and golden_file is None and fuzz.regressions_path(spec.name).exists():
            files.append(fuzz.regressions_path(spec.name))
        for path in files:
            todo.append((spec, path, verify.select_cases(spec, path, case)))
            if not todo[-1][2] and path == files[0]:
                raise BadInput("--case", f"a pattern matching a case in {path}", case)
    try:
        runtime.cupy()  # no GPU: exit 2 before building anything, the reports written first
        target = runtime.device_arch()
        for spec in specs:
            build.build(spec, target)
    except (runtime.GpuMissing, toolkit.ToolkitMissing, build.BuildError) as error:
        _write_reports(json_file, junit_file, [verify.environment_failure(spec.name, error) for spec in specs])
        raise
    out = Report("verify", output)
    results = []
    for spec, path, selected in todo:
        table = Sheet(f"kdt verify {spec.name} ({path}) on {target}, plans for {runtime.multiprocessors()} SMs",
                      ("case", "result", "time us", "outputs"))
        cases = verify.verify_cases(spec, selected, max_diffs, graph, knobs=knobs[spec.name])
        for r in cases:
            detail = r.error or ", ".join(f"{f.name} {f.mismatches}/{f.checked}" if not f.ok else f.name
                                          for f in r.fields)
            table.add_row(r.case, styled("pass", "green") if r.passed else styled("FAIL", "red"),
                          "" if r.time_us is None else f"{r.time_us:.1f}", detail)
        out.table(table)
        for r in cases:
            if not r.passed:
                _report_failures(out, r)
        results.extend(cases)
    failed = [r for r in results if not r.passed]
    out.say(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    if failed:
        out.say(f"[red]failing cases[/]: {escape(', '.join(f'{r.kernel} / {r.case}' for r in failed))}")
    out.document(report.verify_document(results))
    _write_reports(json_file, junit_file, results)
    out.step_summary()
    raise typer.Exit(EXIT_CHECK_FAILED if failed else EXIT_OK)


def _write_reports(json_file: Optional[Path], junit_file: Optional[Path], results) -> None:
    from kdt import report

    if json_file:
        report.write_atomically(json_file, report.verify_json(results))
    if junit_file:
        report.write_atomically(junit_file, report.verify_junit(results))


def _report_failures(out: Report, result) -> None:
    if result.error:
        out.say(f"  [red]{escape(result.kernel)} / {escape(result.case)}: {escape(result.error)}[/]")
        return
    for field_result in result.fields:
        if field_result.ok or not field_result.diffs:
            continue
        table = Sheet(f"{result.kernel} / {result.case}: {field_result.name} "
                      f"({field_result.mismatches} of {field_result.checked} mismatch) {field_result.worst}",
                      ("index", "expected", "got", "expected bits", "got bits", "ulp / note"))
        for d in field_result.diffs:
            table.add_row(str(tuple(d.index)), repr(d.expected), repr(d.got), d.expected_bits, d.got_bits,
                          d.note or ("" if d.ulp is None else str(d.ulp)))
        out.table(table)
