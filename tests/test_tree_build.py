"""tree-build: the heapq reference against an independent brute force, its invariants, its bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdt.stages import tree_build as stage
from kdt.refs.errors import BadInput
from kdt.refs.tree_build import tree_build


def brute_force(top_logp: np.ndarray, budget: int) -> list[tuple[int, int, np.float32]]:
    """A second definition, written without heapq: the frontier is a list scanned in full each step."""
    depth_max, fanout = top_logp.shape
    taken = []  # (parent, rank, score)
    depth_of = [0]
    score_of = [np.float32(0)]
    frontier = [(0, 0)]  # (parent slot, rank)
    while frontier and len(taken) < budget:
        def key(candidate):
            parent, rank = candidate
            score = np.float32(score_of[parent] + top_logp[depth_of[parent], rank])
            return (-float(score), parent, rank)
        best = min(frontier, key=key)
        if key(best)[0] == np.inf:
            break
        frontier.remove(best)
        parent, rank = best
        score = np.float32(score_of[parent] + top_logp[depth_of[parent], rank])
        taken.append((parent, rank, score))
        depth_of.append(depth_of[parent] + 1)
        score_of.append(score)
        if rank + 1 < fanout:
            frontier.append((parent, rank + 1))
        if depth_of[-1] < depth_max:
            frontier.append((len(taken), 0))
    return taken


logp_values = st.sampled_from([0.0, -0.5, -1.0, -1.5, -2.25, -3.0, -7.125, -np.inf])


@st.composite
def drafts(draw):
    groups = draw(st.integers(1, 3))
    depth = draw(st.integers(1, 5))
    fanout = draw(st.integers(1, 5))
    budget = draw(st.integers(1, 40))
    gaussian = draw(st.booleans())
    if gaussian:
        seed = draw(st.integers(0, 2**32 - 1))
        raw = np.random.default_rng(seed).normal(-2, 1.5, (groups, depth, fanout)).astype(np.float32)
    else:  # a coarse grid: many exact ties and -inf entries
        raw = np.array(draw(st.lists(logp_values, min_size=groups * depth * fanout, max_size=groups * depth * fanout)),
                       np.float32).reshape(groups, depth, fanout)
    top_logp = -np.sort(-raw, axis=2)
    top_ids = np.arange(groups * depth * fanout, dtype=np.int32).reshape(groups, depth, fanout)
    return top_logp, top_ids, budget


@settings(max_examples=300, deadline=None)
@given(drafts())
def test_reference_matches_brute_force_and_invariants(draft):
    top_logp, top_ids, budget = draft
    out = tree_build(top_logp, top_ids, budget)
    groups, slots = out["parent"].shape
    assert slots == budget + 1
    for g in range(groups):
        expected = brute_force(top_logp[g], budget)
        n = int(out["n_nodes"][g])
        assert n == len(expected)
        for slot, (parent, rank, score) in enumerate(expected, start=1):
            assert out["parent"][g, slot] == parent and out["rank"][g, slot] == rank
            assert out["logw"][g, slot].tobytes() == np.float32(score).tobytes()
            d = out["depth"][g, slot]
            assert d == (0 if parent == 0 else out["depth"][g, parent]) + 1
            assert out["token"][g, slot] == top_ids[g, d - 1, rank]
            # mask: exactly the slot and its ancestors
            chain, cur = {slot}, parent
            while cur != 0:
                chain.add(cur)
                cur = out["parent"][g, cur]
            chain.add(0)
            bits = {j for j in range(slots) if out["mask"][g, slot, j // 32] >> np.uint32(j % 32) & np.uint32(1)}
            assert bits == chain
        # sibling lists: first_child is the smallest child; next_sibling the next larger slot, scores descend
        for p in range(n + 1):
            children = [s for s in range(1, n + 1) if out["parent"][g, s] == p]
            walk, cur = [], out["first_child"][g, p]
            while cur != -1:
                walk.append(int(cur))
                cur = out["next_sibling"][g, cur]
            assert walk == children
            assert all(out["logw"][g, a] >= out["logw"][g, b] for a, b in zip(walk, walk[1:]))
        # unused slots
        assert (out["parent"][g, n + 1:] == -1).all() and (out["depth"][g, n + 1:] == -1).all()
        assert (out["token"][g, n + 1:] == -1).all() and (out["rank"][g, n + 1:] == -1).all()
        assert np.isneginf(out["logw"][g, n + 1:]).all() and (out["mask"][g, n + 1:] == 0).all()
        assert out["first_child"][g, n + 1:].tolist() == [-1] * (slots - n - 1)
        assert out["parent"][g, 0] == -1 and out["depth"][g, 0] == 0 and out["logw"][g, 0] == 0.0
        assert out["mask"][g, 0, 0] == 1 and out["token"][g, 0] == -1 and out["rank"][g, 0] == -1


def test_scores_are_float32_sums_along_the_path_not_float64():
    # For these three steps float32-per-add and float64-then-round give different bits (checked below),
    # and the contract asks for float32 per add.
    steps = np.array([-2.4831078, -1.2275974, -1.6487811], np.float32)
    per_step = np.float32(np.float32(steps[0] + steps[1]) + steps[2])
    assert per_step != np.float32(sum(float(s) for s in steps))
    out = tree_build(steps.reshape(1, 3, 1), np.zeros((1, 3, 1), np.int32), 3)
    assert out["logw"][0, 3].tobytes() == per_step.tobytes()


def test_every_golden_case_builds():
    for case in stage.make_cases():
        out = stage.SPEC.reference(case.inputs, case.params)
        assert set(out) == set(stage.OUTPUTS)


@pytest.mark.parametrize("mutate, argument", [
    (lambda lp, ids, b: (np.where(np.arange(3) == 1, np.nan, lp).astype(np.float32), ids, b), "top_logp"),
    (lambda lp, ids, b: (lp[:, :, ::-1].copy(), ids, b), "top_logp"),
    (lambda lp, ids, b: (lp, ids, 0), "budget"),
    (lambda lp, ids, b: (lp, ids, 1024), "budget"),
    (lambda lp, ids, b: (lp, ids[:, :, :2], b), "top_ids"),
    (lambda lp, ids, b: (lp.astype(np.float64), ids, b), "top_logp"),
    (lambda lp, ids, b: (lp[:, :0], ids[:, :0], b), "top_logp"),
    (lambda lp, ids, b: (np.full_like(lp, np.inf), ids, b), "top_logp"),
])
def test_bad_input_is_named(mutate, argument):
    lp = np.array([[[-0.5, -1.0, -2.0]] * 2], np.float32)
    ids = np.zeros(lp.shape, np.int32)
    with pytest.raises(BadInput) as error:
        tree_build(*mutate(lp, ids, 4))
    assert error.value.argument == argument


# --- the kernel on the GPU, path by path (the golden file and random inputs: tests/test_kernels.py) ----------


@pytest.mark.gpu
@pytest.mark.parametrize("select_from", [1, 1024], ids=["select-path", "serial-path"])
def test_each_build_path_matches_golden_and_random(root, select_from):
    """Both build paths on the same inputs: every case, and fresh random ones, with the select path tried from
    B = 1 (it still falls back on positive log-probs or an overflowing pool) or never tried."""
    import cupy

    from kdt import runtime
    from tests.gpu_checks import assert_golden_passes, assert_random_case_passes

    knobs = {"select_min_budget": select_from}
    pointer = runtime.load("tree-build").get_global("kdt_tree_build_select_runs")
    counter = cupy.ndarray((1,), dtype=cupy.uint64, memptr=pointer)
    counter.fill(0)
    assert_golden_passes("tree-build", root, knobs=knobs)
    for seed in range(30):
        assert_random_case_passes("tree-build", 7000 + seed, knobs=knobs)
    runs = int(counter.get()[0])
    if select_from == 1:
        assert runs > 0, "the select path never ran"
    else:
        assert runs == 0, f"the select path ran {runs} times with select_min_budget={select_from}"



@pytest.mark.nvcc
@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
def test_each_select_entry_holds_its_own_kind_and_calls_only_the_called_layouts(arch):
    """The select kinds have their own entries (ptxas allocates registers across a kernel's calls, so the narrow
    kind slowed when the wide one grew beside it), and the layouts are inlined or called as measured (the note,
    "Inlined or called"): a narrow entry calls its two narrow layouts, a wide entry only the wide one-pass layout
    (its two-pass layout inlined), and no entry without the select path calls either."""
    import re

    from kdt import build
    from tests import sass

    calls = {entry: {callee for line in instructions if "CALL.REL" in line
                     for callee in re.findall(r"\(\$\w+\$(\w+)\)", line)}
             for entry, instructions in sass.sections("tree-build", arch).items()}
    layouts = {"select_build_calledILb1ELb0E": "narrow one-pass", "select_build_calledILb0ELb0E": "narrow two-pass",
               "select_build_calledILb1ELb1E": "wide one-pass"}
    entries = [r.function for r in build.build("tree-build", arch).resources]
    assert len(entries) == 30 and set(entries) <= set(calls), entries
    for entry in entries:
        called = {name for callee in calls[entry] for marker, name in layouts.items() if marker in callee}
        assert not any("select_build" in callee and not any(m in callee for m in layouts) for callee in calls[entry]), \
            f"{entry} calls a select layout that should be inlined: {sorted(calls[entry])}"
        if entry.endswith("_select_narrow"):
            assert called == {"narrow one-pass", "narrow two-pass"}, (entry, called)
        elif entry.endswith("_select_wide"):
            assert called == {"wide one-pass"}, (entry, called)
        else:
            assert not called, (entry, called)
