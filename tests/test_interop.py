"""kdt.interop: SGLang's tree encoding to and from kdt's, round trips on random trees, the same walks through both
encodings, clear errors for malformed trees."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdt import interop
from kdt.interop import from_sglang, to_sglang
from kdt.refs.errors import BadInput
from kdt.refs.tree_accept import tree_accept

TREE = ("token", "first_child", "next_sibling")


def random_trees(rng: np.random.Generator, groups: int, slots: int, vocab: int = 50) -> dict[str, np.ndarray]:
    """kdt-encoded random trees: each request's live slots (some leave unused slots at the end, as tree-build
    does) numbered at random, every sibling list in random order, a token at the root."""
    token = np.full((groups, slots), -1, np.int32)
    first_child = np.full((groups, slots), -1, np.int32)
    next_sibling = np.full((groups, slots), -1, np.int32)
    for g in range(groups):
        live = int(rng.integers(1, slots + 1))
        slot_of = np.concatenate([[0], 1 + rng.permutation(live - 1)])  # node n (in creation order) -> slot
        children = {node: [] for node in range(live)}
        for node in range(1, live):
            children[int(rng.integers(0, node))].append(node)
        token[g, slot_of] = rng.integers(0, vocab, live)
        for node, kids in children.items():
            kids = [int(slot_of[kid]) for kid in rng.permutation(kids)] if kids else []
            if kids:
                first_child[g, slot_of[node]] = kids[0]
            for before, after in zip(kids, kids[1:]):
                next_sibling[g, before] = after
    return {"token": token, "first_child": first_child, "next_sibling": next_sibling}


def sglang_verify_greedy(candidates, retrive_index, retrive_next_token, retrive_next_sibling, target_predict, steps):
    """SGLang's greedy tree verification as its kernel indexes (VerifyTreeGreedy, eagle_utils.cu): flat [bs * n]
    arrays, a local cursor read at b * n + cur, the flat retrive_index of accepted slots. -> (accept_index flat
    [bs, steps], accept_token_num [bs])."""
    bs, n = candidates.shape
    tokens, flat_index, next_token, next_sibling, predict = (a.ravel() for a in (
        candidates, retrive_index, retrive_next_token, retrive_next_sibling, target_predict))
    accept_index = np.full((bs, steps), -1, np.int64)
    accepted = np.zeros(bs, np.int64)
    for b in range(bs):
        last = flat_index[b * n]
        accept_index[b, 0] = last
        cur = 0
        for _ in range(1, steps):
            cur = next_token[b * n + cur]
            while cur != -1 and tokens[b * n + cur] != predict[last]:
                cur = next_sibling[b * n + cur]
            if cur == -1:
                break
            accepted[b] += 1
            last = flat_index[b * n + cur]
            accept_index[b, accepted[b]] = last
    return accept_index, accepted


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.integers(1, 24), st.integers(0, 2**32 - 1))
def test_round_trips(groups, slots, seed):
    tree = random_trees(np.random.default_rng(seed), groups, slots)
    sglang = to_sglang(**tree)
    assert all(array.dtype == np.int64 and array.shape == (groups, slots) for array in sglang.values())
    assert (sglang["retrive_index"] == np.arange(groups * slots).reshape(groups, slots)).all()
    back = from_sglang(**sglang)
    for name in TREE:
        assert back[name].dtype == np.int32 and np.array_equal(back[name], tree[name]), name
    assert (back["n_nodes"] == slots - 1).all()
    again = to_sglang(*(back[name] for name in TREE))
    assert all(np.array_equal(again[name], sglang[name]) for name in sglang)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 6), st.integers(2, 24), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_both_encodings_walk_the_same(groups, slots, depth, seed):
    """kdt's greedy walk on a kdt tree and SGLang's on its conversion accept the same slots: the flat indices
    SGLang reports are b * n + the local slots kdt reports."""
    rng = np.random.default_rng(seed)
    tree = random_trees(rng, groups, slots, vocab=3)  # few tokens: matches, deep walks, repeated sibling tokens
    predict = rng.integers(0, 3, (groups, slots)).astype(np.int32)
    ours = tree_accept(*(tree[name] for name in TREE), np.full(groups, slots - 1, np.int32), depth,
                       target_predict=predict)
    sglang = to_sglang(**tree)
    flat, accepted = sglang_verify_greedy(sglang["candidates"], sglang["retrive_index"], sglang["retrive_next_token"],
                                          sglang["retrive_next_sibling"], predict.astype(np.int64), depth + 1)
    assert np.array_equal(accepted, ours["accept_len"])
    base = (np.arange(groups) * slots)[:, None]
    assert np.array_equal(flat, np.where(ours["accept_index"] >= 0, ours["accept_index"] + base, -1))


def sglang_case():
    return to_sglang(**random_trees(np.random.default_rng(3), 3, 8))


def edit(name, index, value):
    def apply(case):
        case[name] = case[name].copy()
        case[name][index] = value
    return apply


@pytest.mark.parametrize("mutate, argument", [
    (lambda case: case.update(candidates=case["candidates"].astype(np.int32)), "candidates"),
    (lambda case: case.update(retrive_next_token=case["retrive_next_token"].astype(np.int32)), "retrive_next_token"),
    (lambda case: case.update(retrive_next_sibling=case["retrive_next_sibling"][:, :-1]), "retrive_next_sibling"),
    (lambda case: case.update(retrive_index=case["retrive_index"].ravel()), "retrive_index"),
    (lambda case: case.update(retrive_index=case["retrive_index"].tolist()), "retrive_index"),
    (lambda case: case.update(candidates=case["candidates"][0]), "candidates"),
    (lambda case: case.update(**{name: case[name][:, :0] for name in case}), "candidates"),
    (edit("retrive_index", (1, 0), 0), "retrive_index[1, 0]"),  # local, not flat
    (edit("retrive_next_token", (2, 3), 8), "retrive_next_token[2, 3]"),
    (edit("retrive_next_sibling", (0, 5), -2), "retrive_next_sibling[0, 5]"),
    (edit("retrive_next_sibling", (1, 0), 3), "retrive_next_sibling[1, 0]"),  # the root is nobody's sibling
    (edit("candidates", (0, 1), 2**31), "candidates[0, 1]"),
])
def test_malformed_sglang_input_names_the_argument(mutate, argument):
    case = sglang_case()
    mutate(case)
    with pytest.raises(BadInput) as error:
        from_sglang(**case)
    assert error.value.argument == argument


def test_two_parents_and_pointers_at_the_root_are_refused():
    tree = {"token": np.array([[0, 1, 2, 3]], np.int32), "first_child": np.array([[1, 3, -1, -1]], np.int32),
            "next_sibling": np.array([[-1, 2, -1, -1]], np.int32)}
    to_sglang(**tree)  # 0 -> (1 -> 3, 2): a tree
    shared = {**tree, "first_child": np.array([[1, 3, 3, -1]], np.int32)}  # slot 3 under both 1 and 2
    with pytest.raises(BadInput) as error:
        to_sglang(**shared)
    assert error.value.argument == "first_child[0, 2]"
    looped = {**tree, "next_sibling": np.array([[-1, 2, -1, 0]], np.int32)}  # back to the root
    with pytest.raises(BadInput) as error:
        to_sglang(**looped)
    assert error.value.argument == "next_sibling[0, 3]"


@pytest.mark.parametrize("name, change, argument", [
    ("first_child", lambda a: a.astype(np.int64), "first_child"),
    ("next_sibling", lambda a: a[:1], "next_sibling"),
    ("token", lambda a: a.astype(np.float32), "token"),
    ("first_child", lambda a: np.where(a == a.max(), 40, a).astype(np.int32), "first_child"),
])
def test_malformed_kdt_input_names_the_argument(name, change, argument):
    tree = random_trees(np.random.default_rng(4), 2, 9)
    tree[name] = change(tree[name])
    with pytest.raises(BadInput) as error:
        to_sglang(**tree)
    assert error.value.argument.split("[")[0] == argument


def test_gen_golden_takes_trees_captured_in_sglangs_encoding(tmp_path, monkeypatch, capsys):
    """A captured tree-accept batch in SGLang's arrays (n_nodes kept, as a capture may record it) gives the same
    expected outputs as the same batch in kdt's."""
    from dataclasses import replace

    from kdt import golden, stages
    from tests.cli_run import run_kdt_cli

    spec = stages.get("tree-accept")
    source = [case for case in spec.make_cases() if case.name in ("target_logits_f32", "other_builder_layout")]
    captured = []
    for case in source:
        tree = {name: case.inputs[name] for name in ("token", "first_child", "next_sibling")}
        full = {key: value for key, value in case.inputs.items() if key not in tree and key != "n_nodes"}
        captured.append(replace(case, inputs={**full, **interop.to_sglang(**tree), "n_nodes": case.inputs["n_nodes"]}))
    golden.write(tmp_path / "captured.h5", spec, [golden.GoldenCase(case, {}) for case in captured], inputs_only=True)
    code, out, err = run_kdt_cli(monkeypatch, capsys, "gen-golden", "--inputs", str(tmp_path / "captured.h5"),
                                 "--out", str(tmp_path / "out.h5"))
    assert code == 0, err
    got = {item.case.name: item.expected for item in golden.read(tmp_path / "out.h5", spec).cases}
    for case in source:
        want = spec.run_reference(case.inputs, case.params)
        for name, array in want.items():
            np.testing.assert_array_equal(got[case.name][name], array)


def test_sglang_and_kdt_encodings_in_one_case_are_refused():
    tree = {"token": np.zeros((1, 2), np.int32), "first_child": np.array([[1, -1]], np.int32),
            "next_sibling": np.full((1, 2), -1, np.int32)}
    with pytest.raises(BadInput) as error:
        interop.kdt_tree_inputs({**tree, **interop.to_sglang(**tree)})
    assert error.value.argument == "token" and "not both" in error.value.expected
    with pytest.raises(BadInput) as error:
        interop.kdt_tree_inputs({"retrive_index": interop.to_sglang(**tree)["retrive_index"]})
    assert error.value.argument == "retrive_next_token"
