"""Launcher for `kernels/tree_build.cu` (contract section `tree-build`).

One block per request. The entry point is `kdt_tree_build_p{NPL}`, NPL = the slots each lane of the build warp
owns (the smallest power of two >= ceil((B + 1) / 32)), with the suffix `_g` when the log-probs the build can read
(ranks < min(V, B + 1) at every depth) do not fit the shared-memory budget and the rest is read from global memory.
Two more arguments size the select path's shared-memory pool (`smem_layout`; 0 keeps a launch on the serial
loop): it is offered from B = `KDT_TREE_BUILD_SELECT_MIN_BUDGET` (default: the kernel's constant) when the staged
fan-out is at most 32, and then the launch uses the entry with the suffix `_select` (the only one that contains the
select path). Block size, the shared-memory budget and the layout sizes are read once per module from the
kernel's exported `__constant__` ints. No workspace; no allocation, synchronisation or host read of device data in `launch` once the
constants have been read (on first use), so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import os

import numpy as np

from kdt.launch.common import kernel_constants, kernel_function

_PREFIX = "kdt_tree_build_"
_CONSTANTS = ("threads", "smem_budget", "smem_slot_bytes", "smem_header_bytes", "max_budget", "max_depth",
              "max_fanout", "select_min_budget", "select_max_fanout", "smem_select_fixed_bytes",
              "smem_select_bytes_per_cap", "smem_select_bytes_per_ranked")
_SLOTS_PER_LANE = (1, 2, 4, 8, 16, 32)
SELECT_MIN_BUDGET_ENV = "KDT_TREE_BUILD_SELECT_MIN_BUDGET"
# Select-path capacities (entries). Ranked: paths at or above the threshold bin, measured at B to 1.05 B on
# drafter inputs. Pool (one-pass layout): every path counted on the way, measured up to 7.8 B at B = 255 and
# 8.4 B at B = 1023 (which takes two passes: 4096 entries of that layout do not fit next to its 1024 slots).
SELECT_MIN_RANKED = 256
SELECT_MIN_POOL = 1024
SELECT_POOL_PER_SLOT = 16
SELECT_MAX_POOL = 4096

def slots_per_lane(budget: int) -> int:
    """NPL: the smallest power of two >= ceil((budget + 1) / 32)."""
    need = (budget + 1 + 31) // 32
    for npl in _SLOTS_PER_LANE:
        if npl >= need:
            return npl
    raise ValueError(f"tree-build: budget {budget} needs more than {_SLOTS_PER_LANE[-1]} slots per lane")


def _staged_bytes(depth: int, staged: int) -> int:
    """One staged [K, Vs] array (log-probs or ids), padded to 16 bytes as the kernel's `staged_bytes`."""
    return (4 * depth * staged + 15) // 16 * 16


def select_min_budget(constants: dict) -> int:
    """The smallest budget that takes the select path: the kernel's default, or the environment's
    KDT_TREE_BUILD_SELECT_MIN_BUDGET (tests set it to prove both paths on the same inputs)."""
    value = os.environ.get(SELECT_MIN_BUDGET_ENV)
    if value is None or value == "":
        return constants["select_min_budget"]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{SELECT_MIN_BUDGET_ENV} must be an integer, got {value!r}") from None


def smem_layout(depth: int, fanout: int, budget: int, constants: dict) -> tuple[int, int, int, int, int]:
    """(NPL, Vs, select pool capacity, select ranked capacity, dynamic shared bytes), as the kernel lays them out.

    Capacities 0: the serial loop only. Pool capacity > ranked capacity: the select path's one-pass layout (every
    counted path kept), falling back to two passes in the same scratch; equal: two passes. Region x holds the
    staged [K, Vs] log-probs and ids and the select scratch during the build, and the mask tiles
    (threads / 32 warps x 32 rows x W words) during the finalize.
    """
    npl = slots_per_lane(budget)
    slots = 32 * npl
    words = (budget + 1 + 31) // 32
    fixed = constants["smem_slot_bytes"] * slots + constants["smem_header_bytes"]
    tiles = 4 * (constants["threads"] // 32) * 32 * words
    room = constants["smem_budget"] - fixed
    staged = min(fanout, budget + 1, (room - 32) // (8 * depth))
    if staged < 1 or tiles > room:
        raise ValueError(f"tree-build: K={depth}, V={fanout}, B={budget} does not fit the shared-memory budget")
    build = 2 * _staged_bytes(depth, staged)
    pool = ranked = 0
    if (budget >= select_min_budget(constants) and staged == min(fanout, budget + 1)
            and staged <= constants["select_max_fanout"]):
        ranked = max(2 * slots, SELECT_MIN_RANKED)
        per_pool, per_ranked = constants["smem_select_bytes_per_cap"], constants["smem_select_bytes_per_ranked"]
        scratch = lambda pool_entries: (constants["smem_select_fixed_bytes"] + per_pool * pool_entries
                                        + per_ranked * ranked)
        pool = min(SELECT_MAX_POOL, max(SELECT_POOL_PER_SLOT * slots, SELECT_MIN_POOL))
        if build + scratch(pool) > room:
            pool = ranked                                  # two passes
        if build + scratch(pool) <= room:
            build += scratch(pool)
        else:
            pool = ranked = 0
    return npl, staged, pool, ranked, fixed + max(build, tiles)


def workspace_nbytes(shapes: dict, params: dict) -> int:
    return 0


def launch(module, inputs: dict, params: dict, outputs: dict, workspace) -> None:
    top_logp = inputs["top_logp"]
    top_ids = inputs["top_ids"]
    budget = int(params["budget"])
    groups, depth, fanout = (int(x) for x in top_logp.shape)

    constants = kernel_constants(module, _PREFIX, _CONSTANTS)
    if not 1 <= budget <= constants["max_budget"]:
        raise ValueError(f"tree-build: budget must be in [1, {constants['max_budget']}], got {budget}")
    if not 1 <= depth <= constants["max_depth"]:
        raise ValueError(f"tree-build: K must be in [1, {constants['max_depth']}], got {depth}")
    if not 1 <= fanout <= constants["max_fanout"]:
        raise ValueError(f"tree-build: V must be in [1, {constants['max_fanout']}], got {fanout}")
    if tuple(top_ids.shape) != (groups, depth, fanout):
        raise ValueError(f"tree-build: top_ids shape {tuple(top_ids.shape)} != top_logp shape {top_logp.shape}")
    if top_logp.dtype != np.float32 or top_ids.dtype != np.int32:
        raise ValueError("tree-build: top_logp must be float32 and top_ids int32")
    if groups == 0:
        return

    npl, staged, pool, ranked, smem = smem_layout(depth, fanout, budget, constants)
    # Ranks up to B are the most a build can read; the _g variant reads those past Vs from global memory.
    if staged < min(fanout, budget + 1):
        name = f"{_PREFIX}p{npl}_g"
    else:
        name = f"{_PREFIX}p{npl}" + ("_select" if pool else "")
    function = kernel_function(module, name, smem)

    function(
        (groups,),
        (constants["threads"],),
        (
            top_logp,
            top_ids,
            np.int32(depth),
            np.int32(fanout),
            np.int32(budget),
            np.int32(staged),
            np.int32(pool),
            np.int32(ranked),
            outputs["n_nodes"],
            outputs["parent"],
            outputs["depth"],
            outputs["token"],
            outputs["rank"],
            outputs["logw"],
            outputs["first_child"],
            outputs["next_sibling"],
            outputs["mask"],
        ),
        shared_mem=smem,
    )
