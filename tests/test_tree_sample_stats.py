"""tree-sample's kernel against the distributions it must sample (issue 18), on the GPU: 10^5 single draws per
setting binned against the filtered softmax (tokens masked or filtered out never drawn), and 10^5 walks of a chain
and of a branching tree binned against the products of the target's filtered probabilities along their paths. Each
request is one independent draw (its own seed and position); the first CHECKED are also compared one by one with
the reference wherever its draws are decisive. The same statistics of the reference run on the CPU in
test_tree_sample_ref.py."""

from __future__ import annotations

import numpy as np
import pytest

from kdt.dtypes import to_bf16
from kdt.refs.tree_sample import EPS, tree_sample
from tests.sampling_stats import (accept_len_probs, assert_walks_follow_the_path_products, assert_within_six_sigma,
                                  filtered_probs, tree_arrays, walk_outcomes)

pytestmark = pytest.mark.gpu

DRAWS = 100_000
CHECKED = 4096          # requests also compared with the reference draw for draw
EDGE_CLEARANCE = 10 * EPS   # how far every cumulative probability stays from top_p: ten times the contract's
                            # knife-edge band, where a float32 kernel may keep one token more or less
TREE_INPUTS = ("token", "first_child", "next_sibling", "n_nodes")
SAMPLING_INPUTS = ("temperature", "top_k", "top_p", "seed", "position")


def sampling_params(count: int, temperature: float, top_k: int, top_p: float) -> dict[str, np.ndarray]:
    """The per-request inputs: the same filter for all, a seed each (spread over 2^64, both key words and the top
    bit in play) and positions that cross 2^32 (both counter words in play)."""
    golden = np.uint64(0x9E3779B97F4A7C15)
    return {"temperature": np.full(count, temperature, np.float32), "top_k": np.full(count, top_k, np.int32),
            "top_p": np.full(count, top_p, np.float32),
            "seed": np.uint64(2**63) + np.arange(count, dtype=np.uint64) * golden,  # wraps around 2^64
            "position": (2**32 - count // 2 + np.arange(count)).astype(np.int64)}


def logits_as(rows: np.ndarray, dtype: str) -> np.ndarray:
    """float32 rows as the kernel is given them; bf16 only for values it holds exactly (the expected
    distributions are computed from the float32 values)."""
    if dtype == "float32":
        return rows
    bf16 = to_bf16(rows)
    assert np.array_equal(bf16.astype(np.float32), rows), "logits not exact in bf16"
    return bf16


def on_gpu(tree: dict[str, np.ndarray], rows: np.ndarray, params: dict[str, np.ndarray],
           max_depth: int, knobs: dict | None = None) -> dict[str, np.ndarray]:
    """kdt.ops.tree_sample on every request of `tree` (host arrays [G, N]), each with the same logits `rows`
    [N, vocab] (float32 or bf16, repeated on the device) -> the outputs, on the host."""
    import cupy as cp

    from kdt import ops

    groups, bf16 = tree["token"].shape[0], rows.dtype != np.float32
    device_rows = cp.asarray(rows.view(np.uint16) if bf16 else rows)   # bf16 travels as its bits
    logits = cp.ascontiguousarray(cp.broadcast_to(device_rows, (groups, *rows.shape)))
    device = {name: cp.asarray(array) for name, array in {**tree, **params}.items()}
    out = ops.tree_sample(*(device[name] for name in TREE_INPUTS), max_depth, ops.Bf16(logits) if bf16 else logits,
                          *(device[name] for name in SAMPLING_INPUTS), knobs=knobs)
    return {name: cp.asnumpy(array) for name, array in out._asdict().items()}


def assert_decisive_walks_match_the_reference(out, tree, rows, params, max_depth) -> None:
    """The first CHECKED requests, walk for walk: equal to the reference wherever all its draws are decisive (the
    contract's exactness), and most are."""
    first = {name: array[:CHECKED] for name, array in {**tree, **params}.items()}
    logits = np.broadcast_to(rows, (CHECKED, *rows.shape))
    want = tree_sample(*(first[name] for name in TREE_INPUTS), max_depth, logits,
                       *(first[name] for name in SAMPLING_INPUTS))
    decisive = want["decisive"]
    assert decisive.mean() > 0.95, f"only {decisive.mean():.1%} of the walks decisive: the logits are on an edge"
    for name in ("accept_len", "accept_index", "accept_tokens"):
        got = out[name][:CHECKED]
        wrong = np.flatnonzero((got != want[name]).reshape(CHECKED, -1).any(axis=1) & decisive)
        assert not wrong.size, (f"{name} of request {wrong[0]}: {got[wrong[0]].tolist()}, the reference "
                                f"{want[name][wrong[0]].tolist()} ({wrong.size} decisive walks differ)")


def top_p_clearance(row: np.ndarray, temperature: float, top_k: int, top_p: float) -> float:
    """min |C_{j-1} - top_p| over the tokens kept by top-k (C_{j-1}: the probability of the more probable ones):
    the expected kept set is the kernel's only when no cumulative probability is within rounding of top_p."""
    if np.float32(top_p) >= 1:
        return np.inf
    probs = filtered_probs(row, temperature, top_k, 1.0)
    ordered = np.sort(probs[probs > 0])[::-1]
    return float(np.abs(np.cumsum(ordered) - ordered - float(np.float32(top_p))).min())


# --- single draws ------------------------------------------------------------------------------------------------

VOCAB = 256
HEAD = [3.0, 2.25, 2.25, 1.5, 1.0, 0.5, 0.5, -0.25]   # two pairs of equal logits: top-k 6 cuts the second pair
MASKED = 24


def single_draw_logits() -> np.ndarray:
    """float32 [1, VOCAB]: HEAD at ids scattered over the vocabulary, MASKED ids at -inf, and a bulk around -4
    quantised to 1/8 (equal logits again, exact in bf16)."""
    rng = np.random.default_rng(18)
    row = np.round(rng.normal(-4.0, 0.8, VOCAB) * 8) / 8
    ids = rng.permutation(VOCAB)
    row[ids[:len(HEAD)]] = HEAD
    row[ids[len(HEAD):len(HEAD) + MASKED]] = -np.inf
    return row.astype(np.float32)[None, :]


@pytest.mark.parametrize("temperature, top_k, top_p, dtype", [
    (1.0, 0, 1.0, "float32"),        # temperature only: every unmasked token has a chance
    (2.0, 0, 1.0, "bfloat16"),
    (0.8, 6, 1.0, "float32"),        # top-k: of the equal 0.5 pair only the smaller id is kept
    (1.0, 0, 0.8, "float32"),        # top-p
    (1.3, 40, 0.95, "float32"),      # both: top-k cuts inside the bulk, top-p cuts it again
    (0.7, 20, 0.9, "bfloat16"),
])
def test_single_draws_follow_the_filtered_softmax(temperature, top_k, top_p, dtype):
    rows = single_draw_logits()
    probs = filtered_probs(rows[0], temperature, top_k, top_p)
    assert np.count_nonzero(probs > 0.01) >= 4   # several probabilities worth testing
    dropped = int((probs == 0).sum())
    assert dropped > MASKED if top_k or top_p < 1 else dropped == MASKED   # the filters drop unmasked tokens too
    assert top_p_clearance(rows[0], temperature, top_k, top_p) > EDGE_CLEARANCE
    tree = tree_arrays({}, [0], DRAWS)   # one slot, no children: the walk is one draw, its bonus token
    params = sampling_params(DRAWS, temperature, top_k, top_p)
    logits = logits_as(rows, dtype)
    out = on_gpu(tree, logits, params, max_depth=1)
    assert (out["accept_len"] == 0).all() and (out["accept_index"] == [0, -1]).all()
    assert (out["accept_tokens"][:, 1] == -1).all()
    assert_within_six_sigma(np.bincount(out["accept_tokens"][:, 0], minlength=VOCAB), probs, DRAWS)
    assert_decisive_walks_match_the_reference(out, tree, logits, params, max_depth=1)


# --- walks: accepted lengths ---------------------------------------------------------------------------------------

WALK_VOCAB = 64
#   0 -> 1 -> 2 -> 3 -> 4, tokens 5, 17, 5, 40: every length 0..4 has a path
CHAIN = ({0: [1], 1: [2], 2: [3], 3: [4]}, [0, 5, 17, 5, 40])
#          0               siblings listed out of slot order (as other builders do);
#       /  |  \            slot 2 repeats slot 1's token: never accepted;
#     3(2) 1(11) 2(11)     slot 9 at depth 5 > K = 4: never accepted
#    / \   |
#  4(11) 5(9) 6(2)
#  |
#  7(45) -> 8(3) -> 9(60)
BRANCHING = ({0: [3, 1, 2], 3: [4, 5], 1: [6], 4: [7], 7: [8], 8: [9]}, [7, 11, 11, 2, 11, 9, 2, 45, 3, 60])
WALK_DEPTH = 4
LEAD, RIVAL = 5.0, WALK_VOCAB - 1


def walk_logits(children: dict[int, list[int]], tokens: list[int]) -> np.ndarray:
    """float32 [N, WALK_VOCAB]: a standard normal bulk quantised to 1/4; in each row the slot's children's tokens
    LEAD above it (less for later siblings) and RIVAL, a token no child carries, just below: each draw accepts a
    child or stops with about even odds, under any filter, so every accepted length counts."""
    rng = np.random.default_rng(len(tokens))
    rows = np.round(rng.standard_normal((len(tokens), WALK_VOCAB)) * 4) / 4
    rows[:, RIVAL] = LEAD - 0.5
    for slot, kids in children.items():
        for rank, child in enumerate(kids):  # a repeated token keeps its first sibling's lead
            rows[slot, tokens[child]] = max(rows[slot, tokens[child]], LEAD - rank)
    return rows.astype(np.float32)


@pytest.mark.parametrize("shape", ["chain", "branching"])
@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.8, 8, 1.0), (1.2, 0, 0.75), (0.7, 5, 0.9)])
def test_accepted_lengths_follow_the_path_products(shape, temperature, top_k, top_p):
    children, tokens = CHAIN if shape == "chain" else BRANCHING
    rows = walk_logits(children, tokens)
    q = [filtered_probs(row, temperature, top_k, top_p) for row in rows]
    assert all(top_p_clearance(row, temperature, top_k, top_p) > EDGE_CLEARANCE for row in rows)
    expected = walk_outcomes(children, tokens, WALK_DEPTH, q)
    assert abs(sum(expected.values()) - 1) < 1e-12
    assert (accept_len_probs(children, expected, WALK_DEPTH) > 0.01).all()  # every length is tested
    tree = tree_arrays(children, tokens, DRAWS)
    params = sampling_params(DRAWS, temperature, top_k, top_p)
    out = on_gpu(tree, rows, params, WALK_DEPTH)
    assert_walks_follow_the_path_products(out, children, WALK_DEPTH, expected)
    assert_decisive_walks_match_the_reference(out, tree, rows, params, WALK_DEPTH)


# --- pointer structures that are not trees, on the every-slot path -------------------------------------------------
# The walk follows the pointers as written. The every-slot path draws each slot at its least depth (the depths by
# pointer jumping on a tree, by relaxation otherwise), so where the walk reaches a slot at another depth it must
# draw it again there; slots it cannot reach are never drawn for it.
#   two_ways:  0 -> 1 -> 2 -> 3 -> 4, and 6 (1's next sibling) -> 3: slot 3 at depth 2 through 6, at 3 through 2
#   cut_off:   0 -> 1 -> 2 -> 3, and 4, 5 each other's next sibling, reachable from nowhere (a tree otherwise)
NOT_TREES = {
    "two_ways": ({0: [1, 6], 1: [2], 2: [3], 6: [3], 3: [4]}, [0, 5, 17, 9, 40, 0, 23], lambda out: (
        out["accept_index"][:, 1:4] == [1, 2, 3]).all(axis=1)),
    "cut_off": ({0: [1], 1: [2], 2: [3]}, [0, 5, 17, 9, 40, 41], lambda out: out["accept_len"] == 3),
}
EVERY_SLOT = {"every_slot_blocks_per_sm": 1 << 20}   # the every-slot path at any G


@pytest.mark.parametrize("structure", list(NOT_TREES))
def test_pointer_structures_that_are_not_trees_walk_as_written(structure):
    children, tokens, reached = NOT_TREES[structure]
    rows = walk_logits(children, tokens)
    tree = tree_arrays(children, tokens, CHECKED)
    if structure == "cut_off":
        tree["next_sibling"][:, 4], tree["next_sibling"][:, 5] = 5, 4
    params = sampling_params(CHECKED, 1.0, 0, 1.0)
    out = on_gpu(tree, rows, params, WALK_DEPTH + 2, knobs=EVERY_SLOT)
    assert reached(out).mean() > 0.02, "too few walks reach the case the structure is about"
    assert_decisive_walks_match_the_reference(out, tree, rows, params, WALK_DEPTH + 2)

