"""Launch plan for `kernels/tree_sample.cu` (stage `tree-sample`): every draw is one cluster's (blocks each a chunk
of the row). Two paths, chosen by shape, one launch each:

  every slot  few rows (G * N clusters fit `every_slot_blocks_per_sm` blocks per multiprocessor, N <= the kernel's
              SLOTS_MAX): `kdt_tree_sample_slots` draws every reachable slot at once, at its depth's position, into
              the workspace, one 64-bit entry per slot [G, N] (valid bit, depth + 1, token); the last cluster of
              each request to count (a counter per request, uint32 [G]) walks on those draws and leaves entries and
              counter zero. A single request's latency is one draw, not one per accepted token. Where clusters of
              six, one a multiprocessor, take at most `six_block_waves` waves, `kdt_tree_sample_slots6` does the
              same with those: a block alone on its multiprocessor reads faster than two sharing one (H200, G = 1:
              N = 8 to 32 0.86-0.94 of the eight-block time; N = 64, three waves: 1.20).
  walk        otherwise: `kdt_tree_sample_walk`, one cluster per request drawing each slot it visits, so only the
              K + 1 rows a walk can visit are read (G = 64, N = 64: ~1/64 of the logits).

Every per-request value is read on the device and the plan depends on shapes only: graph-capturable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdt.launch.plan import ArraySpec, KernelLaunch, LaunchKnobs, LaunchPlan, Target, Workspace, knob
from kdt.launch.tree_accept import OUTPUTS

PREFIX = "kdt_tree_sample_"
# The knob overlap_previous's auto: the launch overlaps the one before it in captured graphs, 0.96-1.00 of the plain
# launch on the tp8 set (H200, plans/perf-notes.md, "Thirtieth session").
OVERLAP_IN_GRAPHS = True
SAMPLING = ("temperature", "top_k", "top_p", "seed", "position")


@dataclass(frozen=True)
class Knobs(LaunchKnobs):
    every_slot_blocks_per_sm: int = knob(4, "draw every slot at once when its G * N clusters need at most this many "
                                            "blocks per multiprocessor (0: always walk)")
    six_block_waves: int = knob(2, "the every-slot path in clusters of six blocks, one a multiprocessor "
                                   "(kdt_tree_sample_slots6), where they take at most this many waves; beyond, "
                                   "clusters of eight at two a multiprocessor (0: always eight)")


def every_slot(groups: int, slots: int, target: Target, knobs: Knobs) -> bool:
    """Whether the every-slot path takes this shape."""
    blocks = groups * slots * target.constant(PREFIX + "cluster")
    return slots <= target.constant(PREFIX + "slots_max") and \
        blocks <= knobs.every_slot_blocks_per_sm * target.multiprocessors


def plan(inputs: dict[str, ArraySpec], params: dict, target: Target, knobs: Knobs) -> LaunchPlan:
    groups, slots = inputs["token"].shape
    if groups == 0:
        return LaunchPlan("tree-sample", "empty", (), knobs=knobs)
    logits = inputs["target_logits"]
    threads, eight = target.constant(PREFIX + "threads"), target.constant(PREFIX + "cluster")
    row = ("target_logits", np.int32(1 if logits.dtype == "bfloat16" else 0), np.int32(logits.shape[2]))
    tree = (np.int32(slots), np.int32(int(params["max_depth"])), *SAMPLING)
    if not every_slot(groups, slots, target, knobs):
        walk = KernelLaunch("kdt_tree_sample_walk", (groups * eight, 1, 1), threads,
                            (*row, "token", "first_child", "next_sibling", *tree, *OUTPUTS), cluster=eight,
                            overlaps_previous_in_graphs=OVERLAP_IN_GRAPHS)
        return LaunchPlan("tree-sample", "walk: one cluster per request draws the slots it visits", (walk,),
                          facts=(("blocks per draw", eight),), knobs=knobs)
    draws = groups * slots * 8  # one 64-bit entry per slot
    six = target.constant(PREFIX + "slots6_cluster")
    if groups * slots * six <= knobs.six_block_waves * target.multiprocessors:
        function, cluster, per_sm = "kdt_tree_sample_slots6", six, 1
    else:
        function, cluster, per_sm = "kdt_tree_sample_slots", eight, target.constant(PREFIX + "slots_blocks_per_sm")
    launch = KernelLaunch(function, (groups * slots * cluster, 1, 1), threads,
                          (*row, "token", "first_child", "next_sibling", *tree, Workspace(0), Workspace(draws),
                           *OUTPUTS), cluster=cluster, blocks_per_sm=per_sm,
                          overlaps_previous_in_graphs=OVERLAP_IN_GRAPHS)
    return LaunchPlan("tree-sample", "every slot: all reachable slots drawn at once, the last walks", (launch,),
                      workspace_bytes=draws + groups * 4,
                      facts=(("blocks per draw", cluster), ("rows drawn at once", groups * slots)), knobs=knobs)
