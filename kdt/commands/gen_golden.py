"""`kdt gen-golden`: the golden files from the references (deterministic, atomic), their drift check, and expected
outputs for inputs captured from an engine."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from kdt.commands.common import FormatOption, KernelsArg, progress
from kdt.console import EXIT_CHECK_FAILED, EXIT_OK, OutputFormat, Report, Sheet
from kdt.refs.errors import BadInput


def command(kernels: Optional[list[str]] = KernelsArg,
            golden_dir: Optional[Path] = typer.Option(None, "--golden-dir",
                                                      help="where <kernel>.h5 live (default: the package's golden "
                                                           "files, golden/ in a checkout)"),
            check: bool = typer.Option(False, "--check", help="regenerate in memory and report drift (exit 1)"),
            inputs: Optional[Path] = typer.Option(None, "--inputs", help="an inputs-only file captured from an engine"),
            out: Optional[Path] = typer.Option(None, "--out", help="with --inputs: the golden file to write"),
            output: OutputFormat = FormatOption):
    """Generate the golden HDF5 files from the references (deterministic, atomic)."""
    from kdt import golden, stages

    report = Report("gen-golden", output)
    if inputs is not None or out is not None:
        raise typer.Exit(_from_inputs(kernels, inputs, out, report))
    specs = stages.select(kernels)
    fresh = {}
    with progress() as bar:
        for spec in specs:
            task = bar.add_task(f"{spec.name}: cases", total=None)
            cases = spec.make_cases()
            bar.update(task, total=len(cases), description=f"{spec.name}: reference")
            fresh[spec.name] = golden.expected_for(spec, cases, lambda: bar.advance(task))
            if not check:
                golden.write(golden.default_path(golden_dir, spec.name), spec, fresh[spec.name])
    if not check:
        _written(report, [(spec.name, golden.default_path(golden_dir, spec.name), len(fresh[spec.name]))
                          for spec in specs])
        raise typer.Exit(EXIT_OK)
    drifts = [d for spec in specs for d in golden.drift(spec, golden.default_path(golden_dir, spec.name), fresh[spec.name])]
    report.document({"ok": not drifts, "kernels": [spec.name for spec in specs],
                     "drifts": [asdict(d) for d in drifts]})
    if not drifts:
        report.say(f"[green]no drift[/]: {escape(', '.join(s.name for s in specs))} match the references bit for bit")
    else:
        sheet = Sheet("golden drift", ("kernel", "case", "item", "detail"))
        for d in drifts:
            sheet.add_row(d.kernel, d.case, d.item, d.detail)
        report.table(sheet)
        report.say(f"[red]{len(drifts)} drifting item(s)[/]: regenerate with kdt gen-golden, or find what changed")
    report.step_summary()
    raise typer.Exit(EXIT_CHECK_FAILED if drifts else EXIT_OK)


def _written(report: Report, files: list[tuple[str, Path, int]], source: Optional[Path] = None) -> None:
    """The write summary: one row a file written (the kernel, where, how many cases, its size)."""
    sheet = Sheet("kdt gen-golden: written", ("kernel", "file", "cases", "MB") + (("from",) if source else ()),
                  right=("cases", "MB"))
    rows = []
    for kernel, path, cases in files:
        size = path.stat().st_size
        sheet.add_row(kernel, str(path), str(cases), f"{size / 1e6:.1f}", *((str(source),) if source else ()))
        rows.append({"kernel": kernel, "path": str(path), "cases": cases, "bytes": size,
                     **({"inputs": str(source)} if source else {})})
    report.table(sheet)
    report.document({"ok": True, "written": rows})


def _from_inputs(kernels: Optional[list[str]], inputs: Optional[Path], out: Optional[Path], report: Report) -> int:
    from kdt import golden, stages

    if inputs is None or out is None:
        raise BadInput("--inputs/--out", "both, together", f"--inputs={inputs} --out={out}")
    if out.resolve() == inputs.resolve() or (out.exists() and inputs.exists() and out.samefile(inputs)):
        raise BadInput("--out", "a file other than --inputs (the captured inputs are never overwritten)", str(out))
    captured = golden.read(inputs, expect_outputs=False)
    if kernels and kernels != [captured.kernel]:
        raise BadInput("KERNEL", f"the file's own kernel {captured.kernel!r} (or none)", kernels)
    spec = stages.get(captured.kernel)
    from dataclasses import replace

    from kdt.dtypes import name as dtype_name
    from kdt.interop import kdt_tree_inputs

    cases = []
    for item in captured.cases:  # a missing input or parameter, a wrong dtype or rank: named, before the reference
        try:
            case = replace(item.case, inputs=kdt_tree_inputs(item.case.inputs))  # trees captured from SGLang
            spec.check_layout({key: tuple(a.shape) for key, a in case.inputs.items()},
                              {key: dtype_name(a.dtype) for key, a in case.inputs.items()}, dict(case.params))
        except BadInput as error:
            raise BadInput(f"{inputs} case {item.case.name!r}: {error.argument}", error.expected,
                           error.actual) from None
        cases.append(case)
    with progress() as bar:
        task = bar.add_task(f"{spec.name}: reference", total=len(cases))
        computed = golden.expected_for(spec, cases, lambda: bar.advance(task), source=inputs)
    golden.write(out, spec, computed)
    _written(report, [(spec.name, out, len(computed))], source=inputs)
    return EXIT_OK
