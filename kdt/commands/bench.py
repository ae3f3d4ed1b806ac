"""`kdt bench`: time kernels the way engines run them, against the machine's measured peaks and the baselines;
`--sweep KNOB=a,b,c` times every shape at each value of a launch knob, `--arch A --arch B` on each arch (e.g. the
sm_90a build and the sm_120 configuration emulated on the same H200), side by side in one run; `--against REV` times
another revision's kernels (or a directory of sources) against these, interleaved on the same inputs (with
`--whole-trees`: the other revision's own kdt, in processes alternating with this tree's); `--set NAME`
runs another of a stage's named sets of shapes (verify-attn's tp8: the deployment's own). Every shape is set against
the roofline of its byte and flop model: "bound us" = max(bytes / copy, flops / matmul) at the measured peaks,
"% of bound" = bound / measured time (100 = at the roofline)."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from kdt.commands.common import (FormatOption, KnobOption, SetOption, SmsOption, StagesArg, knobs_for, parse_arches,
                                 set_label, shapes_to_run)
from kdt.console import EXIT_CHECK_FAILED, EXIT_ENVIRONMENT, EXIT_OK, KdtExit, OutputFormat, Report, Sheet, styled
from kdt.refs.errors import BadInput

COLUMNS = ("shape", "path", "graph us", "eager us", "p10-p90 us", "GB/s", "% copy", "TFLOP/s", "% mma", "bound us",
           "% of bound", "CPU ref us", "x CPU", "torch us", "x torch")


def command(kernels: list[str] = StagesArg,
            shape_set: Optional[str] = SetOption,
            quick: bool = typer.Option(False, "--quick", help="only the set's headline shapes"),
            shape: Optional[str] = typer.Option(None, "--shape", help="only the set's shapes matching this glob"),
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
            sms: Optional[int] = SmsOption,
            against: Optional[str] = typer.Option(None, "--against", metavar="REV|DIR",
                                                  help="time the kernels of this git revision (or a directory of "
                                                       "sources) against these, interleaved; --max-regression "
                                                       "applies to the ratio"),
            whole_trees: bool = typer.Option(False, "--whole-trees",
                                             help="with --against: time the other revision with its own kdt (its "
                                                  "launchers, knobs and constants) in processes alternating with "
                                                  "this tree's, for builds these launchers cannot drive"),
            output: OutputFormat = FormatOption):
    """Time kernels (CUDA events, graph mode, rotated inputs) against the machine's measured peaks."""
    from kdt import bench, build, paths, peaks, report, runtime, stages
    from kdt.spec import DEFAULT_BENCH_SET

    specs = stages.select(kernels)
    if whole_trees and against is None:
        raise BadInput("--whole-trees", "with --against REV|DIR", "no --against")
    if whole_trees:
        if baseline is not None or plot_file is not None:
            raise BadInput("--against", "no --baseline or --plot with it (it compares two builds in one run)",
                           "both given")
        raise typer.Exit(_against_trees(specs, against, shape_set, quick, shape, knob or [], sweep, arch or [], sms,
                                        no_graph, max_regression, json_file, output))
    shape_set = shape_set or DEFAULT_BENCH_SET
    chosen_shapes = shapes_to_run(specs, shape_set, quick, shape)
    fixed = knobs_for(specs, knob)
    points = _sweep_points(specs, sweep)
    if against is not None:
        if baseline is not None or plot_file is not None:
            raise BadInput("--against", "no --baseline or --plot with it (it compares two builds in one run)",
                           "both given")
        raise typer.Exit(_against(specs, against, shape_set, chosen_shapes, fixed, points, arch, sms, no_graph,
                                  max_regression, json_file, output))
    before = None
    if baseline is not None:
        try:
            before = json.loads(baseline.read_text())
        except (OSError, ValueError) as error:
            raise BadInput("--baseline", "a JSON file written by kdt bench --json", f"{baseline} ({error})") from None
    if plot_file is not None and importlib.util.find_spec("matplotlib") is None:
        raise KdtExit(EXIT_ENVIRONMENT, escape(f"--plot needs matplotlib: {paths.install_command('plot')}"))
    runtime.cupy()
    runs = parse_arches(arch) if arch else [runtime.device_arch()]
    for name in runs:
        with runtime.selected(name if arch else None, sms):
            for spec in specs:
                build.build(spec, runtime.device_arch())
    machine = peaks.get()
    out = Report("bench", output)
    out.say(escape(f"peaks on {machine.gpu}: copy {machine.copy_gbps:,.0f} GB/s, matmul {machine.matmul_tflops:,.0f} "
                   f"TFLOP/s ({machine.matmul_how})"))
    results = []
    for spec in specs:
        if spec.name not in chosen_shapes:
            out.say(f"{spec.name}: no benchmark shapes defined")
            continue
        sweep_name = sweep.partition("=")[0].strip() if sweep else None
        extra = (("arch",) if len(runs) > 1 else ()) + ((sweep_name,) if sweep_name else ())
        columns = COLUMNS[:1] + extra + COLUMNS[1:]
        table = Sheet(f"kdt bench {spec.name}{set_label(shape_set)}: us per launch (graph mode is the headline)",
                      columns, right=[c for c in columns if c not in ("shape", "path", "arch")])
        noted = []
        for item in chosen_shapes[spec.name]:
            for name in runs:
                for point in points:
                    with runtime.selected(name if arch else None, sms):
                        r = bench.bench_shape(spec, item, machine, graph=not no_graph, baselines=not no_baselines,
                                              knobs={**fixed[spec.name], **point})
                    results.append(r)
                    cells = ([r.arch] if len(runs) > 1 else []) + [str(value) for value in point.values()]
                    table.add_row(*_row(r, cells))
                    noted += [(" ".join([r.shape, *cells]), note) for note in r.notes]
        out.table(table)
        for row, note in noted:
            out.say(f"[yellow]{escape(spec.name)} {escape(row)}[/]: {escape(note)}")
    if json_file:
        report.write_atomically(json_file, bench.results_json(results, machine, shape_set))
    if plot_file:
        bench.plot(results, plot_file)
    slower = bench.regressions(results, before, max_regression) if before is not None else []
    document = json.loads(bench.results_json(results, machine, shape_set))
    if before is not None:
        document["regressions"] = [{"kernel": kernel, "shape": name, "baseline_us": old, "now_us": new}
                                   for kernel, name, old, new in slower]
        for kernel, name, old, new in slower:
            out.say(f"[red]regression[/] {kernel} {escape(name)}: {old:.2f} us -> {new:.2f} us "
                    f"(+{100 * (new / old - 1):.0f}%)")
        if not slower:
            out.say(f"no shape slower than the baseline by more than {max_regression:g}%")
    out.document(document)
    out.step_summary()
    raise typer.Exit(EXIT_CHECK_FAILED if slower else EXIT_OK)


def _against(specs, against: str, shape_set: str, chosen_shapes: dict[str, list], fixed: dict, points: list[dict],
             arch: Optional[list[str]], sms: Optional[int], no_graph: bool, max_regression: float,
             json_file: Optional[Path], output: OutputFormat) -> int:
    """kdt bench --against: each shape with these kernels and with the other build's, round by round."""
    import dataclasses
    import tempfile

    from kdt import bench, paths, runtime

    runs = parse_arches(arch) if arch else [None]
    out = Report("bench", output)
    results = []
    with tempfile.TemporaryDirectory(prefix="kdt-against-") as scratch:
        theirs = bench.sources_of(against, paths.PACKAGE.parent, Path(scratch))
        for spec in specs:
            _refuse_undrivable(spec, theirs, against, chosen_shapes.get(spec.name, []), fixed[spec.name], points, runs,
                               sms)
        runtime.cupy()
        out.say(escape(f"these kernels ({paths.KERNELS}) against {against} ({theirs}); ratio = ours / theirs, "
                       f"median of {bench.COMPARE_ROUNDS} alternating rounds (p10-p90 of the rounds)"))
        for spec in specs:
            table = Sheet(f"kdt bench {spec.name}{set_label(shape_set)} --against {against}",
                          ("shape", *(("arch",) if arch else ()), *(("knob",) if points != [{}] else ()), "path",
                           "mode", "ours us", "theirs us", "ratio", "p10-p90", "verdict"),
                          right=("ours us", "theirs us", "ratio", "p10-p90"))
            for item in chosen_shapes.get(spec.name, []):
                for name in runs:
                    for point in points:
                        with runtime.selected(name, sms):
                            c = bench.compare_shape(spec, item, theirs, against, graph=not no_graph,
                                                    knobs={**fixed[spec.name], **point})
                        results.append(c)
                        table.add_row(c.shape, *((name,) if arch else ()),
                                      *(tuple(f"{k}={v}" for k, v in point.items()) if points != [{}] else ()),
                                      c.path, c.mode, f"{c.ours.median_us:.2f}", f"{c.theirs.median_us:.2f}",
                                      f"{c.ratio:.3f}", f"{c.ratio_p10:.3f}-{c.ratio_p90:.3f}",
                                      _verdict(c.ratio, max_regression))
            out.table(table)
    document = {"against": against, "set": shape_set, "max_regression_pct": max_regression,
                "comparisons": [dataclasses.asdict(c) for c in results]}
    return _compared(out, document, [c.ratio for c in results], against, max_regression, json_file)


def _verdict(ratio: float, max_regression: float):
    """An A/B row's verdict: slower or faster than the other build by more than --max-regression, or the same."""
    if ratio > 1 + max_regression / 100:
        return styled("slower", "red")
    return "faster" if ratio < 1 - max_regression / 100 else "same"


def _compared(out, document: dict, ratios: list[float], against: str, max_regression: float,
              json_file: Optional[Path]) -> int:
    """An A/B comparison's end: its document (to --json too), how many shapes regressed, and the exit code."""
    from kdt import report

    if json_file:
        report.write_atomically(json_file, json.dumps(document, indent=2))
    slower = sum(ratio > 1 + max_regression / 100 for ratio in ratios)
    out.say(f"{len(ratios)} shapes, {slower} slower than {against} by more than {max_regression:g}%")
    out.document(document)
    out.step_summary()
    return EXIT_CHECK_FAILED if slower else EXIT_OK


def _refuse_undrivable(spec, theirs: Path, against: str, shapes: list, knobs: dict, points: list[dict],
                       runs: list[Optional[str]], sms: Optional[int]) -> None:
    """Both builds of `spec` for each arch (a compile error is exit 2, named), then, on the CPU before the GPU is
    touched, BadInput (--against) where this tree's launcher cannot drive the other build: it would call a function
    the build lacks or pass arguments whose sizes differ from the function's parameters (the driver would read past
    the argument array and the process would die), or needs a constant the build does not export. Checked for the
    plans of every shape and knob to be timed, made with the other build's constants for the multiprocessor count the
    comparison plans for."""
    from kdt import arches, build, limits, runtime
    from kdt.launch.plan import Target

    for name in runs:
        with runtime.selected(name, sms):
            target_arch = name or runtime.device_arch()   # with no --arch, the GPU's own
            try:
                multiprocessors = runtime.multiprocessors()
            except runtime.GpuMissing:   # no GPU (the comparison stops later): a typical GPU of the arch
                multiprocessors = arches.get(target_arch).multiprocessors
        build.build(spec, target_arch)
        other = build.build(spec, target_arch, kernels_dir=theirs)
        target = Target.make(target_arch, multiprocessors, other.constants)
        plans = [plan for point in points for plan in limits.shape_plans(spec, shapes, target, {**knobs, **point})]
        found = limits.mismatches(other, plans)
        if found:
            raise BadInput("--against", "kernels whose entry points take the arguments this tree's launchers pass "
                                        "(these launchers cannot drive that build: add --whole-trees to time it "
                                        "with its own kdt, in processes alternating with this tree's)",
                           f"{against} ({target_arch}): " + "; ".join(map(_mismatch, found)))


def _against_trees(specs, against: str, shape_set: Optional[str], quick: bool, shape: Optional[str], knob: list[str],
                   sweep: Optional[str], arch: list[str], sms: Optional[int], no_graph: bool, max_regression: float,
                   json_file: Optional[Path], output: OutputFormat) -> int:
    """kdt bench --against REV --whole-trees: each tree's own kdt bench, in alternating processes (kdt.tree_compare)."""
    import dataclasses
    import tempfile

    from kdt import paths, tree_compare

    out = Report("bench", output)
    arguments = tree_compare.bench_arguments([spec.name for spec in specs], shape_set, quick, shape, knob, sweep,
                                             arch, sms, no_graph)
    with tempfile.TemporaryDirectory(prefix="kdt-against-") as scratch:
        other = tree_compare.tree_of(against, paths.PACKAGE.parent, Path(scratch))
        out.say(escape(f"this tree against {against} ({other}), each with its own kdt bench, "
                       f"{tree_compare.ROUNDS} rounds in alternating processes; ratio = ours / theirs, the median of "
                       f"the rounds (their range)"))
        ours, theirs = tree_compare.rounds(other, arguments, progress=lambda line: out.say(escape(line)))
    rows, lonely = tree_compare.compare(ours, theirs)
    knobbed = any(row.knobs for row in rows)
    table = Sheet(f"kdt bench {' '.join(spec.name for spec in specs)}{set_label(shape_set)} --against {against} "
                  f"--whole-trees", ("kernel", "shape", *(("arch",) if arch else ()), *(("knobs",) if knobbed else ()),
                                     "path", "mode", "ours us", "theirs us", "ratio", "range", "verdict"),
                  right=("ours us", "theirs us", "ratio", "range"))
    for row in rows:
        table.add_row(row.kernel, row.shape, *((row.arch,) if arch else ()),
                      *((" ".join(f"{k}={v}" for k, v in row.knobs.items()) or "-",) if knobbed else ()), row.path,
                      row.mode, f"{statistics.median(row.ours_us):.2f}", f"{statistics.median(row.theirs_us):.2f}",
                      f"{row.ratio:.3f}", f"{min(row.ratios):.3f}-{max(row.ratios):.3f}",
                      _verdict(row.ratio, max_regression))
    out.table(table)
    for item in lonely:
        out.say(f"[yellow]timed by one tree only[/]: {escape(item)}")
    document = {"against": against, "whole_trees": True, "rounds": tree_compare.ROUNDS, "set": shape_set,
                "max_regression_pct": max_regression, "only_one_tree": lonely,
                "comparisons": [{**dataclasses.asdict(row), "ratio": row.ratio} for row in rows]}
    return _compared(out, document, [row.ratio for row in rows], against, max_regression, json_file)


def _mismatch(v) -> str:
    """A kdt.limits.mismatches Violation as --against's refusal names it."""
    return f"{v.function + ': ' if v.function != '-' else ''}{v.limit} (shape {v.where})"


def _sweep_points(specs, sweep: Optional[str]) -> list[dict]:
    """--sweep KNOB=a,b,c -> [{KNOB: a}, {KNOB: b}, {KNOB: c}], each value checked against every stage's Knobs."""
    from kdt import runtime
    from kdt.launch.plan import make_knobs

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
            f"{r.bound_us:,.3f}", f"{r.pct_of_bound:.1f}",
            f"{r.cpu_reference_us:,.0f}" if r.cpu_reference_us else "-",
            f"{r.cpu_reference_us / r.headline_us:,.0f}" if r.cpu_reference_us else "-",
            f"{r.torch_us:.2f}" if r.torch_us else "-", f"{r.torch_us / r.headline_us:.1f}" if r.torch_us else "-"]
