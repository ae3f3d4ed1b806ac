"""`kdt env-check`: packages, nvcc (with a probe compile), CuPy and the GPUs, one row a check."""

from __future__ import annotations

import typer

from kdt import arches
from kdt.commands.common import FormatOption
from kdt.console import EXIT_CHECK_FAILED, EXIT_OK, OutputFormat, Report, Sheet, styled
from kdt.refs.errors import BadInput


def command(arch: str = typer.Option(None, help="target arch to check for (default: the GPU's own, sm_90a on an "
                                                 "H200; without a GPU sm_120)"),
            as_json: bool = typer.Option(False, "--json", help="print machine-readable JSON (= --format json)"),
            require_gpu: bool = typer.Option(False, "--require-gpu", help="fail unless a GPU of --arch is present"),
            output: OutputFormat = FormatOption):
    """Check Python packages, nvcc (with a real probe compile), CuPy and the GPUs."""
    from kdt import envcheck

    if arch is not None and arch not in arches.ARCHES:
        raise BadInput("--arch", "one of " + ", ".join(arches.names()), arch)
    arch = arch or envcheck.default_arch()
    if as_json and output is OutputFormat.markdown:
        raise BadInput("--json", "no --format, or --format json (--json is its alias)", "--format markdown")
    checks = envcheck.run_checks(arch, require_gpu)
    out = Report("env-check", OutputFormat.json if as_json else output)
    sheet = Sheet(f"kdt env-check (target {arch})", ("check", "status", "finding", "fix"))
    for check in checks:
        status = styled("ok", "green") if check.ok else (styled("FAIL", "red") if check.required
                                                         else styled("missing", "yellow"))
        sheet.add_row(check.name, status, check.finding, check.fix)
    out.table(sheet)
    out.document(envcheck.as_json(checks))
    raise typer.Exit(EXIT_OK if envcheck.passed(checks) else EXIT_CHECK_FAILED)
