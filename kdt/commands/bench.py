"""`kdt bench`: time kernels the way engines run them, against the machine's measured peaks and the baselines;
`--sweep KNOB=a,b,c` times every shape at each value of a launch knob, `--arch A --arch B` on each arch (e.g. the
sm_90a build and the sm_120 configuration emulated on the same H200), side by side in one run."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from kdt import build, runtime, stages
from kdt.commands.common import KnobOption, SmsOption, StagesArg, knobs_for, parse_arches
from kdt.console import EXIT_CHECK_FAILED, EXIT_ENVIRONMENT, EXIT_OK, KdtExit, console
from kdt.launch.plan import make_knobs
from refs.errors import BadInput

COLUMNS = ("shape", "path", "graph us", "eager us", "p10-p90 us", "GB/s", "% copy", "TFLOP/s", "% mma", "CPU ref us",
           "x CPU", "torch us", "x torch")


def command(kernels: list[str] = StagesArg,
            quick: bool = typer.Option(False, "--quick", help="only the headline shapes"),
            shape: Optional[str] = typer.Option(None, "--shape", help="only shapes matching this glob"),
            json_file: Optional[Path] = typer.Option(None, "--json", help="write the results as JSON"),
            baseline: Optional[Path] = typer.Option(None, "--baseline", help="an earlier --json to compare with"),
            max_regression: float = typer.Option(10.0, "--max-regression", min=0,
                                                 help="with --baseline: exit 1 if a shape is slower by more than PCT"),
            plot_file: Optional[Path] = typer.Option(None, "--plot", help="draw time against size to FILE.png"),
            no_graph: bool = typer.Option(False, "--no-graph", help="eager launches only"),
            no_baselines: bool = typer.Option(False, "--no-baselines", help="skip the CPU and PyTorch baselines"),
            knob: Optional[list[str]] = KnobOption,
            sweep: Optional[str] = typer.Option(None, "--sweep", metavar="KNOB=A,B,...",
                                                help="time every shape at each of these values of one launch knob"),
            arch: Optional[list[str]] = typer.Option(None, "--arch", help="run the cubins of this arch (repeatable: "
                                                     "each shape on each, side by side; default: the GPU's own)"),
            sms: Optional[int] = SmsOption):
    """Time kernels (CUDA events, graph mode, rotated inputs) against the machine's measured peaks."""
    from kdt import bench, peaks, report

    specs = stages.select(kernels)
    fixed = knobs_for(specs, knob)
    points = _sweep_points(specs, sweep)
    before = None
    if baseline is not None:
        try:
            before = json.loads(baseline.read_text())
        except (OSError, ValueError) as error:
            raise BadInput("--baseline", "a JSON file written by kdt bench --json", f"{baseline} ({error})") from None
    if plot_file is not None and importlib.util.find_spec("matplotlib") is None:
        raise KdtExit(EXIT_ENVIRONMENT, "--plot needs matplotlib: python3 -m pip install -e '.\\[plot]'")
    runtime.cupy()
    runs = parse_arches(arch) if arch else [runtime.device_arch()]
    for name in runs:
        with runtime.selected(name if arch else None, sms):
            for spec in specs:
                build.build(spec, runtime.device_arch())
    machine = peaks.get()
    console.print(f"peaks on {machine.gpu}: copy {machine.copy_gbps:,.0f} GB/s, matmul {machine.matmul_tflops:,.0f} "
                  f"TFLOP/s ({machine.matmul_how})")
    results = []
    for spec in specs:
        if spec.bench_shapes is None:
            console.print(f"{spec.name}: no benchmark shapes defined")
            continue
        chosen = [s for s in spec.bench_shapes(quick) if shape is None or fnmatch.fnmatch(s.name, shape)]
        table = Table(title=f"kdt bench {spec.name}: us per launch (graph mode is the headline)")
        sweep_name = sweep.partition("=")[0].strip() if sweep else None
        extra = (("arch",) if len(runs) > 1 else ()) + ((sweep_name,) if sweep_name else ())
        for column in COLUMNS[:1] + extra + COLUMNS[1:]:
            table.add_column(column, justify="left" if column in ("shape", "path", "arch") else "right")
        for item in chosen:
            for name in runs:
                for point in points:
                    with runtime.selected(name if arch else None, sms):
                        r = bench.bench_shape(spec, item, machine, graph=not no_graph, baselines=not no_baselines,
                                              knobs={**fixed[spec.name], **point})
                    results.append(r)
                    cells = ([r.arch] if len(runs) > 1 else []) + [str(value) for value in point.values()]
                    table.add_row(*_row(r, cells))
        console.print(table)
    if json_file:
        report.write_atomically(json_file, bench.results_json(results, machine))
    if plot_file:
        bench.plot(results, plot_file)
    if before is not None:
        slower = bench.regressions(results, before, max_regression)
        for kernel, name, old, new in slower:
            console.print(f"[red]regression[/] {kernel} {name}: {old:.2f} us -> {new:.2f} us (+{100 * (new / old - 1):.0f}%)")
        if slower:
            raise typer.Exit(EXIT_CHECK_FAILED)
        console.print(f"no shape slower than the baseline by more than {max_regression:g}%")
    raise typer.Exit(EXIT_OK)


def _sweep_points(specs, sweep: Optional[str]) -> list[dict]:
    """--sweep KNOB=a,b,c -> [{KNOB: a}, {KNOB: b}, {KNOB: c}], each value checked against every stage's Knobs."""
    if sweep is None:
        return [{}]
    name, sep, values = sweep.partition("=")
    items = [value.strip() for value in values.split(",") if value.strip()]
    if not sep or not name.strip() or not items:
        raise BadInput("--sweep", "KNOB=A,B,... (at least one value)", sweep)
    points = [{name.strip(): value} for value in items]
    for spec in specs:
        for point in points:
            make_knobs(runtime.launcher(spec).Knobs, point, f"--sweep (stage {spec.name})")
    return points


def _row(r, sweep_cells: list[str]) -> list[str]:
    spread = r.graph or r.eager
    return [r.shape, *sweep_cells, r.path, f"{r.graph.median_us:.2f}" if r.graph else "-", f"{r.eager.median_us:.2f}",
            f"{spread.p10_us:.2f}-{spread.p90_us:.2f}", f"{r.gbps:,.0f}", f"{r.pct_copy_peak:.1f}",
            f"{r.tflops:.1f}" if r.flops else "-", f"{r.pct_matmul_peak:.1f}" if r.flops else "-",
            f"{r.cpu_reference_us:,.0f}" if r.cpu_reference_us else "-",
            f"{r.cpu_reference_us / r.headline_us:,.0f}" if r.cpu_reference_us else "-",
            f"{r.torch_us:.2f}" if r.torch_us else "-", f"{r.torch_us / r.headline_us:.1f}" if r.torch_us else "-"]
