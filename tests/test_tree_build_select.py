"""The tree-build kernel's select path, modelled in numpy step for step (bins, the rising threshold bin, the
one-pass pool, ranking inside a bin with the ancestor-chain tie-break), against the heapq reference.

The model is the argument of plans/design.md ("tree-build: when best-first is a sort") made executable on the
CPU, so CI checks the algorithm on many inputs (ties, zero log-probs, -inf, budgets past the number of paths);
the GPU tests check the kernel against the reference on the same kinds of input."""

from __future__ import annotations

import numpy as np
import pytest

from kdt.stages.tree_build import drafter_topk
from kdt.refs.tree_build import build_one

BINS = 2048                 # kernels/tree_build/layout.cuh: kBins
BIN_LOW = 123 << 7          # bits 30..16 of 2^-4: kBinLow


def score_bin(score: np.float32) -> int:
    bits = (int(np.float32(score).view(np.uint32)) >> 16) & 0x7FFF
    return BINS - 1 - (min(max(bits, BIN_LOW), BIN_LOW + BINS - 1) - BIN_LOW)


WIDE = 32                   # kSelectNarrowFanout: past it a level that overflows the pool is retried
ESTIMATE_CELLS = 128        # kernels/tree_build/select.cuh: kEstimateCells
ESTIMATE_DEPTHS = BINS // ESTIMATE_CELLS


def estimated_bin(top_logp: np.ndarray, budget: int) -> int:
    """The wide kind's first threshold bin, as `wide_estimated_bin` computes it in float32: log-probs rounded down
    to a grid of cells, the paths counted by their cell sums (a convolution, capped at the budget), one bin below
    the pessimistic score of the budget-th path; 0 where the grid holds fewer paths."""
    max_depth = top_logp.shape[0]
    fanout = min(top_logp.shape[1], budget + 1)         # the kernel's lps.fanout
    low, paths_to_depth, layer, depth = np.float32(0.0), 0, 1, 0
    while paths_to_depth < budget and depth < max_depth:
        low = np.float32(low + top_logp[depth, fanout - 1])
        layer = min(layer * fanout, budget)
        paths_to_depth += layer
        depth += 1
    if paths_to_depth < budget or not low < 0 or low == -np.inf:
        return 0
    inv_width = np.float32(np.float32(ESTIMATE_CELLS - 2) / np.float32(-low))
    paths = np.zeros(ESTIMATE_CELLS, np.int64)
    paths[0] = 1
    counted = np.zeros(ESTIMATE_CELLS, np.int64)
    for depth in range(min(max_depth, ESTIMATE_DEPTHS)):
        with np.errstate(invalid="ignore", over="ignore"):
            q = (-top_logp[depth, :fanout]).astype(np.float32) * inv_width
        cells = np.bincount(q[q < ESTIMATE_CELLS - 1].astype(np.int64) + 1, minlength=ESTIMATE_CELLS)
        paths = np.minimum(np.convolve(paths, cells)[:ESTIMATE_CELLS], budget)
        counted += paths
    reach = np.nonzero(np.cumsum(counted) >= budget)[0]
    if not len(reach):
        return 0
    return max(score_bin(np.float32(-np.float32(reach[0]) / inv_width)) - 1, 0)


def select_build(top_logp: np.ndarray, budget: int, capacity: int | None = None,
                 raises: list | None = None, estimate: bool = True) -> list[tuple[int, int, int, np.float32]] | None:
    """The select path's taken nodes as (parent slot, depth, rank, score), or None where the kernel falls back
    to its serial loop (a positive log-prob, or a pool of `capacity` entries too small). Past WIDE, phase 1 starts
    at the estimated threshold (with `estimate`, the kernel's argument of that name), and a level that would
    overflow the pool raises the threshold first (appending each raise to `raises`)."""
    max_depth, fanout = top_logp.shape
    if (top_logp[np.isfinite(top_logp)] > 0).any():
        return None
    hist = np.zeros(BINS, np.int64)
    threshold = estimated_bin(top_logp, budget) if estimate and min(fanout, budget + 1) > WIDE else 0
    score, parent, rank = [], [], []         # the pool; parent -1 is the root
    level = [-1]
    def counted(depth: int, node: int, bin_floor: int) -> int:      # a prefix of the row
        base = np.float32(0.0) if node < 0 else score[node]
        r = 0
        while r < fanout:
            child = np.float32(base + top_logp[depth, r])
            if child == -np.inf or score_bin(child) < bin_floor:
                break
            r += 1
        return r

    for depth in range(max_depth):           # phase 1, one-pass layout
        if capacity is not None and len(score) + sum(counted(depth, n, threshold) for n in level) > capacity:
            if fanout <= WIDE:
                return None
            lo, hi = threshold, BINS         # the highest bin with `budget` paths at or above it
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if hist[mid:].sum() + sum(counted(depth, n, mid) for n in level) >= budget:
                    lo = mid
                else:
                    hi = mid
            if lo == threshold:
                return None
            threshold = lo
            if raises is not None:
                raises.append((depth, threshold))
            if len(score) + sum(counted(depth, n, threshold) for n in level) > capacity:
                return None
        children = []
        for node in level:
            base = np.float32(0.0) if node < 0 else score[node]
            for r in range(counted(depth, node, threshold)):
                child = np.float32(base + top_logp[depth, r])
                hist[score_bin(child)] += 1
                children.append(len(score))
                score.append(child), parent.append(node), rank.append(r)
        counted_above = np.cumsum(hist[::-1])[::-1]          # paths with bin >= b
        reach = np.nonzero(counted_above >= budget)[0]
        threshold = int(reach[-1]) if len(reach) else 0
        level = children
        if not level:
            break

    def before(f: int, e: int) -> bool:      # the kernel's select_before
        if score[f] != score[e]:
            return score[f] > score[e]
        while True:
            pf, pe = parent[f], parent[e]
            if pf == pe:
                return rank[f] < rank[e]
            if pf < 0 or pe < 0:
                return pf < 0
            if score[pf] != score[pe]:
                return score[pf] > score[pe]
            f, e = pf, pe

    ranked = [e for e in range(len(score)) if score_bin(score[e]) >= threshold]   # phase 3
    by_bin: dict[int, list[int]] = {}
    for e in ranked:
        by_bin.setdefault(score_bin(score[e]), []).append(e)
    slot_of = {}
    for e in ranked:
        b = score_bin(score[e])
        position = int(hist[b + 1:].sum()) + sum(before(f, e) for f in by_bin[b] if f != e)
        if position < budget:
            slot_of[e] = position + 1
    taken: list = [None] * len(slot_of)
    for e, slot in slot_of.items():
        parent_slot = 0 if parent[e] < 0 else slot_of[parent[e]]
        assert parent_slot < slot
        if rank[e] > 0:  # the previous sibling is the entry just before, taken earlier
            assert parent[e - 1] == parent[e] and rank[e - 1] == rank[e] - 1 and slot_of[e - 1] < slot
        depth, node = 1, parent[e]
        while node >= 0:
            depth, node = depth + 1, parent[node]
        taken[slot - 1] = (parent_slot, depth, rank[e], score[e])
    return taken


def _inputs(rng: np.random.Generator) -> tuple[np.ndarray, int]:
    depth = int(rng.choice([1, 2, 3, 7, 15]))
    fanout = int(rng.choice([1, 2, 3, 8, 8, 33, 64]))      # past 32: the kernel's wide kind
    budget = int(rng.choice([1, 2, 7, 16, 63, int(rng.integers(1, 200))]))
    style = rng.choice(["drafter", "grid", "zeros", "flat"])
    if style == "drafter":
        lp = drafter_topk(rng, 1, depth, fanout, confidence=float(rng.uniform(0, 20)))[0][0]
    elif style == "flat":
        lp = np.full((depth, fanout), np.float32(np.log(np.float32(1 / 4096))), np.float32)
    else:   # exact ties on a 0.25 grid, with zero log-probs (a child tying its parent) in "zeros"
        lp = np.sort(np.round(rng.uniform(-4, 0, (depth, fanout)) * 4) / 4, axis=1)[:, ::-1]
        if style == "zeros":
            lp[:, 0] = 0.0
    lp = np.ascontiguousarray(lp, np.float32)
    if rng.random() < 0.3:
        cut = rng.integers(0, fanout + 1, depth)
        lp[np.arange(fanout)[None, :] >= cut[:, None]] = -np.inf
    return lp, budget


@pytest.mark.parametrize("estimate", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_select_model_matches_reference(seed, estimate):
    rng = np.random.default_rng(9000 + seed)
    for _ in range(5):
        lp, budget = _inputs(rng)
        expected = build_one(lp, budget)
        got = select_build(lp, budget, estimate=estimate)
        assert got is not None
        assert [t[:3] for t in got] == [t[:3] for t in expected]
        assert [np.float32(t[3]).tobytes() for t in got] == [np.float32(t[3]).tobytes() for t in expected]


def test_select_model_raises_the_threshold_when_a_wide_level_overflows():
    """A pool of four times the budget: wide levels that would overflow it raise the threshold first, and the
    result is still the reference's; the raise must have happened (else this proves nothing)."""
    rng = np.random.default_rng(9100)
    raises, checked = [], 0
    for _ in range(100):
        lp, budget = _inputs(rng)
        if lp.shape[1] <= WIDE:
            continue
        got = select_build(lp, budget, capacity=4 * budget + 32, raises=raises)
        if got is None:
            continue
        expected = build_one(lp, budget)
        assert [t[:3] for t in got] == [t[:3] for t in expected]
        assert [np.float32(t[3]).tobytes() for t in got] == [np.float32(t[3]).tobytes() for t in expected]
        checked += 1
    assert checked >= 10 and len(raises) >= 5, (checked, len(raises))


def test_select_model_falls_back_on_positive_log_probs():
    assert select_build(np.array([[0.5, -1.0]], np.float32), 2) is None


def test_bins_are_monotone_in_the_score():
    scores = np.sort(np.concatenate([-np.logspace(-8, 5, 4000), [0.0]])).astype(np.float32)
    bins = [score_bin(s) for s in scores]
    assert all(a <= b for a, b in zip(bins, bins[1:]))
    assert bins[0] == 0 and bins[-1] == BINS - 1


def _budget_th_bin(top_logp: np.ndarray, budget: int) -> int | None:
    taken = build_one(top_logp, budget)
    return score_bin(min(t[3] for t in taken)) if len(taken) == budget else None


@pytest.mark.parametrize("fanout,budget", [(64, 64), (64, 1023), (256, 256), (1024, 1023)])
def test_estimated_bin_is_below_the_budget_th_path_and_close_to_it(fanout, budget):
    """On drafter rows the estimate must never pass the bin of the budget-th best path (it would drop a node) and
    must be within a few bins of it (else phase 1 counts thousands of paths, what the estimate is for)."""
    top_logp, _ = drafter_topk(np.random.default_rng(fanout + budget), 6, 7, fanout)
    for lp in top_logp:
        target = _budget_th_bin(lp, budget)
        got = estimated_bin(lp, budget)
        assert 0 < got <= target <= got + 10, (got, target)


def test_estimated_bin_stays_below_the_budget_th_path_on_ties_and_dead_tails():
    rng = np.random.default_rng(9200)
    estimated = 0
    for _ in range(800):
        lp, budget = _inputs(rng)
        if min(lp.shape[1], budget + 1) <= WIDE:
            continue
        target = _budget_th_bin(lp, budget)
        got = estimated_bin(lp, budget)
        if target is None:      # fewer finite paths than the budget: no bin has enough
            assert got == 0
            continue
        assert got <= target, (got, target)
        estimated += got > 0
    assert estimated >= 20, estimated
