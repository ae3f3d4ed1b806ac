"""Launch plan for `kernels/tree_accept.cu` (stage `tree-accept`): one launch for the whole batch.

- `target_predict` given: `tree_accept_from_predict`, one warp per request; no workspace.
- `target_logits` given (float32 or bf16): `tree_accept_from_logits`, G * N * S blocks (S vocab splits per row,
  chosen so that small batches still fill the GPU), the argmax fused with the walk. Its workspace (per-slot argmax
  keys, uint64 [G, N], then per-request counters, uint32 [G]) is zero on entry and left zero on exit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdt.launch.plan import ArraySpec, KernelLaunch, LaunchKnobs, LaunchPlan, Target, Workspace, cdiv, knob

PREFIX = "kdt_tree_accept_"
MAX_BLOCKS = 2**31 - 1
OUTPUTS = ("accept_len", "accept_index", "accept_tokens")
TREE = ("token", "first_child", "next_sibling")
# The knob overlap_previous's auto: the launch overlaps the one before it in captured graphs, 0.89-0.97 of the plain
# launch where the bench times graphs (H200, plans/perf-notes.md, "Thirtieth session").
OVERLAP_IN_GRAPHS = True


@dataclass(frozen=True)
class Knobs(LaunchKnobs):
    splits: int | None = knob(None, "fused argmax: vocabulary splits per row; None: enough blocks for two full "
                                    "waves, no split under split_min_vectors 16-byte vectors")


def vocab_splits(rows: int, vocab: int, elem_size: int, target: Target, knobs: Knobs) -> int:
    """Vocabulary splits per row of the fused argmax. G = N = 64 (4096 rows) gives 1 on an H200."""
    most = max(1, vocab * elem_size // 16 // target.constant(PREFIX + "split_min_vectors"))
    wanted = cdiv(2 * target.multiprocessors * target.constant(PREFIX + "argmax_min_blocks"), rows)
    if knobs.splits is not None:
        wanted, most = knobs.splits, max(1, knobs.splits)
    return max(1, min(most, wanted, MAX_BLOCKS // rows))


def plan(inputs: dict[str, ArraySpec], params: dict, target: Target, knobs: Knobs) -> LaunchPlan:
    groups, slots = inputs["token"].shape
    depth = int(params["max_depth"])
    if groups == 0:
        return LaunchPlan("tree-accept", "empty", (), knobs=knobs)
    if "target_predict" in inputs:
        warps = target.constant(PREFIX + "walk_warps")
        launch = KernelLaunch("tree_accept_from_predict", (cdiv(groups, warps), 1, 1), 32 * warps,
                              (*TREE, "target_predict", np.int32(groups), np.int32(slots), np.int32(depth), *OUTPUTS),
                              overlaps_previous_in_graphs=OVERLAP_IN_GRAPHS)
        return LaunchPlan("tree-accept", "predictions", (launch,), knobs=knobs)
    logits = inputs["target_logits"]
    vocab = logits.shape[2]
    bf16 = logits.dtype == "bfloat16"
    rows = groups * slots
    splits = vocab_splits(rows, vocab, 2 if bf16 else 4, target, knobs)
    launch = KernelLaunch("tree_accept_from_logits", (rows * splits, 1, 1), target.constant(PREFIX + "argmax_threads"),
                          ("target_logits", np.int32(1 if bf16 else 0), np.int32(vocab), np.int32(splits), *TREE,
                           np.int32(groups), np.int32(slots), np.int32(depth), Workspace(), *OUTPUTS),
                          overlaps_previous_in_graphs=OVERLAP_IN_GRAPHS)
    return LaunchPlan("tree-accept", "fused argmax + walk", (launch,), groups * slots * 8 + groups * 4,
                      (("vocab splits", splits),), knobs)
