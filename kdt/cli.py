"""The `kdt` command line (Typer). Each command lives in its own module; this file only wires them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.markup import escape
from rich.table import Table

from kdt import envcheck, golden, stages, toolkit
from kdt.console import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK, KdtExit, console, errors
from refs.errors import BadInput

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="kdt: write, prove and tune CUDA kernels for DDTree speculative decoding.")

KernelsArg = typer.Argument(None, help="kernels: " + ", ".join(stages.names()) + " (default: all)")


@app.command("env-check")
def env_check(arch: str = typer.Option(toolkit.DEFAULT_ARCH, help="target arch to check for"),
              as_json: bool = typer.Option(False, "--json", help="print machine-readable JSON"),
              require_gpu: bool = typer.Option(False, "--require-gpu", help="fail unless a GPU of --arch is present")):
    """Check Python packages, nvcc (with a real probe compile), CuPy and the GPUs."""
    if arch not in toolkit.SUPPORTED_ARCHES:
        raise BadInput("--arch", "one of " + ", ".join(toolkit.SUPPORTED_ARCHES), arch)
    checks = envcheck.run_checks(arch, require_gpu)
    if as_json:
        print(json.dumps(envcheck.as_json(checks), indent=2))
    else:
        table = Table(title=f"kdt env-check (target {arch})")
        for column in ("check", "status", "finding", "fix"):
            table.add_column(column, overflow="fold")
        for check in checks:
            status = "[green]ok[/]" if check.ok else ("[red]FAIL[/]" if check.required else "[yellow]missing[/]")
            table.add_row(escape(check.name), status, escape(check.finding), escape(check.fix))
        console.print(table)
    raise typer.Exit(EXIT_OK if envcheck.passed(checks) else EXIT_CHECK_FAILED)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=errors, transient=False)


@app.command("gen-golden")
def gen_golden(kernels: Optional[list[str]] = KernelsArg,
               golden_dir: Path = typer.Option(Path("golden"), "--golden-dir", help="where <kernel>.h5 live"),
               check: bool = typer.Option(False, "--check", help="regenerate in memory and report drift (exit 1)"),
               inputs: Optional[Path] = typer.Option(None, "--inputs", help="an inputs-only file captured from an engine"),
               out: Optional[Path] = typer.Option(None, "--out", help="with --inputs: the golden file to write")):
    """Generate the golden HDF5 files from the references (deterministic, atomic)."""
    if inputs is not None or out is not None:
        raise typer.Exit(_golden_from_inputs(kernels, inputs, out))
    specs = stages.select(kernels)
    fresh = {}
    with _progress() as progress:
        for spec in specs:
            task = progress.add_task(f"{spec.name}: cases", total=None)
            cases = spec.make_cases()
            progress.update(task, total=len(cases), description=f"{spec.name}: reference")
            fresh[spec.name] = golden.expected_for(spec, cases, lambda: progress.advance(task))
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


def _golden_from_inputs(kernels: Optional[list[str]], inputs: Optional[Path], out: Optional[Path]) -> int:
    if inputs is None or out is None:
        raise BadInput("--inputs/--out", "both, together", f"--inputs={inputs} --out={out}")
    captured = golden.read(inputs, expect_outputs=False)
    if kernels and kernels != [captured.kernel]:
        raise BadInput("KERNEL", f"the file's own kernel {captured.kernel!r} (or none)", kernels)
    spec = stages.get(captured.kernel)
    with _progress() as progress:
        task = progress.add_task(f"{spec.name}: reference", total=len(captured.cases))
        computed = golden.expected_for(spec, [item.case for item in captured.cases], lambda: progress.advance(task))
    golden.write(out, spec, computed)
    console.print(f"wrote {out} ({len(computed)} cases from {inputs})")
    return EXIT_OK


def _is_usage_error(error: Exception) -> bool:
    """Click's usage errors, whether from click itself or the copy newer Typer releases vendor."""
    return hasattr(error, "show") and hasattr(error, "exit_code") and hasattr(error, "format_message")


def main() -> None:
    """Entry point: user mistakes end with a clear message and their exit code, never a traceback."""
    try:
        code = app(standalone_mode=False)
    except typer.Exit as done:
        code = done.exit_code
    except typer.Abort:
        errors.print("aborted")
        code = EXIT_BAD_INPUT
    except (BadInput, stages.UnknownStage) as error:
        errors.print(f"[red]error:[/] {escape(str(error))}")
        code = EXIT_BAD_INPUT
    except golden.GoldenError as error:
        errors.print(f"[red]golden file error:[/] {escape(str(error))}")
        code = EXIT_CHECK_FAILED
    except KdtExit as error:
        errors.print(error.message)
        code = error.code
    except Exception as error:
        if not _is_usage_error(error):
            raise
        error.show()
        code = EXIT_BAD_INPUT
    sys.exit(code or 0)
