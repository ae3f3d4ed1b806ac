"""A PipelineResult for people (rich tables, the failures in words) and for tools (JSON)."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np

from kdt.pipeline import acceptance
from kdt.pipeline.result import PipelineResult
from kdt.pipeline.step import GRAPH_STAGES, KDT_STAGES


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def result_json(result: PipelineResult) -> str:
    lens = result.all_accept_lens
    histogram = {str(k): int(c) for k, c in zip(*np.unique(lens, return_counts=True))} if lens.size else {}
    stages = {}
    for name, timing in result.timings.items():
        entry = {"kind": timing.kind, "ms_per_step_median": _ms(timing.median_ms),
                 "ms_per_step_mean": _ms(float(np.mean(timing.ms)) if timing.ms else None)}
        if timing.reference_ms:
            entry["cpu_reference_ms_per_step_median"] = _ms(timing.reference_median_ms)
            entry["speedup_vs_cpu_reference"] = (_ms(timing.reference_median_ms / timing.median_ms)
                                                 if timing.median_ms else None)
        stages[name] = entry
    mismatch = result.mismatch
    payload = {
        "config": asdict(result.config),
        "device": result.device,
        "acceptance_stage": acceptance.stage_name(result.config),   # what the step's "tree-accept" stage ran
        "lossless": result.lossless,
        "passed": result.passed,
        "first_mismatch": asdict(mismatch) if mismatch else None,
        "reference_disagreements": result.disagreements,
        "requests": result.config.batch,
        "tokens_generated": result.tokens_generated,
        "steps": result.steps,
        "target_calls_per_request": [int(n) for n in result.request_steps],
        "mean_accept_len": result.mean_accept_len,
        "tokens_per_target_call": result.tokens_per_target_call,
        "accept_len_histogram": histogram,
        "stages": stages,
        "kdt_stages_ms_per_step_median": _ms(result.stage_sum_ms(KDT_STAGES)),
        "kdt_stages_cpu_reference_ms_per_step_median": _ms(result.stage_sum_ms(KDT_STAGES, reference=True)),
        "step_graph_ms_per_step_median": _ms(result.graph_median_ms),
        "accept_lens_per_step": [[int(x) for x in step] for step in result.accept_lens],
    }
    return json.dumps(payload, indent=2)


def summary_tables(result: PipelineResult):
    """Two tables (kdt.console.Sheet): what was decoded and checked, and the time of each stage per step."""
    from kdt.console import Sheet, styled

    config = result.config
    gpu = config.backend == "gpu"
    title = (f"kdt pipeline on {result.device}: G={config.batch} B={config.budget} K={config.depth} V={config.topk} "
             f"vocab={config.vocab} quality={config.draft_quality:g} seed={config.seed} "
             f"{acceptance.describe(config)}" + (" overlap_previous" if config.overlap_previous else ""))
    numbers = Sheet(title, ("what", "value"), right=("value",), show_header=False)
    numbers.add_row("requests", str(config.batch))
    numbers.add_row("tokens generated", f"{result.tokens_generated} ({config.tokens} per request)")
    numbers.add_row("steps (batched target calls)", str(result.steps))
    numbers.add_row("mean accepted length (bonus excluded)", f"{result.mean_accept_len:.3f} of {config.depth}")
    numbers.add_row("tokens per target call", f"{result.tokens_per_target_call:.3f}")
    numbers.add_row(f"lossless (= {acceptance.baseline_name(config)})",
                    styled("yes", "green") if result.lossless else styled("NO", "red"))
    if gpu:
        numbers.add_row("every GPU output = the references'",
                        styled("yes", "green") if not result.disagreements else styled("NO", "red"))

    timed = ["GPU ms", "CPU reference ms", "x CPU"] if gpu else ["CPU ms"]
    stages = Sheet("time per step, ms (median over steps)" +
                   ("; GPU stages replayed from CUDA graphs" if gpu else "; the numpy references"),
                   ["stage", "kind", *timed], right=timed)

    def row(label: str, kind: str, ms: float | None, reference: float | None = None) -> None:
        cells = [label, kind, "-" if ms is None else f"{ms:.3f}"]
        if gpu:
            cells.append("-" if reference is None else f"{reference:.3f}")
            cells.append(f"{reference / ms:,.1f}" if reference and ms else "-")
        stages.add_row(*cells)

    accepting = acceptance.stage_name(config)  # the step's acceptance stage, by the contract stage it ran
    for name, timing in result.timings.items():
        kind = timing.kind + (" (eager)" if gpu and name in ("drafter", "append") else "")
        row(acceptance.stage_label(config, name), kind, timing.median_ms,
            timing.reference_median_ms if gpu and name != "append" else None)
    row(f"kdt stages (topk + tree-build + {accepting})", "sum", result.stage_sum_ms(KDT_STAGES),
        result.stage_sum_ms(KDT_STAGES, reference=True) if gpu else None)
    if gpu:
        row(f"step graph (topk -> tree-build -> target -> {accepting})", "one replay", result.graph_median_ms,
            result.stage_sum_ms(GRAPH_STAGES, reference=True))
    return numbers, stages


def print_result(result: PipelineResult) -> None:
    """The tables, then the first token unlike plain decoding and each stage unlike its reference, if any."""
    from rich.markup import escape

    from kdt.console import console

    for table in summary_tables(result):
        console.print(table)
    mismatch = result.mismatch
    if mismatch is not None:
        baseline = acceptance.baseline_name(result.config)
        console.print(f"[red]not lossless[/]: request {mismatch.request}, generated token {mismatch.position}: "
                      f"{baseline} gives {mismatch.expected}, the pipeline gave {mismatch.got} "
                      f"({mismatch.requests_affected} of {result.config.batch} requests differ)")
    for stage, detail in result.disagreements.items():
        label = acceptance.stage_label(result.config, stage)
        console.print(f"[red]{escape(label)} disagrees with the reference[/]: {escape(detail)}")
