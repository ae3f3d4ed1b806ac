"""The GPU backend's check: each step again on the CPU, every stage fed the GPU's own inputs to it.

This gives the CPU time of each stage (what engines do today, StageTiming.reference_ms) and compares every GPU
output with the reference's; the first difference of each stage is kept, as a sentence, in `disagreements`.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

import kdt.refs.topk as ref_topk
import kdt.refs.tree_build as ref_tree_build
import kdt.refs.tree_sample as ref_tree_sample
from kdt.pipeline import acceptance
from kdt.pipeline.config import PipelineConfig
from kdt.pipeline.drafter import draft_logits
from kdt.pipeline.result import StageClock, StageTiming
from kdt.pipeline.step import slot_contexts
from kdt.pipeline.target import TargetModel
from kdt.stages.topk import LOGP_ATOL as TOPK_LOGP_ATOL
from kdt.refs.errors import BadInput


def check_step(config: PipelineConfig, model: TargetModel, step: int, committed: np.ndarray, position: np.ndarray,
               gpu: dict[str, dict[str, np.ndarray]], timings: dict[str, StageTiming],
               disagreements: dict[str, str]) -> None:
    """`gpu`: each stage's outputs on the GPU this step, by stage (GpuStep.outputs_on_host); `committed` the last
    three committed tokens [G, 3] the drafter and the target started from, `position` [G] the committed lengths
    (the absolute position of the token drawn at the root)."""
    logits, top, tree = gpu["drafter"]["logits"], gpu["topk"], gpu["tree-build"]
    target_logits = gpu["target"]["target_logits"]
    clock = StageClock(timings, reference=True)
    reference: dict[str, dict[str, np.ndarray]] = {}

    def stage(name: str, compute: Callable[[], dict[str, np.ndarray]]) -> None:
        try:
            reference[name] = compute()
        except BadInput as error:  # a GPU output upstream that the contract calls bad input
            disagreements.setdefault(name, f"step {step}: the reference rejects its inputs from the GPU: {error}")
        clock.lap(name)

    def target() -> dict[str, np.ndarray]:
        contexts = slot_contexts(tree["parent"], tree["token"], tree["depth"], committed)
        return {"target_logits": model.logits(contexts.reshape(-1, 3)).reshape(target_logits.shape)}

    stage("drafter", lambda: {"logits": draft_logits(
        np, lambda last3: acceptance.greedy(np, model.logits(last3)), committed, step=step, seed=config.seed,
        depth=config.depth, vocab=config.vocab, quality=config.draft_quality)})
    stage("topk", lambda: ref_topk.topk(logits, config.topk))
    stage("tree-build", lambda: ref_tree_build.tree_build(top["top_logp"], top["top_ids"], config.budget))
    stage("target", target)
    stage("tree-accept", lambda: acceptance.accept(config, tree, target_logits, position))

    for name, expected in reference.items():
        for output, want in expected.items():
            if name in disagreements:
                break
            atol = TOPK_LOGP_ATOL if output == "top_logp" else 0.0
            # target logits are exact integers: compared by value (a zero's sign is not the model's business)
            problem = first_difference(want, gpu[name][output], atol, bits=output != "target_logits")
            if problem:
                disagreements[name] = f"step {step}: {output} {problem}"
                if name == "tree-accept" and not acceptance.is_greedy(config):
                    margins = acceptance.draw_margins(config, tree, target_logits, position)
                    disagreements[name] += knife_edge_note(margins, want, gpu[name][output])


def knife_edge_note(margins: np.ndarray, expected: np.ndarray, got: np.ndarray) -> str:
    """Why a sampled walk may differ from the reference's: the contract lets a float32 kernel round a draw on a
    knife's edge (decision margin below EPS) either way, and only such a draw. `margins` [G] from
    acceptance.draw_margins; `expected` and `got` one acceptance output, request first."""
    if expected.shape != got.shape:
        return ""
    request = int(np.argwhere(expected != got)[0][0])
    margin = float(margins[request])
    if margin < ref_tree_sample.EPS:
        return (f"; request {request} drew on a knife's edge (decision margin {margin:.3g} < {ref_tree_sample.EPS:g}),"
                " where float32 may round either way")
    return (f"; every draw of request {request} was decisive (smallest decision margin {margin:.3g}): not a rounding"
            " difference")


def first_difference(expected: np.ndarray, got: np.ndarray, atol: float = 0.0, bits: bool = True) -> str | None:
    """None when equal (float32: bit for bit, by value when not `bits`, or within atol when atol > 0; NaN never
    equal), else where they first differ."""
    if expected.shape != got.shape:
        return f"shape {got.shape}, expected {expected.shape}"
    if expected.dtype.kind == "f":
        if atol > 0:
            same = np.isclose(got, expected, rtol=0.0, atol=atol)
        elif not bits:
            same = got == expected
        else:
            same = (got.view(np.uint32) == expected.astype(np.float32).view(np.uint32)) & ~np.isnan(got)
    else:
        same = got == expected
    if same.all():
        return None
    index = tuple(int(i) for i in np.argwhere(~same)[0])
    return f"at {index}: {got[index].item()!r}, expected {expected[index].item()!r} ({int((~same).sum())} differ)"
