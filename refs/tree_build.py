"""`tree-build`: the best-first draft tree, built with heapq (contract section `tree-build`)."""

from __future__ import annotations

import heapq

import numpy as np

from .errors import require, require_dtype, require_shape

MAX_BUDGET = 1023
MAX_DEPTH = 64
MAX_FANOUT = 1024
MASK_BITS = 32


def mask_words(slots: int) -> int:
    return (slots + MASK_BITS - 1) // MASK_BITS


def validate(top_logp: np.ndarray, top_ids: np.ndarray, budget: int) -> None:
    require_dtype(top_logp, "top_logp", np.float32)
    require_dtype(top_ids, "top_ids", np.int32)
    require_shape(top_logp, "top_logp", (None, None, None))
    require_shape(top_ids, "top_ids", top_logp.shape)
    _, depth, fanout = top_logp.shape
    require(isinstance(budget, (int, np.integer)) and 1 <= budget <= MAX_BUDGET, "budget",
            f"an integer in [1, {MAX_BUDGET}]", budget)
    require(1 <= depth <= MAX_DEPTH, "top_logp", f"K (axis 1) in [1, {MAX_DEPTH}]", depth)
    require(1 <= fanout <= MAX_FANOUT, "top_logp", f"V (axis 2) in [1, {MAX_FANOUT}]", fanout)
    require(not np.isnan(top_logp).any(), "top_logp", "no NaN", "NaN")
    # +inf is outside the contract's wording but would turn a later -inf step into a NaN score.
    require(not (top_logp == np.inf).any(), "top_logp", "no +inf (log-probabilities)", "+inf")
    if fanout > 1:
        rising = top_logp[:, :, 1:] > top_logp[:, :, :-1]
        if rising.any():
            g, d, r = (int(i) for i in np.argwhere(rising)[0])
            require(False, "top_logp", "every row non-increasing",
                    f"top_logp[{g}, {d}, {r + 1}] > top_logp[{g}, {d}, {r}]")


def build_one(top_logp: np.ndarray, budget: int) -> list[tuple[int, int, int, np.float32]]:
    """Best-first over one request's [K, V] log-probs: the taken nodes as (parent, depth, rank, score).

    The heap key is (-score, parent slot, rank): highest score first, ties to the smaller parent slot,
    then the smaller rank, exactly the contract's order. Scores are float32 with one rounding per add.
    """
    max_depth, fanout = top_logp.shape
    taken: list[tuple[int, int, int, np.float32]] = []
    slot_score = [np.float32(0.0)]
    slot_depth = [0]
    frontier = [(-float(top_logp[0, 0]), 0, 0)]
    while frontier and len(taken) < budget:
        negative_score, parent, rank = heapq.heappop(frontier)
        if negative_score == np.inf:  # every remaining candidate is -inf too: never taken
            break
        depth = slot_depth[parent] + 1
        score = np.float32(slot_score[parent] + top_logp[depth - 1, rank])
        taken.append((parent, depth, rank, score))
        slot = len(taken)
        slot_score.append(score)
        slot_depth.append(depth)
        if rank + 1 < fanout:
            sibling = np.float32(slot_score[parent] + top_logp[depth - 1, rank + 1])
            heapq.heappush(frontier, (-float(sibling), parent, rank + 1))
        if depth < max_depth:
            child = np.float32(score + top_logp[depth, 0])
            heapq.heappush(frontier, (-float(child), slot, 0))
    return taken


def tree_build(top_logp: np.ndarray, top_ids: np.ndarray, budget: int) -> dict[str, np.ndarray]:
    """top_logp float32 / top_ids int32 [G, K, V], budget B -> the contract's tree outputs, N = B + 1."""
    validate(top_logp, top_ids, budget)
    groups = top_logp.shape[0]
    slots = budget + 1
    words = mask_words(slots)
    out = {
        "n_nodes": np.zeros(groups, np.int32),
        "parent": np.full((groups, slots), -1, np.int32),
        "depth": np.full((groups, slots), -1, np.int32),
        "token": np.full((groups, slots), -1, np.int32),
        "rank": np.full((groups, slots), -1, np.int32),
        "logw": np.full((groups, slots), -np.inf, np.float32),
        "first_child": np.full((groups, slots), -1, np.int32),
        "next_sibling": np.full((groups, slots), -1, np.int32),
        "mask": np.zeros((groups, slots, words), np.uint32),
    }
    for g in range(groups):
        taken = build_one(top_logp[g], budget)
        out["n_nodes"][g] = len(taken)
        out["depth"][g, 0] = 0
        out["logw"][g, 0] = 0.0
        out["mask"][g, 0, 0] = 1
        last_child = {}
        for slot, (parent, depth, rank, score) in enumerate(taken, start=1):
            out["parent"][g, slot] = parent
            out["depth"][g, slot] = depth
            out["rank"][g, slot] = rank
            out["token"][g, slot] = top_ids[g, depth - 1, rank]
            out["logw"][g, slot] = score
            if parent in last_child:
                out["next_sibling"][g, last_child[parent]] = slot
            else:
                out["first_child"][g, parent] = slot
            last_child[parent] = slot
            out["mask"][g, slot] = out["mask"][g, parent]
            out["mask"][g, slot, slot // MASK_BITS] |= np.uint32(1 << (slot % MASK_BITS))
    return out
