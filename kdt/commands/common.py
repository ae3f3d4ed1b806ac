"""What several commands share: the kernel argument, the arch option, knob options, the progress bar."""

from __future__ import annotations

from typing import Optional

from typing import TYPE_CHECKING

import typer

from kdt import arches, stages
from kdt.console import EXIT_ENVIRONMENT, KdtExit, OutputFormat, errors
from kdt.refs.errors import BadInput

if TYPE_CHECKING:
    from rich.progress import Progress

    from kdt.spec import StageSpec

KernelsArg = typer.Argument(None, help="kernels: " + ", ".join(stages.available()) + " (default: all)")
StagesArg = typer.Argument(..., help="a kernel name or 'all'")
ArchOption = typer.Option(None, "--arch", help="target arch, repeatable (default: the GPU's, else sm_120)")
RunArchOption = typer.Option(None, "--arch", help="run the cubins of this arch (default: the GPU's own; "
                                                  "sm_120-emu: the sm_120 configuration on an H200)")
SmsOption = typer.Option(None, "--sms", min=1, help="make launch plans for a GPU of this many multiprocessors "
                                                    "(an emulated one: 70 for an RTX 5070 Ti, 188 for an RTX PRO 6000)")
KnobOption = typer.Option(None, "--knob", metavar="NAME=VALUE",
                          help="a launch knob of the stage (repeatable; `kdt plan STAGE` lists them)")
SetOption = typer.Option(None, "--set", metavar="NAME",
                         help="a named set of the stage's bench shapes (default: its default set; a name it lacks: "
                              "the error lists its sets)")
FormatOption = typer.Option(OutputFormat.table, "--format", case_sensitive=False,
                            help="table (rich), markdown (GitHub tables on stdout) or json (one document on stdout)")


def parse_arches(requested: Optional[list[str]]) -> list[str]:
    """The --arch values, checked; none given: the arch of the GPU present, else sm_120."""
    if not requested:
        from kdt import runtime

        return runtime.default_arches()
    chosen = []
    for item in requested:
        for name in item.split(","):          # --arch sm_90a,sm_120 as well as --arch sm_90a --arch sm_120
            name = name.strip()
            if name not in arches.ARCHES:
                raise BadInput("--arch", "one of " + ", ".join(arches.names()), name)
            if name not in chosen:
                chosen.append(name)
    return chosen


def shapes_to_run(specs, shape_set: str, quick: bool, pattern: Optional[str]) -> dict[str, list]:
    """{stage: its shapes of `shape_set` (--quick: the set's headline shapes) whose names match the glob `pattern`},
    for every stage with bench shapes; BadInput naming --set where a stage lacks the set, before anything runs."""
    import fnmatch

    return {spec.name: [item for item in spec.bench_set(shape_set, quick)
                        if pattern is None or fnmatch.fnmatch(item.name, pattern)]
            for spec in specs if spec.bench_set_names()}


def refuse_set_with_case(shape_set: Optional[str], case: Optional[str]) -> None:
    """--set picks bench shapes: refused next to --case (plan, profile)."""
    if shape_set is not None and case is not None:
        raise BadInput("--set", "no --set with --case (it picks bench shapes, not golden cases)", repr(shape_set))


def set_label(shape_set: Optional[str]) -> str:
    """What a table's title says of the bench shape set (--set): nothing for the default one (or none given)."""
    from kdt.spec import DEFAULT_BENCH_SET

    return "" if shape_set in (None, DEFAULT_BENCH_SET) else f" --set {shape_set}"


def select_run(arch: Optional[str], sms: Optional[int]) -> None:
    """--arch / --sms of the commands that run kernels: which cubins run here, and for how many SMs plans are made
    (checked against this GPU when the first kernel loads)."""
    from kdt import runtime

    runtime.select(arch, sms)


def knobs_for(specs: list[StageSpec], items: Optional[list[str]]) -> dict[str, dict]:
    """--knob NAME=VALUE items -> {stage: knobs}, each checked against the stage's Knobs (BadInput otherwise). With
    several stages a knob must belong to every one of them."""
    from kdt import runtime
    from kdt.launch.plan import make_knobs, parse_knob_options

    given = parse_knob_options(items)
    if not given:
        return {spec.name: {} for spec in specs}
    for spec in specs:
        make_knobs(runtime.launcher(spec).Knobs, given, f"--knob (stage {spec.name})")
    return {spec.name: given for spec in specs}


def progress() -> Progress:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=errors, transient=False)


def preflight(specs: list[StageSpec]) -> None:
    """Exit 2 before any case runs when this machine cannot run the kernels: no GPU (CuPy), a GPU of an arch kdt
    does not build for, no nvcc, a kernel that does not compile, a stage without a launcher."""
    from kdt import build, runtime

    runtime.cupy()
    arch = runtime.device_arch()
    for spec in specs:
        build.build(spec, arch)
        try:
            runtime.launcher(spec)
        except ModuleNotFoundError as error:
            raise KdtExit(EXIT_ENVIRONMENT, f"{spec.name}: no launcher (kdt/launch/{spec.module_name}.py): "
                                            f"{error}") from None
