"""What sampled draws and walks must follow, written plainly (a Python sort, float64, running sums, a recursion over
the tree's paths), and the per-bin check: shared by the tests of tree-sample's reference (test_tree_sample_ref.py)
and of its kernel (test_tree_sample_stats.py)."""

from __future__ import annotations

import numpy as np

MIN_EXPECTED = 20   # bins expected to hold fewer draws are pooled into one: the 6-sigma bound is a normal one


def filtered_probs(logits, temperature, top_k, top_p) -> np.ndarray:
    """The contract's filtered distribution, written plainly: a Python sort, float64, a running sum."""
    z = np.asarray(logits, np.float32).astype(np.float64) / float(np.float32(temperature))
    ranked = sorted(range(len(z)), key=lambda t: (-z[t], t))
    kept = ranked[:top_k] if top_k else ranked
    probs = np.exp(z[kept] - z[kept[0]])
    probs /= probs.sum()
    if float(np.float32(top_p)) < 1:
        total, count = 0.0, 0
        while total < float(np.float32(top_p)) and count < len(kept):
            total += probs[count]
            count += 1
        kept, probs = kept[:count], probs[:count] / probs[:count].sum()
    out = np.zeros(len(z))
    out[kept] = probs
    return out


def assert_within_six_sigma(counts, probs, draws: int) -> None:
    """No draw in a bin of probability 0; every other bin within 6 sigma of draws * probability, those expected
    below MIN_EXPECTED draws pooled into one bin first (a normal bound on a count of 1 or 2 would fail by chance)."""
    counts, probs = np.asarray(counts), np.asarray(probs, np.float64)
    assert (counts[probs == 0] == 0).all(), f"drawn with probability 0: bins {np.flatnonzero(counts * (probs == 0))}"
    rare = (probs > 0) & (draws * probs < MIN_EXPECTED)
    counts = np.append(counts[~rare], counts[rare].sum())
    probs = np.append(probs[~rare], probs[rare].sum())
    sigma = np.sqrt(draws * probs * (1 - probs))
    deviation = np.abs(counts - draws * probs)
    assert (deviation <= 6 * sigma).all(), (counts, np.round(draws * probs))


def tree_arrays(children: dict[int, list[int]], tokens: list[int], groups: int) -> dict[str, np.ndarray]:
    """The contract's encoding (token, first_child, next_sibling [G, N], n_nodes [G]) of one tree for `groups`
    requests: `children` maps a slot to its children in sibling order, `tokens` holds each slot's token."""
    first_child = np.full(len(tokens), -1, np.int32)
    next_sibling = np.full(len(tokens), -1, np.int32)
    for parent, kids in children.items():
        first_child[parent] = kids[0]
        for before, after in zip(kids, kids[1:]):
            next_sibling[before] = after
    rows = {"token": np.array(tokens, np.int32), "first_child": first_child, "next_sibling": next_sibling}
    return {**{name: np.tile(row, (groups, 1)) for name, row in rows.items()},
            "n_nodes": np.full(groups, len(tokens) - 1, np.int32)}


def walk_outcomes(children: dict[int, list[int]], tokens: list[int], max_depth: int,
                  q: list[np.ndarray]) -> dict[tuple[int, int], float]:
    """{(final slot, bonus token): probability} of the sampled walk, from the products of the target's filtered
    probabilities q[slot] along each path."""
    outcomes: dict[tuple[int, int], float] = {}

    def visit(slot, depth, reach):
        first_with: dict[int, int] = {}
        for child in children.get(slot, []) if depth < max_depth else []:
            first_with.setdefault(tokens[child], child)  # a repeated token goes to the first in sibling order
        for token, prob in enumerate(q[slot]):
            if token in first_with:
                visit(first_with[token], depth + 1, reach * prob)
            elif prob > 0:
                outcomes[slot, token] = outcomes.get((slot, token), 0.0) + reach * prob

    visit(0, 0, 1.0)
    return outcomes


def slot_depths(children: dict[int, list[int]]) -> dict[int, int]:
    """Each slot's depth, the root's 0, found from the root down."""
    depth, pending = {0: 0}, [0]
    while pending:
        slot = pending.pop()
        for child in children.get(slot, []):
            depth[child] = depth[slot] + 1
            pending.append(child)
    return depth


def accept_len_probs(children: dict[int, list[int]], outcomes: dict[tuple[int, int], float],
                     max_depth: int) -> np.ndarray:
    """float64 [K + 1]: the probability of each accepted length, the depth of the walk's final slot."""
    depth = slot_depths(children)
    probs = np.zeros(max_depth + 1)
    for (slot, _), prob in outcomes.items():
        probs[depth[slot]] += prob
    return probs


def assert_walks_follow_the_path_products(out: dict[str, np.ndarray], children: dict[int, list[int]],
                                          max_depth: int, outcomes: dict[tuple[int, int], float]) -> None:
    """Walks (accept_len, accept_index, accept_tokens as numpy arrays, one walk per request) binned by final slot and
    bonus token, and by accepted length, each bin within 6 sigma of `outcomes` (walk_outcomes)."""
    draws = len(out["accept_len"])
    rows = np.arange(draws)
    final = out["accept_index"][rows, out["accept_len"]]
    bonus = out["accept_tokens"][rows, out["accept_len"]]
    ordered = sorted(outcomes)
    index = {outcome: i for i, outcome in enumerate(ordered)}
    binned = np.array([index.get((int(s), int(t)), -1) for s, t in zip(final, bonus)])
    assert (binned >= 0).all(), f"an outcome of probability 0: {sorted(set(zip(final[binned < 0], bonus[binned < 0])))}"
    probs = np.array([outcomes[outcome] for outcome in ordered])
    assert_within_six_sigma(np.bincount(binned, minlength=len(ordered)), probs, draws)
    assert_within_six_sigma(np.bincount(out["accept_len"], minlength=max_depth + 1),
                            accept_len_probs(children, outcomes, max_depth), draws)
