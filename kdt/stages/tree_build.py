"""`tree-build`: spec, golden cases and launch-time layout checks."""

from __future__ import annotations

import numpy as np

import kdt.refs.tree_build as reference
from kdt.compare import Exact
from kdt.spec import Case, OutputLayout, StageSpec
from kdt.stages._util import drafter_logits, quantised_logits, require_layout, require_same
from kdt.refs.errors import BadInput
from kdt.refs.topk import topk

OUTPUTS = ("n_nodes", "parent", "depth", "token", "rank", "logw", "first_child", "next_sibling", "mask")
DRAFT_VOCAB = 4096


def drafter_topk(rng: np.random.Generator, groups: int, depth: int, fanout: int,
                 confidence: float = 4.0) -> tuple[np.ndarray, np.ndarray]:
    """(top_logp, top_ids) as the `topk` stage would hand them over for a drafter's logits."""
    out = topk(drafter_logits(rng, groups, depth, max(DRAFT_VOCAB, fanout), confidence), fanout)
    return out["top_logp"], out["top_ids"]


def _case(name, description, seed, budget, top_logp, top_ids) -> Case:
    return Case(name, description, seed, {"budget": budget},
                {"top_logp": np.ascontiguousarray(top_logp, np.float32),
                 "top_ids": np.ascontiguousarray(top_ids, np.int32)})


def make_cases() -> list[Case]:
    cases = []
    rng = np.random.default_rng

    for seed, (groups, depth, fanout, budget) in enumerate(
            [(4, 7, 8, 7), (4, 7, 8, 31), (4, 15, 8, 63), (8, 15, 8, 255), (2, 15, 8, 1023)], start=201):
        lp, ids = drafter_topk(rng(seed), groups, depth, fanout)
        cases.append(_case(f"drafter_k{depth}_v{fanout}_b{budget}",
                           f"real drafter shape: G={groups}, K={depth}, V={fanout}, B={budget}",
                           seed, budget, lp, ids))

    g = rng(210)
    lp = np.sort(np.round(g.uniform(-6, 0, (3, 6, 8)) * 2) / 2, axis=2)[:, :, ::-1].astype(np.float32)
    lp[:, :, 0] = 0.0  # many exactly tied scores along and across paths
    cases.append(_case("exact_ties", "log-probs on a 0.5 grid with zeros: ties resolved by parent slot, then rank",
                       210, 40, lp, g.integers(0, 50000, lp.shape)))

    lp, ids = drafter_topk(rng(211), 3, 5, 8)
    lp[0, :, 2:] = -np.inf
    lp[0, 3:, 1:] = -np.inf  # 2 + 4 + 8 + 8 + 8 = 30 finite paths < B
    lp[1, 2, 1:] = -np.inf
    lp[2, 0, :] = -np.inf  # the whole first position masked: the tree is empty
    cases.append(_case("neg_inf_entries", "-inf log-probs: never taken, trees smaller than B, one empty tree",
                       211, 60, lp, ids))

    lp, ids = drafter_topk(rng(212), 2, 15, 1)
    cases.append(_case("v1_chain", "V=1: the tree is a chain of depth min(B, K)", 212, 10, lp, ids))

    lp, ids = drafter_topk(rng(213), 2, 1, 8)
    cases.append(_case("k1_star", "K=1: every node is a child of the root", 213, 5, lp, ids))

    lp, ids = drafter_topk(rng(214), 2, 2, 3)
    cases.append(_case("budget_beyond_paths", "B=50 but only 3 + 9 paths exist: every path taken", 214, 50, lp, ids))

    lp, ids = drafter_topk(rng(215), 3, 7, 8)
    cases.append(_case("b1", "B=1: one node, the best first token", 215, 1, lp, ids))

    lp, ids = drafter_topk(rng(216), 1, 15, 8)
    cases.append(_case("g1_k15_v8_b63", "G=1", 216, 63, lp, ids))

    lp, ids = drafter_topk(rng(217), 4, 7, 8)
    confident, _ = drafter_topk(rng(2170), 1, 7, 8, confidence=12.0)
    flat = np.full((1, 7, 8), np.float32(np.log(np.float32(1 / 4096))), np.float32)
    lp[0], lp[1] = confident[0], flat[0]
    lp[2, 3:, 2:] = -np.inf
    cases.append(_case("mixed_batch", "one batch: a confident drafter, a flat one (all ties), a masked one, a typical one",
                       217, 48, lp, ids))

    lp, ids = drafter_topk(rng(218), 2, 4, 64)
    cases.append(_case("v_equals_budget_64", "V = B = 64: the original DDTree fan-out top-k = min(budget, vocab)",
                       218, 64, lp, ids))
    lp, ids = drafter_topk(rng(219), 1, 3, 255)
    cases.append(_case("v_equals_budget_255", "V = B = 255 at K=3", 219, 255, lp, ids))

    lp, ids = drafter_topk(rng(220), 1, 64, 2)
    lp[:, :, 0] = np.float32(-1e-3)  # a near-certain chain reaches the full depth before any sibling
    lp[:, :, 1] = np.minimum(lp[:, :, 1], np.float32(-4.0))
    cases.append(_case("k64_deep", "K=64, the deepest draft: the chain reaches depth 64, V=2, B=200", 220, 200,
                       lp, ids))

    g = rng(221)
    lp = np.sort(g.uniform(-1.0, 2.0, (2, 6, 5)), axis=2)[:, :, ::-1].astype(np.float32)
    cases.append(_case("positive_scores", "unnormalised scores above 0: children can outscore parents", 221, 30,
                       lp, g.integers(0, 1000, lp.shape)))

    # wide fan-out from a quantised vocabulary: hundreds of equal log-probs per position (ties by parent, rank)
    out = topk(quantised_logits(rng(222), 1, 7, 16384), 1024)
    cases.append(_case("wide_v1024_b1023_quantised", "V=1024, B=1023, K=7 from integer logits: runs of hundreds "
                       "of equal log-probs", 222, 1023, out["top_logp"], out["top_ids"]))
    out = topk(quantised_logits(rng(223), 2, 3, 32768), 256)
    cases.append(_case("wide_v256_b255_quantised", "V=B=255..256 at K=3 from integer logits", 223, 255,
                       out["top_logp"], out["top_ids"]))
    lp, ids = drafter_topk(rng(224), 2, 7, 256)
    cases.append(_case("wide_v256_b1023_drafter", "V=256, B=1023, K=7: the second level would hold 65,536 paths, "
                       "so the select path raises its threshold within the level", 224, 1023, lp, ids))
    lp, ids = drafter_topk(rng(225), 2, 7, 64)
    cases.append(_case("wide_v64_b1023_drafter", "V=64, B=1023, K=7: 4,096 paths at the second level", 225, 1023,
                       lp, ids))
    return cases


def random_case(rng: np.random.Generator) -> Case:
    """Random shape within the limits: ties (a 0.25 grid, or the top V of a quantised vocabulary), -inf, V=1,
    K=1, K up to 64, V up to 1024, B up to 1023, budgets at and beyond the number of paths, now and then scores
    above zero."""
    groups = int(rng.integers(1, 9))
    depth = int(rng.choice([1, 2, 3, 7, 15, 33, 64]))
    fanout = int(rng.choice([1, 2, 3, 8, 8, 17, 64, 255, 1024]))
    budget = int(rng.choice([1, 2, 7, 16, 63, 255, 511, 1023, int(rng.integers(1, 1024))]))
    style = rng.choice(["drafter", "grid", "positive", "quantised"])
    if style == "drafter":
        lp, ids = drafter_topk(rng, groups, depth, fanout, confidence=float(rng.uniform(0, 20)))
    elif style == "quantised":  # the top V of integer logits: runs of equal log-probs as long as V
        out = topk(quantised_logits(rng, groups, depth, 4 * fanout + 64), fanout)
        lp, ids = out["top_logp"], out["top_ids"]
    else:
        low, high = (-4.0, 0.0) if style == "grid" else (-1.0, 1.0)
        lp = np.sort(np.round(rng.uniform(low, high, (groups, depth, fanout)) * 4) / 4, axis=2)[:, :, ::-1]
        ids = rng.integers(0, 200000, lp.shape)
    lp = np.ascontiguousarray(lp, np.float32)
    if rng.random() < 0.3:  # -inf tails
        cut = rng.integers(0, fanout + 1, (groups, depth))
        lp[np.arange(fanout)[None, None, :] >= cut[:, :, None]] = -np.inf
    seed = int(rng.integers(0, 2**31))
    return _case(f"random_{seed}", f"random G={groups} K={depth} V={fanout} B={budget} ({style})", seed, budget,
                 lp, ids)


def shrink_case(case: Case):
    """Smaller variants of a failing case, for `kdt fuzz`: one request, a smaller budget B, fewer
    positions K (axis 1), fewer ranks V (axis 2; a prefix of a non-increasing row stays non-increasing)."""
    from kdt.fuzz import batch_variants, smaller_sizes, with_inputs

    yield from batch_variants(case)
    lp, ids, budget = case.inputs["top_logp"], case.inputs["top_ids"], int(case.params["budget"])
    _, depth, fanout = lp.shape
    for smaller in smaller_sizes(budget):
        yield with_inputs(case, {"budget": smaller})
    for positions in smaller_sizes(depth):
        yield with_inputs(case, top_logp=lp[:, :positions], top_ids=ids[:, :positions])
    for ranks in smaller_sizes(fanout):
        yield with_inputs(case, top_logp=lp[:, :, :ranks], top_ids=ids[:, :, :ranks])


def output_layout(shapes, params) -> dict[str, OutputLayout]:
    groups = shapes["top_logp"][0]
    slots = int(params["budget"]) + 1
    layout = {name: OutputLayout((groups, slots), "int32") for name in OUTPUTS}
    layout["n_nodes"] = OutputLayout((groups,), "int32")
    layout["logw"] = OutputLayout((groups, slots), "float32")
    layout["mask"] = OutputLayout((groups, slots, reference.mask_words(slots)), "uint32")
    return {name: layout[name] for name in OUTPUTS}


def check_layout(shapes, dtypes, params) -> None:
    groups, depth, fanout = require_layout(shapes, dtypes, "top_logp", 3, ("float32",))
    require_layout(shapes, dtypes, "top_ids", 3, ("int32",))
    require_same("top_ids", shapes["top_ids"], shapes["top_logp"])
    budget = params.get("budget")
    if not isinstance(budget, (int, np.integer)) or not 1 <= budget <= reference.MAX_BUDGET:
        raise BadInput("budget", f"an integer in [1, {reference.MAX_BUDGET}]", budget)
    if not 1 <= depth <= reference.MAX_DEPTH:
        raise BadInput("top_logp", f"K (axis 1) in [1, {reference.MAX_DEPTH}]", depth)
    if not 1 <= fanout <= reference.MAX_FANOUT:
        raise BadInput("top_logp", f"V (axis 2) in [1, {reference.MAX_FANOUT}]", fanout)
    if groups < 1:
        raise BadInput("top_logp", "at least one request (G >= 1)", groups)


def _bench_shape(groups: int, depth: int, fanout: int, budget: int):
    """G requests of drafter-like [K, V] log-probs (seeded by the budget), built with budget B."""
    from kdt.bench import BenchShape, upload_host

    def make(cp):
        lp, ids = drafter_topk(np.random.default_rng(budget), groups, depth, fanout)
        return upload_host(cp, {"top_logp": lp, "top_ids": ids})

    slots = budget + 1
    moved = groups * depth * fanout * 8 + groups * slots * (8 * 4 + reference.mask_words(slots) * 4) + groups * 4
    layout = {"top_logp": ((groups, depth, fanout), "float32"), "top_ids": ((groups, depth, fanout), "int32")}
    return BenchShape(f"G{groups}_K{depth}_V{fanout}_B{budget}", make, {"budget": budget}, layout, moved,
                      size=budget, size_label="budget B")


def bench_shapes(quick: bool, wide: bool = False):
    if wide:  # DDTree's own fan-out (issue 20): V up to the budget, B = V and B = 1023
        if quick:
            return [_bench_shape(64, 3, 255, 255), _bench_shape(64, 7, 1024, 1023)]
        return [_bench_shape(groups, 7, fanout, budget) for groups in (1, 8, 64) for fanout in (64, 256, 1024)
                for budget in sorted({min(fanout, 1023), 1023})]
    budgets = (16, 255) if quick else (16, 32, 64, 128, 255, 512, 1023)
    shapes = [_bench_shape(64, 15, 8, budget) for budget in budgets]
    if not quick:
        shapes += [_bench_shape(64, 3, 255, 255), _bench_shape(64, 7, 1024, 1023)]
    return shapes


def tp8_bench_shapes(quick: bool):
    """`--set tp8`: the deployment's small batches (issue 17): G in {1, 8}, B in {15, 31, 32, 48, 63} at K = 15,
    V = 8, where a step's latency is the product (target <= 6 us; --quick: B = 63 at both G)."""
    budgets = (63,) if quick else (15, 31, 32, 48, 63)
    return [_bench_shape(groups, 15, 8, budget) for groups in (1, 8) for budget in budgets]


def wide_bench_shapes(quick: bool):
    """`--set wide`: V in {64, 256, 1024} with B = V and B = 1023 at G in {1, 8, 64} (--quick: issue 20's two
    tree-build shapes)."""
    return bench_shapes(quick, wide=True)


SPEC = StageSpec(
    name="tree-build",
    position=2,
    params=("budget",),
    inputs=("top_logp", "top_ids"),
    outputs={name: Exact() for name in OUTPUTS},
    reference_module=reference,
    run_reference=lambda inputs, params: reference.tree_build(inputs["top_logp"], inputs["top_ids"],
                                                              params["budget"]),
    make_cases=make_cases,
    output_layout=output_layout,
    check_layout=check_layout,
    description="best-first draft tree with exact float32 path scores",
    random_case=random_case,
    shrink=shrink_case,
    bench_shapes=bench_shapes,
    bench_sets={"wide": wide_bench_shapes, "tp8": tp8_bench_shapes},
)
