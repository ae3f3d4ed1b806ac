"""`kdt build`: cubins per kernel source and arch (cached), with the resources ptxas gives each function."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from kdt import build, limits, stages
from kdt.commands.common import ArchOption, parse_arches
from kdt.console import EXIT_ENVIRONMENT, KdtExit, console
from refs.errors import BadInput

KernelSourcesArg = typer.Argument(None, help="kernel sources under kernels/ (the stages and the pipeline's "
                                             "synthetic-target; default: all)")


def command(kernels: Optional[list[str]] = KernelSourcesArg, arch: Optional[list[str]] = ArchOption,
            force: bool = typer.Option(False, "--force", help="ignore the cache")):
    """Compile kernels to cubins with nvcc (cached; warnings are errors) and show their resources."""
    names = sorted(set(stages.names()) | set(build.kernel_names()))   # a stage's missing source: exit 2, named
    chosen = names if not kernels or kernels == ["all"] else kernels
    for name in chosen:
        if name not in names:
            raise BadInput("KERNEL", f"one of {', '.join(names)} (or 'all')", name)
    results = [build.build(name, target, force=force) for name in chosen for target in parse_arches(arch)]
    console.print(resource_table(results))
    violations = [v for result in results for v in limits.check(result, _plans(result))]
    if violations:
        console.print(violation_table(violations))
        raise KdtExit(EXIT_ENVIRONMENT, f"[red]{len(violations)} limit(s) exceeded[/]: these cubins would fail on "
                                        "their GPU (the table above)")
    console.print(f"every function within its arch's limits ({', '.join(dict.fromkeys(r.arch for r in results))})")


def _plans(result: build.BuildResult):
    try:
        spec = stages.get(result.kernel)
    except stages.UnknownStage:       # not a stage (the pipeline's synthetic target): ptxas's figures only
        return []
    return limits.bench_plans(spec, result)


def violation_table(violations: list[limits.Violation]) -> Table:
    table = Table(title="kdt build: limits exceeded")
    for column in ("kernel", "arch", "function", "limit", "allowed", "asked", "where"):
        table.add_column(column, justify="right" if column in ("allowed", "asked") else "left")
    for v in violations:
        table.add_row(v.kernel, v.arch, v.function, v.limit, f"{v.allowed:,}", f"{v.asked:,}", v.where)
    return table


def resource_table(results: list[build.BuildResult]) -> Table:
    table = Table(title="kdt build: resources per kernel function (ptxas)")
    for column in ("kernel", "arch", "function", "registers", "smem B", "stack B", "spill st/ld B", "cache"):
        table.add_column(column, justify="right" if column.endswith(("B", "registers")) else "left")
    for result in results:
        for r in result.resources or [None]:
            if r is None:
                table.add_row(result.kernel, result.arch, "-", "", "", "", "", "hit" if result.cached else "built")
                continue
            spill = f"{r.spill_store_bytes}/{r.spill_load_bytes}"
            table.add_row(result.kernel, result.arch, r.function, str(r.registers), str(r.shared_bytes),
                          str(r.stack_bytes), f"[red]{spill}[/]" if r.spill_store_bytes else spill,
                          "hit" if result.cached else "built")
    return table
