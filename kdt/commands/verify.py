"""`kdt verify`: every golden case through `kdt.ops` on the GPU, outputs poisoned, compared as the contract says."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from kdt import build, golden, runtime, stages
from kdt.commands.common import KnobOption, RunArchOption, SmsOption, StagesArg, knobs_for, select_run
from kdt.console import EXIT_CHECK_FAILED, EXIT_OK, console
from refs.errors import BadInput


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
            knob: Optional[list[str]] = KnobOption):
    """Run kernels on the GPU against the golden files, outputs poisoned; bit-exact diffs of any mismatch."""
    from kdt import fuzz, report, verify

    specs = stages.select(kernels)
    if golden_file is not None and len(specs) != 1:
        raise BadInput("--golden", "a single kernel to go with it", [s.name for s in specs])
    knobs = knobs_for(specs, knob)
    select_run(arch, sms)
    runtime.cupy()  # no GPU: exit 2 before building anything
    target = runtime.device_arch()
    for spec in specs:
        build.build(spec, target)
    results = []
    for spec in specs:
        paths = [golden_file or golden.default_path("golden", spec.name)]
        if regressions and golden_file is None and fuzz.regressions_path(spec.name).exists():
            paths.append(fuzz.regressions_path(spec.name))
        for path in paths:
            table = Table(title=f"kdt verify {spec.name} ({path}) on {target}, plans for "
                                f"{runtime.multiprocessors()} SMs")
            for column in ("case", "result", "time us", "outputs"):
                table.add_column(column)
            cases = verify.verify_file(spec, path, case, max_diffs, graph, knobs=knobs[spec.name])
            if not cases and path == paths[0]:
                raise BadInput("--case", f"a pattern matching a case in {path}", case)
            for r in cases:
                detail = r.error or ", ".join(f"{f.name} {f.mismatches}/{f.checked}" if not f.ok else f.name
                                              for f in r.fields)
                table.add_row(r.case, "[green]pass[/]" if r.passed else "[red]FAIL[/]",
                              "" if r.time_us is None else f"{r.time_us:.1f}", escape(detail))
            console.print(table)
            for r in cases:
                if not r.passed:
                    _print_failures(r)
            results.extend(cases)
    failed = [r for r in results if not r.passed]
    console.print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    if json_file:
        report.write_atomically(json_file, report.verify_json(results))
    if junit_file:
        report.write_atomically(junit_file, report.verify_junit(results))
    raise typer.Exit(EXIT_CHECK_FAILED if failed else EXIT_OK)


def _print_failures(result) -> None:
    if result.error:
        console.print(f"  [red]{escape(result.error)}[/]")
        return
    for field_result in result.fields:
        if field_result.ok or not field_result.diffs:
            continue
        table = Table(title=f"{result.kernel} / {result.case}: {field_result.name} "
                            f"({field_result.mismatches} of {field_result.checked} mismatch) {field_result.worst}")
        for column in ("index", "expected", "got", "expected bits", "got bits", "ulp / note"):
            table.add_column(column)
        for d in field_result.diffs:
            table.add_row(str(tuple(d.index)), repr(d.expected), repr(d.got), d.expected_bits, d.got_bits,
                          d.note or ("" if d.ulp is None else str(d.ulp)))
        console.print(table)
