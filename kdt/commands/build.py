"""`kdt build`: cubins per kernel source and arch (cached), with the resources ptxas gives each function."""

from __future__ import annotations

from dataclasses import asdict
from typing import Optional

import typer

from kdt.commands.common import ArchOption, FormatOption, parse_arches
from kdt.console import EXIT_ENVIRONMENT, KdtExit, OutputFormat, Report, Sheet, styled
from kdt.refs.errors import BadInput

KernelSourcesArg = typer.Argument(None, help="kernel sources under kernels/ (the stages and the pipeline's "
                                             "synthetic-target; default: all)")


def command(kernels: Optional[list[str]] = KernelSourcesArg, arch: Optional[list[str]] = ArchOption,
            force: bool = typer.Option(False, "--force", help="ignore the cache"),
            output: OutputFormat = FormatOption):
    """Compile kernels to cubins with nvcc (cached; warnings are errors) and show their resources."""
    from kdt import build, limits, stages

    names = sorted(set(stages.names()) | set(build.kernel_names()))   # a stage's missing source: exit 2, named
    chosen = names if not kernels or kernels == ["all"] else kernels
    for name in chosen:
        if name not in names:
            raise BadInput("KERNEL", f"one of {', '.join(names)} (or 'all')", name)
    results = [build.build(name, target, force=force) for name in chosen for target in parse_arches(arch)]
    out = Report("build", output)
    out.table(resource_table(results))
    violations = [v for result in results for v in limits.check(result, _plans(result))]
    out.document({"ok": not violations, "results": [asdict(r) for r in results],
                  "violations": [asdict(v) for v in violations]})
    if violations:
        out.table(violation_table(violations))
        message = (f"[red]{len(violations)} limit(s) exceeded[/]: these cubins would fail on their GPU "
                   "(the table above)")
        out.step_summary(message)
        raise KdtExit(EXIT_ENVIRONMENT, message)
    out.say(f"every function within its arch's limits ({', '.join(dict.fromkeys(r.arch for r in results))})")
    out.step_summary()


def _plans(result: build.BuildResult):
    from kdt import limits, stages

    try:
        spec = stages.get(result.kernel)
    except stages.UnknownStage:       # not a stage (the pipeline's synthetic target): ptxas's figures only
        return []
    return limits.bench_plans(spec, result)


def violation_table(violations: list[limits.Violation]) -> Sheet:
    sheet = Sheet("kdt build: limits exceeded", ("kernel", "arch", "function", "limit", "allowed", "asked", "where"),
                  right=("allowed", "asked"))
    for v in violations:
        sheet.add_row(v.kernel, v.arch, v.function, v.limit, f"{v.allowed:,}", f"{v.asked:,}", v.where)
    return sheet


def resource_table(results: list[build.BuildResult]) -> Sheet:
    columns = ("kernel", "arch", "function", "registers", "smem B", "stack B", "spill st/ld B", "cache")
    sheet = Sheet("kdt build: resources per kernel function (ptxas)", columns,
                  right=[c for c in columns if c.endswith(("B", "registers"))])
    for result in results:
        cache = "hit" if result.cached else "built"
        if not result.resources:
            sheet.add_row(result.kernel, result.arch, "-", "", "", "", "", cache)
        for r in result.resources:
            spill = f"{r.spill_store_bytes}/{r.spill_load_bytes}"
            sheet.add_row(result.kernel, result.arch, r.function, str(r.registers), str(r.shared_bytes),
                          str(r.stack_bytes), styled(spill, "red") if r.spill_store_bytes else spill, cache)
    return sheet
