"""`kdt gen-golden`: the golden files from the references (deterministic, atomic), their drift check, and expected
outputs for inputs captured from an engine."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from kdt import golden, stages
from kdt.commands.common import KernelsArg, progress
from kdt.console import EXIT_CHECK_FAILED, EXIT_OK, console
from refs.errors import BadInput


def command(kernels: Optional[list[str]] = KernelsArg,
            golden_dir: Path = typer.Option(Path("golden"), "--golden-dir", help="where <kernel>.h5 live"),
            check: bool = typer.Option(False, "--check", help="regenerate in memory and report drift (exit 1)"),
            inputs: Optional[Path] = typer.Option(None, "--inputs", help="an inputs-only file captured from an engine"),
            out: Optional[Path] = typer.Option(None, "--out", help="with --inputs: the golden file to write")):
    """Generate the golden HDF5 files from the references (deterministic, atomic)."""
    if inputs is not None or out is not None:
        raise typer.Exit(_from_inputs(kernels, inputs, out))
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
        for spec in specs:
            path = golden.default_path(golden_dir, spec.name)
            console.print(f"wrote {path} ({len(fresh[spec.name])} cases, {path.stat().st_size / 1e6:.1f} MB)")
        raise typer.Exit(EXIT_OK)
    drifts = [d for spec in specs for d in golden.drift(spec, golden.default_path(golden_dir, spec.name), fresh[spec.name])]
    if not drifts:
        console.print(f"[green]no drift[/]: {', '.join(s.name for s in specs)} match the references bit for bit")
        raise typer.Exit(EXIT_OK)
    table = Table(title="golden drift")
    for column in ("kernel", "case", "item", "detail"):
        table.add_column(column, overflow="fold")
    for d in drifts:
        table.add_row(*(escape(text) for text in (d.kernel, d.case, d.item, d.detail)))
    console.print(table)
    raise typer.Exit(EXIT_CHECK_FAILED)


def _from_inputs(kernels: Optional[list[str]], inputs: Optional[Path], out: Optional[Path]) -> int:
    if inputs is None or out is None:
        raise BadInput("--inputs/--out", "both, together", f"--inputs={inputs} --out={out}")
    captured = golden.read(inputs, expect_outputs=False)
    if kernels and kernels != [captured.kernel]:
        raise BadInput("KERNEL", f"the file's own kernel {captured.kernel!r} (or none)", kernels)
    spec = stages.get(captured.kernel)
    from kdt.dtypes import name as dtype_name

    for item in captured.cases:  # a missing input or parameter, a wrong dtype or rank: named, before the reference
        case = item.case
        try:
            spec.check_layout({key: tuple(a.shape) for key, a in case.inputs.items()},
                              {key: dtype_name(a.dtype) for key, a in case.inputs.items()}, dict(case.params))
        except BadInput as error:
            raise BadInput(f"{inputs} case {case.name!r}: {error.argument}", error.expected, error.actual) from None
    with progress() as bar:
        task = bar.add_task(f"{spec.name}: reference", total=len(captured.cases))
        computed = golden.expected_for(spec, [item.case for item in captured.cases], lambda: bar.advance(task))
    golden.write(out, spec, computed)
    console.print(f"wrote {out} ({len(computed)} cases from {inputs})")
    return EXIT_OK
