"""`kdt plan`: the launch plans of a stage (which path, grid, block, shared memory, cluster, workspace) for its bench
shapes or golden cases, for the GPU here or any arch and multiprocessor count; no GPU needed (nvcc builds the cubin
whose exported constants the plans read)."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Optional

import typer

from kdt import arches
from kdt.commands.common import (FormatOption, KnobOption, SetOption, knobs_for, refuse_set_with_case, set_label,
                                 shapes_to_run)
from kdt.console import EXIT_OK, OutputFormat, Report, Sheet
from kdt.refs.errors import BadInput


def command(kernel: str = typer.Argument(..., help="a kernel name"),
            case: Optional[str] = typer.Option(None, "--case", help="the golden cases matching this glob instead "
                                                                    "of the bench shapes"),
            shape: Optional[str] = typer.Option(None, "--shape", help="only bench shapes matching this glob"),
            shape_set: Optional[str] = SetOption,
            golden_file: Optional[Path] = typer.Option(None, "--golden", help="with --case: default golden/<kernel>.h5"),
            arch: Optional[str] = typer.Option(None, "--arch", help="plan for this arch (default: the GPU's, else sm_120)"),
            sms: Optional[int] = typer.Option(None, "--sms", min=1, help="multiprocessors of the GPU planned for "
                                                                         "(default: the GPU's, else a typical one)"),
            knob: Optional[list[str]] = KnobOption,
            json_file: Optional[Path] = typer.Option(None, "--json", help="write the plans as JSON"),
            output: OutputFormat = FormatOption):
    """Print the launch plans of a stage, and its knobs."""
    from kdt import ops, runtime, stages
    from kdt.launch.plan import knob_help
    from kdt.spec import DEFAULT_BENCH_SET

    spec = stages.get(kernel)
    refuse_set_with_case(shape_set, case)
    shape_set = shape_set or DEFAULT_BENCH_SET
    knobs = knobs_for([spec], knob)[spec.name]
    items = _cases(spec, case, golden_file) if case is not None else _shapes(spec, shape_set, shape)
    target = _target(spec.name, arch, sms)
    table = Sheet(f"kdt plan {spec.name}{set_label(shape_set)}: {target.arch}, {target.multiprocessors} SMs"
                  + (f", knobs {', '.join(f'{k}={v}' for k, v in knobs.items())}" if knobs else ""),
                  ("case" if case is not None else "shape", "path", "function", "grid", "block", "cluster",
                   "blocks/SM", "smem B", "overlaps previous", "workspace B", "facts"))
    plans = []
    for name, inputs, params in items:
        plan = ops.plan_for(spec, inputs, params, target, knobs)
        plans.append({"name": name, **plan.as_json()})
        facts = ", ".join(f"{key} {value}" for key, value in plan.facts)
        for index, row in enumerate(plan.rows() or [None]):
            first = index == 0
            overlap = {True: "yes", False: ""}.get(row["overlaps previous"], row["overlaps previous"]) if row else ""
            cells = ([row["function"], row["grid"], str(row["block"]), str(row["cluster"]), str(row["blocks/SM"]),
                      str(row["dynamic smem B"]), overlap] if row else ["-"] * 7)
            table.add_row(name if first else "", plan.path if first else "", *cells,
                          str(plan.workspace_bytes) if first else "", facts if first else "")
    out = Report("plan", output)
    out.table(table)
    knob_texts = knob_help(runtime.launcher(spec).Knobs)
    help_table = Sheet(f"{spec.name} knobs (--knob NAME=VALUE; kdt bench --sweep NAME=A,B)",
                       ("knob", "what it changes (default)"))
    for name, text in knob_texts.items():
        help_table.add_row(name, text)
    out.table(help_table)
    sets = spec.bench_set_names()
    if sets:
        out.say(f"{spec.name} bench shape sets (--set NAME, for plan, bench and profile): {', '.join(sets)}")
    document = {"arch": target.arch, "multiprocessors": target.multiprocessors, "knobs_set": knobs,
                **({} if case is not None else {"set": shape_set}), "sets": sets, "plans": plans,
                "knobs": knob_texts}
    out.document(document)
    if json_file:
        from kdt import report

        report.write_atomically(json_file, json.dumps(document, indent=2, default=str))
    raise typer.Exit(EXIT_OK)


def _target(kernel: str, arch: Optional[str], sms: Optional[int]) -> Target:
    from kdt import build, runtime
    from kdt.launch.plan import Target

    if arch is not None and arch not in arches.ARCHES:
        raise BadInput("--arch", "one of " + ", ".join(arches.names()), arch)
    here = arch is None and _has_gpu()
    chosen = arch or runtime.default_arches()[0]
    count = sms or (runtime.multiprocessors() if here else arches.get(chosen).multiprocessors)
    return Target.make(chosen, count, build.build(kernel, chosen).constants)


def _has_gpu() -> bool:
    from kdt import runtime

    try:
        runtime.cupy()
        return True
    except runtime.GpuMissing:
        return False


def _shapes(spec, shape_set: str, pattern: Optional[str]) -> list[tuple]:
    """(name, input ArraySpecs, params) of the set's bench shapes matching `pattern`; BadInput naming --set for a set
    the stage lacks."""
    from kdt.launch.plan import ArraySpec

    return [(item.name, {n: ArraySpec(tuple(s), d) for n, (s, d) in item.layout.items()}, dict(item.params))
            for item in shapes_to_run([spec], shape_set, False, pattern).get(spec.name, [])]


def _cases(spec, pattern: str, golden_file: Optional[Path]):
    from kdt import golden
    from kdt.dtypes import name as dtype_name
    from kdt.launch.plan import ArraySpec

    path = golden_file or golden.default_path(None, spec.name)
    found = [item.case for item in golden.read(path, spec).cases if fnmatch.fnmatch(item.case.name, pattern)]
    if not found:
        raise BadInput("--case", f"a pattern matching a case in {path}", pattern)
    for case in found:
        yield case.name, {n: ArraySpec(tuple(a.shape), dtype_name(a.dtype)) for n, a in case.inputs.items()}, \
            dict(case.params)
