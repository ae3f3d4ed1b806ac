"""tree-sample reference: Philox known answers, the uniforms' layout, greedy equals tree-accept, the sampled
distributions (single draws and whole walks) against the filtered softmax, decision margins against a float32
implementation, tree layouts, bf16, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdt.dtypes import to_bf16
from kdt.refs.errors import BadInput
from kdt.refs.tree_accept import tree_accept
from kdt.refs.tree_sample import EPS, philox4x32_10, sample, tree_sample, uniforms
from kdt.stages import tree_accept as accept_stage
from tests.sampling_stats import (accept_len_probs, assert_walks_follow_the_path_products, assert_within_six_sigma,
                                  filtered_probs, tree_arrays, walk_outcomes)

# Random123's known answers for philox4x32 with 10 rounds: tests/kat_vectors of
# https://github.com/DEShawResearch/random123 (commit 9545ff6413f258be2f04c1d319d99aaef7521150), the three
# "philox4x32 10" lines: counter (4 words), key (2 words), expected output (4 words). The first is the contract's.
PHILOX_KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]
HIGH_SEED = 0xDEADBEEFCAFEF00D  # >= 2^63: both key words matter, the top bit included
DRAWS = 100_000


def per_request(groups, temperature=1.0, top_k=0, top_p=1.0, seed=HIGH_SEED, position=0):
    """The five per-request parameter arrays, each a scalar broadcast or an array."""
    return {"temperature": np.broadcast_to(np.float32(temperature), (groups,)).astype(np.float32),
            "top_k": np.broadcast_to(np.int32(top_k), (groups,)).astype(np.int32),
            "top_p": np.broadcast_to(np.float32(top_p), (groups,)).astype(np.float32),
            "seed": np.broadcast_to(np.asarray(seed, np.uint64), (groups,)).astype(np.uint64),
            "position": np.broadcast_to(np.asarray(position, np.int64), (groups,)).astype(np.int64)}


def walk(tree, logits, max_depth, **params):
    groups = tree["token"].shape[0]
    return tree_sample(tree["token"], tree["first_child"], tree["next_sibling"], tree["n_nodes"], max_depth, logits,
                       **per_request(groups, **params))


def float32_draw(logits, temperature, top_k, top_p, u) -> int:
    """The contract as a float32 kernel might compute it (z, softmax, cumulative sums and scores in float32, ties
    by smaller id): decisive draws of the reference must agree with it."""
    z = (np.asarray(logits, np.float32) / np.float32(temperature)).astype(np.float32)
    ids = np.arange(len(z))
    kept = np.lexsort((ids, -z))
    kept = kept[:top_k] if top_k else kept
    weights = np.exp(z[kept] - z[kept].max()).astype(np.float32)
    probs = weights / weights.sum(dtype=np.float32)
    if top_p < 1:
        order = np.lexsort((kept, -probs))
        before = np.cumsum(probs[order], dtype=np.float32) - probs[order]
        kept = kept[order][before < np.float32(top_p)]
    score = z[kept] + (-np.log(-np.log(u[kept]))).astype(np.float32)
    return int(kept[score == score.max()].min())


# --- Philox and the uniforms -----------------------------------------------------------------------------------

@pytest.mark.parametrize("counter, key, expected", PHILOX_KAT)
def test_philox_known_answers(counter, key, expected):
    assert philox4x32_10(counter, key).tolist() == list(expected)


def test_philox_broadcasts_over_leading_axes():
    counters, keys, expected = (np.array(column) for column in zip(*PHILOX_KAT))
    assert (philox4x32_10(counters, keys) == expected).all()
    assert (philox4x32_10(counters, keys[2])[2] == expected[2]).all()


@pytest.mark.parametrize("seed", [0, 1, 2**32 - 1, 2**32, 2**63, HIGH_SEED, 2**64 - 1])
@pytest.mark.parametrize("position", [0, 5, 2**32 - 1, 2**32, 2**33 + 7, 2**63 - 1])
def test_uniforms_follow_the_counter_and_key_layout(seed, position):
    vocab = 11  # not a multiple of 4: the last block is cut
    u = uniforms(seed, position, vocab)
    for t in range(vocab):
        word = philox4x32_10([t // 4, 0, position % 2**32, position >> 32], [seed % 2**32, seed >> 32])[t % 4]
        assert u[t] == ((int(word) >> 8) + 0.5) / 2**24
    assert ((u > 0) & (u < 1)).all()


def test_uniforms_broadcast_and_differ_by_position_and_seed():
    positions = np.array([2**32 - 1, 2**32, 2**32 + 1], np.int64)
    rows = uniforms(np.uint64(HIGH_SEED), positions, 6)
    assert rows.shape == (3, 6)
    assert (rows[1] == uniforms(HIGH_SEED, 2**32, 6)).all()
    assert len({row.tobytes() for row in rows}) == 3
    assert not (uniforms(HIGH_SEED ^ 2**63, 2**32, 6) == rows[1]).any()  # the seed's top bit reaches the key


# --- temperature 0 is tree-accept --------------------------------------------------------------------------------

def peaked_logits(rng, tree, vocab, peak=6.0):
    """Standard normal logits with `peak` at the draft's token along a random path of each request (elsewhere at a
    random token), so walks go deep: greedy ones always, sampled ones when the peak dominates the vocabulary."""
    groups = tree["token"].shape[0]
    targets = [int(rng.integers(0, int(tree["n_nodes"][g]) + 1)) for g in range(groups)]
    predict = accept_stage.target_following(rng, tree, targets) % vocab
    logits = rng.standard_normal((groups, tree["token"].shape[1], vocab), dtype=np.float32)
    np.put_along_axis(logits, predict[:, :, None].astype(np.int64), np.float32(peak), axis=2)
    return logits


@pytest.mark.parametrize("groups, depth, fanout, budget, relaid", [
    (3, 3, 4, 12, False), (4, 7, 8, 63, True), (2, 15, 2, 31, False), (5, 1, 8, 8, True), (2, 15, 8, 255, True)])
@pytest.mark.parametrize("bf16", [False, True])
def test_temperature_zero_is_tree_accept(groups, depth, fanout, budget, relaid, bf16):
    rng = np.random.default_rng(groups * 1000 + budget)
    tree = accept_stage.drafted_tree(rng, groups, depth, fanout, budget)
    if relaid:
        tree = accept_stage.permuted(rng, tree)
    vocab = 4096  # the drafter's vocabulary: sibling tokens stay distinct
    logits = peaked_logits(rng, tree, vocab)
    best = logits.argmax(axis=2)
    np.put_along_axis(logits, np.minimum(best + 5, vocab - 1)[:, :, None], logits.max(axis=2)[:, :, None], axis=2)
    # ...an equal logit at a larger id: the smaller id stays the argmax
    if bf16:
        logits = to_bf16(logits)
    expected = tree_accept(tree["token"], tree["first_child"], tree["next_sibling"], tree["n_nodes"], depth,
                           target_logits=logits)
    params = per_request(groups, temperature=0.0, top_k=rng.integers(0, vocab, groups),
                         top_p=rng.uniform(0.1, 1, groups), seed=rng.integers(0, 2**63, groups),
                         position=rng.integers(0, 2**40, groups))  # all ignored at temperature 0
    out = tree_sample(tree["token"], tree["first_child"], tree["next_sibling"], tree["n_nodes"], depth, logits,
                      **params)
    for name in ("accept_len", "accept_index", "accept_tokens"):
        assert np.array_equal(out[name], expected[name]), name
    assert out["decisive"].all() and np.isinf(out["min_margin"]).all()


def test_temperature_zero_at_full_vocabulary():
    rng = np.random.default_rng(7)
    tree = accept_stage.drafted_tree(rng, 2, 7, 4, 15)
    logits = peaked_logits(rng, tree, 163840)
    expected = tree_accept(tree["token"], tree["first_child"], tree["next_sibling"], tree["n_nodes"], 7,
                           target_logits=logits)
    out = walk(tree, logits, 7, temperature=0.0)
    assert np.array_equal(out["accept_tokens"], expected["accept_tokens"])
    assert expected["accept_len"].max() >= 2


# --- the sampled distributions -------------------------------------------------------------------------------------

# id:              0    1    2    3    4     5     6    7        8    9     10   11
LOGITS = np.array([2.0, 1.5, 1.5, 0.3, -0.2, -1.0, 0.9, -np.inf, 1.1, -0.5, 0.9, 3.0], np.float32)


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (6, 1.0), (0, 0.8), (5, 0.9)])
def test_single_draws_follow_the_filtered_softmax(temperature, top_k, top_p):
    """top_k = 6 cuts between the two 0.9 logits: id 6 is kept, id 10 (the larger id) never drawn."""
    rows = np.broadcast_to(LOGITS, (DRAWS, len(LOGITS)))
    positions = 2**32 - DRAWS // 2 + np.arange(DRAWS)  # independent draws, across 2^32
    tokens, margins = sample(rows, **per_request(DRAWS, temperature, top_k, top_p, position=positions))
    probs = filtered_probs(LOGITS, temperature, top_k, top_p)
    assert np.count_nonzero(probs) >= 3
    assert_within_six_sigma(np.bincount(tokens, minlength=len(LOGITS)), probs, DRAWS)
    assert (margins >= EPS).mean() > 0.99


#       0            tokens: slot 0 any, siblings listed in first_child / next_sibling order
#     / | \
#   5(2) 2(4) 7(2)   slot 7 repeats slot 5's token: never accepted
#   |    |  \
#   1(1) 6(3) 3(0)
#   |
#   4(5)
#   |
#   8(2)             depth 4 > K = 3: never accepted
CHILDREN = {0: [5, 2, 7], 5: [1], 2: [6, 3], 1: [4], 4: [8]}
TOKENS = [9, 1, 4, 0, 5, 2, 3, 2, 2]
SMALL_TREE_K = 3


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.8, 4, 0.85)])
def test_walk_outcomes_follow_the_path_products(temperature, top_k, top_p):
    """Which slot the walk stops at, with which bonus token, and so the accepted length: binned against the
    products of the filtered probabilities along the tree's paths."""
    vocab = 6
    row_logits = np.round(np.random.default_rng(11).standard_normal((len(TOKENS), vocab)) * 4) / 4
    row_logits[[0, 5, 1, 4], [2, 1, 5, 2]] += 1.5  # along the deepest path 0 -> 5 -> 1 -> 4: every length counts
    row_logits = row_logits.astype(np.float32)
    q = [filtered_probs(row, temperature, top_k, top_p) for row in row_logits]
    expected = walk_outcomes(CHILDREN, TOKENS, SMALL_TREE_K, q)
    assert abs(sum(expected.values()) - 1) < 1e-12
    assert (accept_len_probs(CHILDREN, expected, SMALL_TREE_K) > 0.02).all()

    seeds = (2**63 + np.arange(DRAWS, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))  # wraps: spread over 2^64
    positions = 2**32 - 2 + np.arange(DRAWS) % 5  # walks cross 2^32
    out = walk(tree_arrays(CHILDREN, TOKENS, DRAWS), np.broadcast_to(row_logits, (DRAWS, *row_logits.shape)),
               SMALL_TREE_K, temperature=temperature, top_k=top_k, top_p=top_p, seed=seeds, position=positions)
    assert_walks_follow_the_path_products(out, CHILDREN, SMALL_TREE_K, expected)


# --- positions, seeds, margins ----------------------------------------------------------------------------------

def chain(tokens):
    """A chain 0 -> 1 -> ... carrying `tokens` at slots 1.. (one request)."""
    slots = len(tokens) + 1
    return {"token": np.array([[-1, *tokens]], np.int32),
            "first_child": np.array([[*range(1, slots), -1]], np.int32),
            "next_sibling": np.full((1, slots), -1, np.int32), "n_nodes": np.array([slots - 1], np.int32)}


@pytest.mark.parametrize("root_position", [2**32 - 2, 2**32 - 1, 2**40 + 3])
def test_draws_at_depth_use_position_plus_depth(root_position):
    vocab = 50
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((1, 3, vocab)).astype(np.float32) * 2
    logits[0, 0, :] = -np.inf
    logits[0, 0, 7] = 0.0  # the root's draw is certain: token 7, slot 1
    # The draw at slot 1 is at position p = root_position + 1, counter (t div 4, 0, p mod 2^32, p div 2^32): the
    # uniforms from Philox directly, not through uniforms().
    p = root_position + 1
    words = philox4x32_10([[t // 4, 0, p % 2**32, p >> 32] for t in range(vocab)], [HIGH_SEED % 2**32, HIGH_SEED >> 32])
    u = ((words[np.arange(vocab), np.arange(vocab) % 4] >> 8) + 0.5) / 2**24
    expected = int(np.argmax(logits[0, 1].astype(np.float64) / np.float32(0.9) - np.log(-np.log(u))))
    out = walk(chain([7, (expected + 1) % vocab]), logits, 2, temperature=0.9, position=root_position)
    assert out["accept_len"].tolist() == [1]
    assert out["accept_tokens"].tolist() == [[7, expected, -1]]


def test_knife_edge_draws_are_not_decisive():
    # Nearly equal probabilities straddling the top-p cut: float32 may round them equal and keep the other one.
    near = np.array([1.0, 1.0000001], np.float32)
    _, margin = sample(near[None], **per_request(1, 3.0, 0, 0.3))
    assert margin[0] < EPS
    # The k-th and (k+1)-th logits adjacent floats: float32 z may tie them, and the smaller id then wins.
    adjacent = np.array([1.6, np.nextafter(np.float32(1.6), np.float32(2))], np.float32)
    _, margin = sample(adjacent[None], **per_request(1, 3.0, 1, 1.0))
    assert margin[0] < EPS
    # Two equal logits, C = 0.5 for the second, top_p within EPS above: it is kept, but only just.
    tie = np.zeros((4000, 2), np.float32)
    tokens, margins = sample(tie, **per_request(4000, 1.0, 0, 0.50005, position=np.arange(4000)))
    assert (tokens == 1).any() and (margins[tokens == 1] < 0).all() and (tokens[margins >= EPS] == 0).all()


def test_min_margin_is_the_walks_smallest():
    logits = np.zeros((1, 3, 4), np.float32)
    logits[0, 0] = [-np.inf, 5.0, -np.inf, -np.inf]  # certain: token 1
    logits[0, 1] = [1.0, 1.0000001, -np.inf, -np.inf]
    out = walk(chain([1, 3]), logits, 2, temperature=3.0, top_p=0.3)
    assert out["accept_len"][0] == 1 and not out["decisive"][0] and out["min_margin"][0] < EPS


small_floats = st.sampled_from([0.0, 1.0, 1.0000001, 0.9999999, 2.0, -1.0, 3.5, 3.5000002, -np.inf, 0.5, 1.0001,
                                10.0, 10.000001, -3.0]) | st.floats(-20, 20, width=32)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(small_floats, min_size=1, max_size=16).filter(lambda v: np.isfinite(v).any()),
       st.floats(0.0625, 8, width=32) | st.sampled_from([1.0, 3.0, 0.7]), st.integers(0, 16),
       st.floats(0.015625, 1.0, width=32) | st.sampled_from([1.0, 0.5, 0.75]), st.integers(0, 2**64 - 1),
       st.integers(0, 2**62))
def test_draws_are_kept_tokens_and_decisive_ones_survive_float32(values, temperature, top_k, top_p, seed, position):
    logits = np.array(values, np.float32)
    top_k = min(top_k, len(values))
    tokens, margins = sample(logits[None], **per_request(1, temperature, top_k, top_p, seed, position))
    assert filtered_probs(logits, temperature, top_k, top_p)[tokens[0]] > 0
    if margins[0] >= EPS:
        assert float32_draw(logits, temperature, top_k, top_p, uniforms(seed, position, len(values))) == tokens[0]


# --- tree layouts and bf16 -----------------------------------------------------------------------------------------

def relaid(rng, tree, logits):
    """The same trees with non-root slots renumbered and every sibling list shuffled; logits rows move along."""
    groups, slots = tree["token"].shape
    out = {name: np.full_like(tree[name], -1) for name in ("token", "first_child", "next_sibling")}
    out["n_nodes"] = tree["n_nodes"].copy()
    moved = np.empty_like(logits)
    new_of = np.zeros((groups, slots), np.int64)
    for g in range(groups):
        new_of[g, 1:] = 1 + rng.permutation(slots - 1)
        out["token"][g, new_of[g]] = tree["token"][g]
        moved[g, new_of[g]] = logits[g]
        for old in range(slots):
            children, child = [], int(tree["first_child"][g, old])
            while child >= 0:
                children.append(int(new_of[g, child]))
                child = int(tree["next_sibling"][g, child])
            rng.shuffle(children)
            if children:
                out["first_child"][g, new_of[g, old]] = children[0]
            for before, after in zip(children, children[1:]):
                out["next_sibling"][g, before] = after
    return out, moved, new_of


def test_siblings_in_any_order_and_slots_in_any_numbering():
    rng = np.random.default_rng(21)
    tree = accept_stage.drafted_tree(rng, 8, 7, 8, 63)
    logits = peaked_logits(rng, tree, 4096, peak=12.0)
    params = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": rng.integers(0, 2**64, 8, np.uint64),
              "position": rng.integers(0, 2**40, 8)}
    out = walk(tree, logits, 7, **params)
    other, moved, new_of = relaid(rng, tree, logits)
    again = walk(other, moved, 7, **params)
    assert np.array_equal(out["accept_len"], again["accept_len"]) and out["accept_len"].max() >= 2
    assert np.array_equal(out["accept_tokens"], again["accept_tokens"])
    mapped = np.where(out["accept_index"] >= 0, np.take_along_axis(new_of, np.maximum(out["accept_index"], 0), 1), -1)
    assert np.array_equal(mapped, again["accept_index"])


def test_first_in_sibling_order_wins():
    tree = {"token": np.array([[-1, 3, 3]], np.int32), "first_child": np.array([[1, -1, -1]], np.int32),
            "next_sibling": np.array([[-1, 2, -1]], np.int32), "n_nodes": np.array([2], np.int32)}
    logits = np.full((1, 3, 5), -np.inf, np.float32)
    logits[:, :, 3] = 0.0
    assert walk(tree, logits, 1, temperature=1.0)["accept_index"].tolist() == [[0, 1]]
    tree["first_child"][0, 0], tree["next_sibling"][0] = 2, [-1, -1, 1]
    assert walk(tree, logits, 1, temperature=1.0)["accept_index"].tolist() == [[0, 2]]


def test_bf16_rows_draw_as_their_float32_values():
    rng = np.random.default_rng(31)
    tree = accept_stage.drafted_tree(rng, 6, 7, 4, 31)
    logits = to_bf16(peaked_logits(rng, tree, 4096, peak=12.0))
    params = {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "seed": rng.integers(0, 2**64, 6, np.uint64),
              "position": rng.integers(0, 2**40, 6)}
    from_bf16 = walk(tree, logits, 7, **params)
    from_f32 = walk(tree, logits.astype(np.float32), 7, **params)
    assert from_bf16["accept_len"].max() >= 2
    for name in ("accept_len", "accept_index", "accept_tokens", "min_margin"):
        assert np.array_equal(from_bf16[name], from_f32[name]), name


# --- bad input -----------------------------------------------------------------------------------------------------

def valid_case():
    rng = np.random.default_rng(41)
    tree = accept_stage.drafted_tree(rng, 2, 3, 2, 6)
    logits = rng.standard_normal((2, 7, 8)).astype(np.float32)
    tree["token"] = np.where(tree["token"] >= 0, tree["token"] % 8, -1).astype(np.int32)
    return {**{name: tree[name] for name in ("token", "first_child", "next_sibling", "n_nodes")},
            "max_depth": 3, "target_logits": logits, **per_request(2, 1.0, 4, 0.9, HIGH_SEED, 100)}


def changed(**changes):
    def apply(case):
        for name, change in changes.items():
            case[name] = change(case[name]) if callable(change) else change
    return apply


def at(index, value):
    def change(array):
        array = array.copy()
        array[index] = value
        return array
    return change


ROOT_ROW = (0, 0)  # request 0, slot 0: every walk draws there


@pytest.mark.parametrize("mutate, argument", [
    (changed(target_logits=at(ROOT_ROW + (3,), np.nan)), "target_logits[0, 0]"),
    (changed(target_logits=at(ROOT_ROW + (3,), np.inf)), "target_logits[0, 0]"),
    (changed(target_logits=at(ROOT_ROW, -np.inf)), "target_logits[0, 0]"),
    (changed(target_logits=at(ROOT_ROW, -np.inf), temperature=np.zeros(2, np.float32)), "target_logits[0, 0]"),
    (changed(target_logits=lambda a: to_bf16(at(ROOT_ROW + (1,), np.nan)(a))), "target_logits[0, 0]"),
    (changed(target_logits=lambda a: a.astype(np.float64)), "target_logits"),
    (changed(target_logits=lambda a: a[:, :-1]), "target_logits"),
    (changed(target_logits=lambda a: a[:, :, :0]), "target_logits"),
    (changed(temperature=at(1, -0.5)), "temperature[1]"),
    (changed(temperature=at(0, np.nan)), "temperature[0]"),
    (changed(temperature=at(0, np.inf)), "temperature[0]"),
    (changed(temperature=lambda a: a.astype(np.float64)), "temperature"),
    (changed(temperature=lambda a: a[:1]), "temperature"),
    (changed(top_k=at(0, -1)), "top_k[0]"),
    (changed(top_k=at(1, 9)), "top_k[1]"),
    (changed(top_k=lambda a: a.astype(np.int64)), "top_k"),
    (changed(top_p=at(0, 0.0)), "top_p[0]"),
    (changed(top_p=at(1, 1.5)), "top_p[1]"),
    (changed(top_p=at(0, np.nan)), "top_p[0]"),
    (changed(top_p=at(0, -0.2)), "top_p[0]"),
    (changed(seed=lambda a: a.astype(np.int64)), "seed"),
    (changed(seed=lambda a: a[0]), "seed"),
    (changed(seed=[1, 2]), "seed"),
    (changed(position=lambda a: a.astype(np.int32)), "position"),
    (changed(position=at(1, -1)), "position[1]"),
    (changed(position=at(0, 2**63 - 3)), "position[0]"),  # position + K overflows int64
    (changed(first_child=lambda a: a[:, :-1]), "first_child"),
    (changed(next_sibling=lambda a: a.astype(np.int64)), "next_sibling"),
    (changed(n_nodes=lambda a: a[:1]), "n_nodes"),
    (changed(max_depth=0), "max_depth"),
    (changed(first_child=at((1, 0), 7)), "first_child[1, 0]"),
])
def test_bad_input_names_the_argument(mutate, argument):
    case = valid_case()
    mutate(case)
    with pytest.raises(BadInput) as error:
        tree_sample(**case)
    assert error.value.argument == argument


def test_hostile_pointers_on_the_walk():
    logits = np.full((1, 3, 4), -np.inf, np.float32)
    logits[:, :, 2] = 0.0  # every draw is token 2
    cyclic_siblings = {"token": np.array([[-1, 1, 3]], np.int32), "first_child": np.array([[1, -1, -1]], np.int32),
                       "next_sibling": np.array([[-1, 2, 1]], np.int32), "n_nodes": np.array([2], np.int32)}
    with pytest.raises(BadInput) as error:
        walk(cyclic_siblings, logits, 3)
    assert error.value.argument == "next_sibling[0]"
    own_ancestor = {"token": np.array([[2, 2, 0]], np.int32), "first_child": np.array([[1, 0, -1]], np.int32),
                    "next_sibling": np.full((1, 3), -1, np.int32), "n_nodes": np.array([2], np.int32)}
    with pytest.raises(BadInput) as error:
        walk(own_ancestor, logits, 5)
    assert error.value.argument == "first_child[0]"


def test_rows_off_the_walk_are_not_read():
    case = valid_case()
    case["first_child"][:, 0] = -1  # the walk stops at the root
    case["target_logits"][:, 1:] = np.nan
    out = tree_sample(**case)
    assert (out["accept_len"] == 0).all()


@pytest.mark.parametrize("call, argument", [
    (lambda: philox4x32_10([0, 0, 2**32, 0], [0, 0]), "counter"),
    (lambda: philox4x32_10([0, 0, 0, 0], [0, 0, 0]), "key"),
    (lambda: philox4x32_10([0.0, 0, 0, 0], [0, 0]), "counter"),
    (lambda: uniforms(-1, 0, 4), "seed"),
    (lambda: uniforms(2**64, 0, 4), "seed"),
    (lambda: uniforms(0, 2**63, 4), "position"),
    (lambda: uniforms(0, 0, 0), "vocab"),
    (lambda: sample(np.zeros(4, np.float32), **per_request(1)), "rows"),
    (lambda: sample(np.array([[0.0, np.nan]], np.float32), **per_request(1)), "rows[0]"),
    (lambda: sample(np.zeros((2, 4), np.float32), **per_request(1)), "temperature"),
])
def test_helpers_name_the_bad_argument(call, argument):
    with pytest.raises(BadInput) as error:
        call()
    assert error.value.argument == argument
