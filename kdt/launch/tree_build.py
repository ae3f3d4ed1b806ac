"""Launch plan for `kernels/tree_build.cu` (stage `tree-build`): one block per request.

The entry point is `kdt_tree_build_p{NPL}`, NPL = the slots each lane of the build warp owns (the smallest power of
two >= ceil((B + 1) / 32)), with the suffix `_g` when the log-probs a build can read (ranks < min(V, B + 1) at every
depth) do not fit the shared-memory budget and the rest is read from global memory, or `_select_narrow` /
`_select_wide` when the plan offers the select path a pool (B >= `select_min_budget`, the fan-out a build can read at
most the kernel's select_max_fanout, the scratch fits; the wide kind past select_narrow_fanout), or `_g_select_wide`
for both: rows too wide to stage beside the select scratch stage fewer ranks and read the rest from global memory.
Two arguments size that pool (0: the serial loop only); a third says whether the select path's wide kind (V > 32)
estimates its threshold from the rows first (B >= `select_estimate_min_budget`). The shared-memory layout below
mirrors the kernel's (plans/kernels/tree-build.md). No workspace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdt.launch.plan import ArraySpec, KernelLaunch, LaunchKnobs, LaunchPlan, Target, knob
from kdt.refs.errors import BadInput

PREFIX = "kdt_tree_build_"
SLOTS_PER_LANE = (1, 2, 4, 8, 16, 32)
# Select-path capacities (entries). Ranked: paths at or above the threshold bin, measured at B to 1.05 B on
# drafter inputs. Pool (one-pass layout): every path counted on the way, measured up to 7.8 B at B = 255 and
# 8.4 B at B = 1023 (which takes two passes: 4096 entries of that layout do not fit next to its 1024 slots).
SELECT_MIN_RANKED = 256
SELECT_MIN_POOL = 1024
SELECT_POOL_PER_SLOT = 16
SELECT_MAX_POOL = 4096


@dataclass(frozen=True)
class Knobs(LaunchKnobs):
    select_min_budget: int | None = knob(None, "the smallest budget offered the select path (None: the kernel's "
                                               "kdt_tree_build_select_min_budget; 1 forces it, 1024 never)")
    select_estimate_min_budget: int | None = knob(
        None, "the smallest budget whose wide select (V > 32) estimates its threshold from the rows first (None: "
              "the kernel's kdt_tree_build_select_estimate_min_budget; 1 always, 1024 never)")


def slots_per_lane(budget: int) -> int:
    """NPL: the smallest power of two >= ceil((budget + 1) / 32)."""
    need = (budget + 1 + 31) // 32
    return next(npl for npl in SLOTS_PER_LANE if npl >= need)


def staged_bytes(depth: int, staged: int) -> int:
    """One staged [K, Vs] array (log-probs or ids), padded to 16 bytes as the kernel's `staged_bytes`."""
    return (4 * depth * staged + 15) // 16 * 16


@dataclass(frozen=True)
class SmemLayout:
    slots_per_lane: int      # NPL
    staged: int              # Vs: ranks staged in shared memory per depth
    pool: int                # select pool entries (0: serial loop only)
    ranked: int              # select ranked entries
    bytes: int               # dynamic shared memory


def smem_layout(depth: int, fanout: int, budget: int, target: Target, knobs: Knobs) -> SmemLayout:
    """The kernel's shared-memory layout for these sizes. Pool > ranked: the select path's one-pass layout (every
    counted path kept), falling back to two passes in the same scratch; equal: two passes. Region x holds the
    staged [K, Vs] log-probs and ids and the select scratch during the build, and the mask tiles (threads / 32
    warps x 32 rows x W words) during the finalize."""
    c = lambda name: target.constant(PREFIX + name)
    npl = slots_per_lane(budget)
    slots = 32 * npl
    words = (budget + 1 + 31) // 32
    fixed = c("smem_slot_bytes") * slots + c("smem_header_bytes")
    tiles = 4 * (c("threads") // 32) * 32 * words
    room = c("smem_budget") - fixed
    readable = min(fanout, budget + 1)           # the ranks a build can read
    staged = min(readable, (room - 32) // (8 * depth))
    if staged < 1 or tiles > room:   # cannot happen within the contract's limits; a guard for a changed kernel
        raise BadInput("top_logp", f"K, V and B that fit the kernel's {c('smem_budget')} B of shared memory",
                       f"K={depth}, V={fanout}, B={budget}")
    build = 2 * staged_bytes(depth, staged)
    pool = ranked = 0
    min_budget = c("select_min_budget") if knobs.select_min_budget is None else knobs.select_min_budget
    if budget >= min_budget and readable <= c("select_max_fanout"):
        select_ranked = max(2 * slots, SELECT_MIN_RANKED)
        scratch = lambda entries: (c("smem_select_fixed_bytes") + c("smem_select_bytes_per_cap") * entries
                                   + c("smem_select_bytes_per_ranked") * select_ranked)
        select_pool = min(SELECT_MAX_POOL, max(SELECT_POOL_PER_SLOT * slots, SELECT_MIN_POOL))
        select_staged = staged
        if staged < readable or build + scratch(select_pool) > room:
            select_pool = select_ranked                    # two passes
            # rows too wide for the scratch beside them: stage fewer ranks, the rest read from global memory
            select_staged = max(min(staged, (room - scratch(select_pool) - 32) // (8 * depth)), 0)
        select_build = 2 * staged_bytes(depth, select_staged) + scratch(select_pool)
        if select_staged >= 1 and select_build <= room:
            staged, pool, ranked, build = select_staged, select_pool, select_ranked, select_build
    return SmemLayout(npl, staged, pool, ranked, fixed + max(build, tiles))


# The knob overlap_previous's auto: the launch overlaps the one before it in captured graphs, 0.85-0.99 of the plain
# launch on every bench shape (H200, plans/perf-notes.md, "Thirtieth session").
OVERLAP_IN_GRAPHS = True

OUTPUTS = ("n_nodes", "parent", "depth", "token", "rank", "logw", "first_child", "next_sibling", "mask")


def plan(inputs: dict[str, ArraySpec], params: dict, target: Target, knobs: Knobs) -> LaunchPlan:
    groups, depth, fanout = inputs["top_logp"].shape
    budget = int(params["budget"])
    if groups == 0:
        return LaunchPlan("tree-build", "empty", (), knobs=knobs)
    layout = smem_layout(depth, fanout, budget, target, knobs)
    readable = min(fanout, budget + 1)           # ranks up to B are the most a build can read
    partial = layout.staged < readable          # ranks past Vs from global memory (the kernel's kPartialLp)
    wide = partial or readable > target.constant(PREFIX + "select_narrow_fanout")   # the select path's wide kind
    kind = "wide" if wide else "narrow"
    if partial and layout.pool:
        name, path = (f"{PREFIX}p{layout.slots_per_lane}_g_select_wide",
                      "select where every log-prob <= 0, else serial; ranks past Vs from global memory")
    elif partial:
        name, path = f"{PREFIX}p{layout.slots_per_lane}_g", "serial, ranks past Vs from global memory"
    elif layout.pool:
        name, path = f"{PREFIX}p{layout.slots_per_lane}_select_{kind}", "select where every log-prob <= 0, else serial"
    else:
        name, path = f"{PREFIX}p{layout.slots_per_lane}", "small" if layout.slots_per_lane <= 2 else "serial"
    estimate_min = knobs.select_estimate_min_budget
    if estimate_min is None:
        estimate_min = target.constant(PREFIX + "select_estimate_min_budget")
    estimate = bool(layout.pool) and wide and budget >= estimate_min    # the narrow kind has no estimate
    launch = KernelLaunch(name, (groups, 1, 1), target.constant(PREFIX + "threads"),
                          ("top_logp", "top_ids", np.int32(depth), np.int32(fanout), np.int32(budget),
                           np.int32(layout.staged), np.int32(layout.pool), np.int32(layout.ranked),
                           np.int32(estimate), *OUTPUTS),
                          layout.bytes, overlaps_previous_in_graphs=OVERLAP_IN_GRAPHS)
    facts = (("slots per lane", layout.slots_per_lane), ("staged ranks", layout.staged),
             ("select pool", layout.pool), ("select ranked", layout.ranked),
             ("threshold estimated", "yes" if estimate else "no"))
    return LaunchPlan("tree-build", path, (launch,), 0, facts, knobs)
