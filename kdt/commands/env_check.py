"""`kdt env-check`: packages, nvcc (with a probe compile), CuPy and the GPUs, one row a check."""

from __future__ import annotations

import json

import typer
from rich.markup import escape
from rich.table import Table

from kdt import arches, envcheck
from kdt.console import EXIT_CHECK_FAILED, EXIT_OK, console
from refs.errors import BadInput


def command(arch: str = typer.Option(arches.DEFAULT, help="target arch to check for"),
            as_json: bool = typer.Option(False, "--json", help="print machine-readable JSON"),
            require_gpu: bool = typer.Option(False, "--require-gpu", help="fail unless a GPU of --arch is present")):
    """Check Python packages, nvcc (with a real probe compile), CuPy and the GPUs."""
    if arch not in arches.ARCHES:
        raise BadInput("--arch", "one of " + ", ".join(arches.names()), arch)
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
