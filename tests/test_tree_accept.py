"""tree-accept: hand-built trees with known walks, golden cases' claims, hostile pointers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdt.stages import tree_accept as stage
from kdt.refs.errors import BadInput
from kdt.refs.tree_accept import tree_accept

#       0
#     /   \
#    1(5)  2(7)
#    |      \
#    3(9)    4(7)
TREE = {
    "token": np.array([[-1, 5, 7, 9, 7]], np.int32),
    "first_child": np.array([[1, 3, 4, -1, -1]], np.int32),
    "next_sibling": np.array([[-1, 2, -1, -1, -1]], np.int32),
    "n_nodes": np.array([4], np.int32),
}


def accept(predict, max_depth=3, **changes):
    tree = {key: value.copy() for key, value in TREE.items()}
    tree.update(changes)
    return tree_accept(tree["token"], tree["first_child"], tree["next_sibling"], tree["n_nodes"], max_depth,
                       target_predict=np.array([predict], np.int32))


def test_walks():
    out = accept([7, 0, 7, 0, 11])  # root predicts 7 -> slot 2, slot 2 predicts 7 -> slot 4, bonus 11
    assert out["accept_len"].tolist() == [2]
    assert out["accept_index"].tolist() == [[0, 2, 4, -1]]
    assert out["accept_tokens"].tolist() == [[7, 7, 11, -1]]
    out = accept([3, 0, 0, 0, 0])  # nothing matches: bonus only
    assert out["accept_index"].tolist() == [[0, -1, -1, -1]] and out["accept_tokens"].tolist() == [[3, -1, -1, -1]]
    out = accept([5, 9, 0, 4, 0], max_depth=1)  # capped at K=1
    assert out["accept_len"].tolist() == [1] and out["accept_tokens"].tolist() == [[5, 9]]


def test_first_in_sibling_order_wins():
    out = accept([7, 0, 0, 0, 0], token=np.array([[-1, 7, 7, 9, 7]], np.int32))
    assert out["accept_index"][0, 1] == 1
    out = accept([7, 0, 0, 0, 0], token=np.array([[-1, 7, 7, 9, 7]], np.int32),
                 first_child=np.array([[2, 3, 4, -1, -1]], np.int32),
                 next_sibling=np.array([[-1, -1, 1, -1, -1]], np.int32))
    assert out["accept_index"][0, 1] == 2


def test_from_logits_takes_smaller_id_on_ties():
    logits = np.zeros((1, 5, 10), np.float32)
    logits[0, 0, [5, 7]] = 1.0  # tie: 5 wins -> slot 1
    out = tree_accept(TREE["token"], TREE["first_child"], TREE["next_sibling"], TREE["n_nodes"], 3,
                      target_logits=logits)
    assert out["accept_index"][0, 1] == 1


@pytest.mark.parametrize("predict, changes, argument", [
    ([99, 0, 0, 0, 0], {"next_sibling": np.array([[-1, 2, 1, -1, -1]], np.int32)}, "next_sibling[0]"),
    ([7, 0, 7, 0, 7], {"first_child": np.array([[1, 3, 4, -1, 9]], np.int32)}, "first_child[0, 4]"),
    ([7, 0, 7, 0, 7], {"first_child": np.array([[1, 3, 4, -1, 0]], np.int32),
                       "token": np.array([[7, 5, 7, 9, 7]], np.int32)}, "first_child[0]"),
])
def test_hostile_pointers_raise(predict, changes, argument):
    with pytest.raises(BadInput) as error:
        accept(predict, max_depth=5, **changes)
    assert error.value.argument == argument


def test_golden_cases_do_what_they_say():
    cases = {case.name: case for case in stage.make_cases()}
    full = stage.SPEC.reference(cases["full_depth_accept"].inputs, cases["full_depth_accept"].params)
    assert full["accept_len"].tolist() == [5, 5]
    root = stage.SPEC.reference(cases["root_without_children"].inputs, cases["root_without_children"].params)
    assert root["accept_len"][0] == 0
    order = cases["sibling_order_decides"]
    out = stage.SPEC.reference(order.inputs, order.params)
    for g in range(2):
        first, second = order.inputs["first_child"][g, 0], order.inputs["next_sibling"][g, order.inputs["first_child"][g, 0]]
        assert out["accept_index"][g, 1] == first and first > second
    capped = stage.SPEC.reference(cases["max_depth_caps_walk"].inputs, cases["max_depth_caps_walk"].params)
    assert capped["accept_len"].tolist() == [4]
    lengths = stage.SPEC.reference(cases["drafter_b63_predict"].inputs, cases["drafter_b63_predict"].params)
    assert len(set(lengths["accept_len"].tolist())) >= 3


def test_exactly_one_target():
    with pytest.raises(BadInput):
        tree_accept(TREE["token"], TREE["first_child"], TREE["next_sibling"], TREE["n_nodes"], 3)
