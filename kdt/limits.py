"""Every function of a cubin held to its arch's limits (kdt/arches.py), at build time: registers and static shared
memory from ptxas, and, through the stage's launch plans for its bench shapes (of every set), the dynamic + static
shared memory per block, the cluster size and the threads per block each launch asks for, the shared memory,
threads and registers of the blocks a launch needs resident on one multiprocessor together, and whether each
launch's arguments are the sizes of its entry point's parameters. `kdt build` fails (exit 2) with the table of what
exceeded what, so a change that pushes an sm_120 cubin past 99 KB (or two blocks that must share a multiprocessor
past its 100 KB), into a cluster shape sm_120 refuses, or out of step with its launcher (an argument gained or
lost), fails CI instead of the user's first launch (or, for the blocks sharing one, its first slow one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from kdt import arches
from kdt.build import BuildResult
from kdt.launch.plan import ArraySpec, LaunchPlan, Target
from kdt.spec import StageSpec
from kdt.refs.errors import BadInput


@dataclass(frozen=True)
class Violation:
    kernel: str
    arch: str
    function: str
    limit: str        # what was exceeded: "shared memory per block (dynamic + static)", ...
    allowed: int      # (for a launch whose arguments do not fit: the function's parameter count)
    asked: int        # (and the launch's argument count)
    where: str        # the bench shape whose plan asked for it, or "ptxas"


def bench_plans(spec: StageSpec, result: BuildResult) -> list[tuple[str, LaunchPlan]]:
    """The stage's plans for its bench shapes (every set's), for a typical GPU of the cubin's arch."""
    arch = arches.get(result.arch)
    return shape_plans(spec, spec.every_bench_shape(), Target.make(arch.name, arch.multiprocessors, result.constants))


def shape_plans(spec: StageSpec, shapes: Iterable, target: Target,
                knobs: dict | None = None) -> list[tuple[str, LaunchPlan]]:
    """The stage's plans for `shapes` (kdt.bench.BenchShape) on `target` (with the launch `knobs`, if any), by shape
    name."""
    from kdt import ops

    plans = []
    for shape in shapes:
        inputs = {name: ArraySpec(tuple(dims), dtype) for name, (dims, dtype) in shape.layout.items()}
        try:
            plans.append((shape.name, ops.plan_for(spec, inputs, dict(shape.params), target, knobs)))
        except (BadInput, KeyError) as error:   # a plan the cubin cannot make (a constant it lacks) is a violation
            plans.append((shape.name, LaunchPlan(spec.name, f"no plan: {error}", ())))
    return plans


def check(result: BuildResult, plans: Iterable[tuple[str, LaunchPlan]] = ()) -> list[Violation]:
    """What in `result` (and in the launches `plans` make of it) exceeds its arch's limits; the worst case per
    function and limit."""
    arch = arches.get(result.arch)
    plans = list(plans)
    found: dict[tuple[str, str], Violation] = {}

    def over(function: str, limit: str, allowed: int, asked: int, where: str) -> None:
        if asked > allowed:
            key = (function, limit)
            if key not in found or asked > found[key].asked:
                found[key] = Violation(result.kernel, arch.name, function, limit, allowed, asked, where)

    resources = {r.function: r for r in result.resources}
    for r in result.resources:
        over(r.function, "registers per thread", arch.max_registers, r.registers, "ptxas")
        over(r.function, "shared memory per block (static)", arch.smem_per_block, r.shared_bytes, "ptxas")
    for where, plan in plans:
        for launch in plan.launches:
            if launch.function not in resources:
                continue   # one of the mismatches
            static = resources[launch.function].shared_bytes
            over(launch.function, "shared memory per block (dynamic + static)", arch.smem_per_block,
                 launch.dynamic_smem + static, where)
            over(launch.function, "blocks per cluster", arch.max_cluster, launch.cluster, where)
            over(launch.function, "threads per block", arch.max_threads, launch.block, where)
            together = launch.blocks_per_sm
            if together > 1:
                registers = -(-resources[launch.function].registers // 8) * 8  # allocated 8 a thread at a time
                over(launch.function, f"shared memory per multiprocessor ({together} blocks, "
                     f"{arch.smem_reserved_per_block} B reserved each)", arch.smem_per_sm,
                     together * (launch.dynamic_smem + static + arch.smem_reserved_per_block), where)
                over(launch.function, f"threads per multiprocessor ({together} blocks)", arch.threads_per_sm,
                     together * launch.block, where)
                over(launch.function, f"registers per multiprocessor ({together} blocks)", arch.registers_per_sm,
                     together * launch.block * registers, where)
    return sorted([*found.values(), *mismatches(result, plans)], key=lambda v: (v.kernel, v.arch, v.function, v.limit))


def mismatches(result: BuildResult, plans: Iterable[tuple[str, LaunchPlan]]) -> list[Violation]:
    """Where the launchers and `result`'s cubin disagree: a plan they cannot make of it (a constant it lacks), a
    function it lacks, or arguments whose sizes are not those of the function's parameters (the driver would read
    past the argument array and crash the process, or hand the kernel its arguments in the wrong places). One per
    function and what differs."""
    parameters = {r.function: r.parameters for r in result.resources}
    found: dict[tuple[str, str], Violation] = {}
    for where, plan in plans:
        if plan.path.startswith("no plan"):
            found.setdefault(("-", plan.path), Violation(result.kernel, result.arch, "-", plan.path, 0, 1, where))
        for launch in plan.launches:
            if launch.function not in parameters:
                limit, allowed, asked = "an entry point of the cubin", 0, 1
            elif launch.arg_sizes != parameters[launch.function]:
                cubin, launched = parameters[launch.function], launch.arg_sizes
                limit = f"parameters (bytes each): {_layout(cubin)} in the cubin, {_layout(launched)} launched"
                allowed, asked = len(cubin), len(launched)
            else:
                continue
            found.setdefault((launch.function, limit),
                             Violation(result.kernel, result.arch, launch.function, limit, allowed, asked, where))
    return list(found.values())


def _layout(sizes: tuple[int, ...]) -> str:
    """Parameter or argument sizes as printed: "8,4,4,8" ("none" for none)."""
    return ",".join(map(str, sizes)) or "none"
