"""`kdt profile`: Nsight Compute on one call of a stage (one bench shape or one golden case): per kernel its time,
DRAM and SM throughput, occupancy, registers, shared memory and top warp stalls; for a bench shape, the call's time
against the roofline bound of the shape's byte and flop model at this machine's measured peaks. `--lines N`: a
second run under ncu, the source lines where the warps stall most (kdt/source_stalls.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from kdt import profile, toolkit
from kdt.commands import common
from kdt.commands.common import (FormatOption, KnobOption, RunArchOption, SetOption, SmsOption, knobs_for,
                                 select_run, set_label)
from kdt.console import EXIT_CHECK_FAILED, EXIT_OK, OutputFormat, Report, Sheet, errors
from kdt.refs.errors import BadInput


def command(kernel: str = typer.Argument(..., help="a kernel name"),
            shape: Optional[str] = typer.Option(None, "--shape", help="the bench shape matching this glob "
                                                                      "(exactly one; `kdt plan KERNEL` lists them)"),
            shape_set: Optional[str] = SetOption,
            case: Optional[str] = typer.Option(None, "--case", help="the golden case matching this glob (exactly one)"),
            golden_file: Optional[Path] = typer.Option(None, "--golden", help="with --case: default "
                                                                               "golden/<kernel>.h5"),
            json_file: Optional[Path] = typer.Option(None, "--json", help="write every figure as JSON"),
            timeout: float = typer.Option(profile.DEFAULT_TIMEOUT_S, "--timeout", min=1,
                                          help="seconds allowed for the run under ncu"),
            lines: int = typer.Option(0, "--lines", min=0, metavar="N",
                                      help="also the N source lines (with the calls inlined on the way) where the "
                                           "warps stall most: a second run under ncu, its source counters"),
            knob: Optional[list[str]] = KnobOption, arch: Optional[str] = RunArchOption,
            sms: Optional[int] = SmsOption, output: OutputFormat = FormatOption):
    """Nsight Compute on one call of a kernel: time, throughput, occupancy, resources and stalls per function."""
    from kdt import peaks, runtime, stages

    spec = stages.get(kernel)
    kind, name, inputs, params, bench_shape, golden_path = _subject(spec, shape, shape_set, case, golden_file)
    knobs = knobs_for([spec], knob)[spec.name]
    select_run(arch, sms)
    runtime.cupy()  # no GPU: exit 2 before looking for anything else
    ncu = profile.find_ncu()
    if ncu is None:
        raise toolkit.ToolkitMissing(profile.NCU_MISSING)
    nvdisasm = toolkit.find_cuda_tool("nvdisasm") if lines else None
    if lines and nvdisasm is None:
        raise toolkit.ToolkitMissing("nvdisasm not found next to nvcc, on PATH or under CUDA_HOME: --lines maps "
                                     "ncu's samples to source lines through it")
    common.preflight([spec])  # builds the cubin here, so the run under ncu finds it cached
    plan = profile.launch_plan(spec, inputs, params, knobs)
    if not plan.launches:
        raise BadInput(f"--{kind}", f"a {kind} whose launch plan launches a kernel", f"{name} (path {plan.path!r})")
    machine = None
    out = Report("profile", output)
    if bench_shape is not None:
        machine = peaks.get()  # measured once per GPU and cached, so the kdt bench under ncu does not measure it
        out.say(f"peaks on {escape(machine.gpu)}: copy {machine.copy_gbps:,.0f} GB/s, matmul "
                f"{machine.matmul_tflops:,.0f} TFLOP/s ({escape(machine.matmul_how)})")
    functions = [launch.function for launch in plan.launches]
    skip, count = profile.launch_window(len(functions))
    which = f"launches {skip + 1}-{skip + count}" if count > 1 else f"launch {skip + 1}"
    errors.print(f"ncu on {spec.name} {kind} {escape(name)}: {which} of "
                 f"{escape(', '.join(dict.fromkeys(functions)))} ({escape(plan.path)}) ...")
    result = profile.run_profile(spec.name, functions, ncu=ncu, shape=name if kind == "shape" else None,
                                 case=name if kind == "case" else None, golden=golden_path, knobs=knob or (),
                                 arch=arch, sms=sms, timeout_s=timeout, shape_set=shape_set)
    roof = None
    if bench_shape is not None and result.kernels:
        roof = profile.roofline(bench_shape.bytes_moved, bench_shape.flops, machine.copy_gbps, machine.matmul_tflops,
                                result.kernels)
    where = f"{runtime.device_arch()}, plans for {runtime.multiprocessors()} SMs"
    for index, item in enumerate(result.kernels, 1):
        out.table(_kernel_table(f"kdt profile {spec.name} {name}", index, len(result.kernels), item))
    if roof is not None:
        out.table(_roofline_table(f"kdt profile {spec.name} {name} on {machine.gpu}", roof, len(result.kernels)))
    if result.kernels:
        out.say(escape(f"{len(result.kernels)} kernel{'s' if len(result.kernels) != 1 else ''}, "
                       f"{result.total_us:,.2f} us in one call ({where}); ncu times each kernel alone, caches "
                       "flushed first, clocks as they run"))
    figures = profile.results_json(result, plan_path=plan.path, arch=runtime.device_arch(),
                                   multiprocessors=runtime.multiprocessors(), knobs=knobs, roof=roof, peaks=machine)
    code, problem = result.verdict()
    if problem:
        out.say(f"[red]{escape(problem)}[/]")
        out.verbatim(result.tail().splitlines())
    elif lines:
        child = profile.child_command(spec.name, shape=name if kind == "shape" else None,
                                      case=name if kind == "case" else None, golden=golden_path, knobs=knob or (),
                                      arch=arch, sms=sms, shape_set=shape_set)
        problem = _lines(out, figures, spec, name, functions, child, ncu, nvdisasm, timeout, lines)
        if problem:
            code = EXIT_CHECK_FAILED
            out.say(f"[red]{escape(problem)}[/]")
    if json_file:
        from kdt import report

        report.write_atomically(json_file, json.dumps(figures, indent=2))
    out.document(figures)
    raise typer.Exit(code if problem else EXIT_OK)


def _lines(out, figures: dict, spec, name: str, functions: list[str], child: list[str], ncu, nvdisasm,
           timeout: float, count: int) -> Optional[str]:
    """kdt profile --lines: `child` (the first run's kdt bench or verify) under ncu again, a table per function of
    the `count` chains with the most stall samples (also into `figures`); what went wrong, or None."""
    from kdt import build, paths, runtime, source_stalls

    cubin = build.build(spec, runtime.device_arch()).cubin
    errors.print(f"ncu's source counters on the same launches, mapped through nvdisasm's line table of {cubin.name} "
                 "...")
    found = source_stalls.run(child, functions, ncu=ncu, nvdisasm=nvdisasm, cubin=cubin, timeout_s=timeout)
    figures["lines"] = {function: [dataclasses.asdict(row) for row in rows]
                        for function, rows in found.functions.items()}
    if not any(found.functions.values()):
        out.verbatim(found.output.strip().splitlines()[-25:])
        return f"the run for --lines gave no source counters (ncu exited {found.returncode})"
    for function, rows in found.functions.items():
        out.table(_lines_table(f"kdt profile {spec.name} {name}: {function}, where its warps stall (samples by "
                               "source line, outermost call first)", rows[:count], paths.KERNELS))
    return None


def _lines_table(title: str, rows, kernels_dir) -> Sheet:
    from kdt import source_stalls

    table = Sheet(title, ("samples", "share", "top stalls", "where", "source"), right=("samples", "share"))
    for row in rows:
        chain = row.chain[-4:]
        where = ("... > " if len(row.chain) > len(chain) else "") + " > ".join(chain) if chain else "(no line)"
        reasons = ", ".join(f"{reason.replace('_', ' ')} {n}" for reason, n in row.top_reasons())
        table.add_row(f"{row.samples:,}", f"{100 * row.share:.1f}%", reasons, where,
                      source_stalls.source_text(row.chain, kernels_dir)[:60])
    return table


def _subject(spec, shape: Optional[str], shape_set: Optional[str], case: Optional[str], golden_file: Optional[Path]):
    """(kind, name, input ArraySpecs, params, BenchShape or None, golden file or None) of the one shape (of
    `shape_set`, None: the default set) or case."""
    from kdt import golden
    from kdt.dtypes import name as dtype_name
    from kdt.launch.plan import ArraySpec
    from kdt.spec import DEFAULT_BENCH_SET

    if (shape is None) == (case is None):
        raise BadInput("--shape / --case", "one of them (a bench shape or a golden case)",
                       "both" if shape is not None else "neither")
    if golden_file is not None and case is None:
        raise BadInput("--golden", "--case to go with it", "--shape")
    common.refuse_set_with_case(shape_set, case)
    if shape is not None:
        shapes = spec.bench_set(shape_set or DEFAULT_BENCH_SET) if spec.bench_set_names() else []
        what = f"bench shape of {spec.name}{set_label(shape_set or DEFAULT_BENCH_SET)}"
        name = profile.pick_one(shape, [item.name for item in shapes], "--shape", what)
        item = next(item for item in shapes if item.name == name)
        inputs = {n: ArraySpec(tuple(s), d) for n, (s, d) in item.layout.items()}
        return "shape", name, inputs, dict(item.params), item, None
    path = (golden_file or golden.default_path(None, spec.name)).resolve()
    cases = [item.case for item in golden.read(path, spec).cases]
    name = profile.pick_one(case, [c.name for c in cases], "--case", f"case in {path}")
    found = next(c for c in cases if c.name == name)
    inputs = {n: ArraySpec(tuple(a.shape), dtype_name(a.dtype)) for n, a in found.inputs.items()}
    return "case", name, inputs, dict(found.params), None, path


def _table(title: str) -> Sheet:
    return Sheet(title, ("metric", "value"))


def _fmt(value, spec: str, text: str = "", dash: str = "-") -> str:
    """`value` formatted with `spec`, then `text`; None: `dash`."""
    return dash if value is None else format(value, spec) + text


def _kernel_table(subject: str, index: int, count: int, k: profile.KernelProfile) -> Sheet:
    table = _table(f"{subject}: {k.function}, launch {index} of {count} (grid {k.grid}, block {k.block})")
    limit = "" if k.blocks_per_sm_limit is None else (
        f"; at most {k.blocks_per_sm_limit} block{'s' if k.blocks_per_sm_limit != 1 else ''} per SM, limited by "
        f"{', '.join(k.occupancy_limited_by)}")
    smem = "-" if k.smem_bytes is None else (f"{k.static_smem_bytes or 0:,} B static + {k.dynamic_smem_bytes or 0:,} B "
                                             f"dynamic = {k.smem_bytes:,} B per block")
    moved = "" if k.dram_bytes is None else f" ({k.dram_bytes / 1e6:,.2f} MB moved)"
    rows = [
        ("duration", f"{k.duration_us:,.2f} us"),
        ("DRAM throughput", _fmt(k.dram_pct, ".1f", "% of peak") + moved),
        ("memory throughput", _fmt(k.memory_pct, ".1f", "% of peak (the busiest memory unit)")),
        ("SM throughput", _fmt(k.sm_pct, ".1f", "% of peak")),
        ("occupancy", ", ".join(filter(None, [_fmt(k.achieved_occupancy_pct, ".1f", "% achieved"),
                                              _fmt(k.theoretical_occupancy_pct, ".1f", "% theoretical", "")])) + limit),
        ("registers", _fmt(k.registers_per_thread, "d", " per thread")),
        ("shared memory", smem),
        ("waves", _fmt(k.waves_per_sm, ".2f", " per SM")),
        ("L2 hit rate", _fmt(k.l2_hit_pct, ".1f", "%")),
        ("warp cycles per issued instruction", _fmt(k.warp_cycles_per_issue, ".2f")),
    ]
    for rank, (reason, value) in enumerate(k.top_stalls(), 1):
        share = f" ({100 * value / k.warp_cycles_per_issue:.0f}%)" if k.warp_cycles_per_issue else ""
        rows.append((f"stall {rank}: {reason.replace('_', ' ')}", f"{value:.2f} cycles per issued instruction{share}"))
    for metric, value in rows:
        table.add_row(metric, value)
    return table


def _roofline_table(subject: str, roof: profile.Roofline, kernels: int) -> Sheet:
    table = _table(f"{subject}: one call against the roofline")
    rows = [
        ("model", f"{roof.bytes_moved:,} B moved, {roof.flops:,} flop"),
        ("peaks (kdt.peaks)", f"copy {roof.copy_gbps:,.0f} GB/s, matmul {roof.matmul_tflops:,.0f} TFLOP/s"),
        ("memory bound", f"{roof.memory_bound_us:,.3f} us (bytes / copy)"),
        ("compute bound", f"{roof.compute_bound_us:,.3f} us (flop / matmul)"),
        ("bound", f"{roof.bound_us:,.3f} us ({roof.bound_by})"),
        ("measured", f"{roof.measured_us:,.2f} us (the sum of {kernels} kernel{'s' if kernels != 1 else ''} under "
                     "ncu)"),
        ("x bound", _fmt(roof.x_bound, ",.1f", "x")),
        ("achieved", f"{roof.achieved_gbps:,.0f} GB/s ({100 * roof.achieved_gbps / roof.copy_gbps:.1f}% of copy)"
                     + (f", {roof.achieved_tflops:,.2f} TFLOP/s "
                        f"({100 * roof.achieved_tflops / roof.matmul_tflops:.1f}% of matmul)" if roof.flops else "")),
        ("DRAM bytes (ncu)", "-" if roof.dram_bytes is None else
         f"{roof.dram_bytes / 1e6:,.2f} MB, {_fmt(roof.dram_vs_model, '.2f', 'x')} the model"),
    ]
    for metric, value in rows:
        table.add_row(metric, value)
    return table
