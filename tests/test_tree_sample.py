"""tree-sample's spec on the CPU: golden cases are decisive, greedy equals tree-accept, knife-edge draws refused,
layouts checked."""

import numpy as np
import pytest

from kdt.refs.errors import BadInput
from kdt.refs.tree_accept import tree_accept
from kdt.refs.tree_sample import EPS
from kdt.stages import tree_sample
from kdt.stages.tree_accept import make_cases as tree_accept_cases


@pytest.fixture(scope="module")
def cases():
    return tree_sample.make_cases()


def test_every_golden_case_is_decisive_and_records_its_margin(cases):
    for case in cases:
        again = tree_sample.run_reference_margins(case.inputs, case.params["max_depth"])
        assert again["decisive"].all(), case.name
        assert case.params["min_margin"] >= EPS and case.params["min_margin"] == again["min_margin"].min(), case.name


def test_temperature_zero_is_tree_accepts_walk(cases):
    greedy = next(case for case in cases if case.name == "greedy_as_tree_accept")
    source = next(case for case in tree_accept_cases() if case.name == "target_logits_f32")
    want = tree_accept(*(source.inputs[name] for name in ("token", "first_child", "next_sibling", "n_nodes")),
                       source.params["max_depth"], target_logits=source.inputs["target_logits"])
    got = tree_sample.run_reference(greedy.inputs, greedy.params)
    for name in ("accept_len", "accept_index", "accept_tokens"):
        np.testing.assert_array_equal(got[name], want[name])


def test_the_cases_accept_and_reject_drafts(cases):
    """Language-model-like targets: every sampled case has a request that accepts >= 3 nodes and one that stops
    before the deepest node, so the golden files exercise both outcomes of a draw."""
    lengths = np.concatenate([tree_sample.run_reference(c.inputs, c.params)["accept_len"] for c in cases])
    assert lengths.max() >= 3 and (lengths < 7).any()


def knife_edge_case(seed: int):
    """Two equal logits, top-p 0.5: the second token's cumulative probability before it is exactly top_p, so it is
    in doubt; the draw is decisive only when the Gumbel scores are far apart."""
    inputs = {"token": np.array([[0, 1]], np.int32), "first_child": np.array([[1, -1]], np.int32),
              "next_sibling": np.array([[-1, -1]], np.int32), "n_nodes": np.array([1], np.int32),
              "target_logits": np.zeros((1, 2, 2), np.float32)}
    inputs.update(tree_sample.sampling_inputs([1.0], [0], [0.5], [3], seed=[seed]))
    return inputs


def test_a_draw_on_a_knifes_edge_is_refused_naming_the_request():
    undecided = [s for s in range(200)
                 if not tree_sample.run_reference_margins(knife_edge_case(s), 1)["decisive"][0]]
    assert undecided, "no seed put the draw on the edge: the test cannot fail"
    with pytest.raises(BadInput) as error:
        tree_sample.run_reference(knife_edge_case(undecided[0]), {"max_depth": 1})
    assert "target_logits[0]" in error.value.argument and "margin" in str(error.value.actual)


@pytest.mark.parametrize("name, dtype, expected", [("seed", "int64", "uint64"), ("position", "uint64", "int64"),
                                                   ("top_k", "int64", "int32"), ("temperature", "float64", "float32")])
def test_sampling_inputs_must_have_their_contract_dtypes(cases, name, dtype, expected):
    case = cases[1]
    shapes = {key: array.shape for key, array in case.inputs.items()}
    dtypes = {key: "bfloat16" if array.dtype.name == "bfloat16" else array.dtype.name for key, array in case.inputs.items()}
    dtypes[name] = dtype
    with pytest.raises(BadInput) as error:
        tree_sample.check_layout(shapes, dtypes, case.params)
    assert error.value.argument == name and expected in error.value.expected


def test_random_cases_are_decisive():
    rng = np.random.default_rng(7)
    for _ in range(10):
        case = tree_sample.random_case(rng)
        assert tree_sample.run_reference_margins(case.inputs, case.params["max_depth"])["decisive"].all()


def test_the_drafts_lead_bench_rows_follow_the_tree():
    # G64_N64_T1_drafts: every child's token leads its parent's row, the first child most, so walks accept drafts;
    # a row without children leads with one random token
    from kdt.stages.tree_accept import drafted_tree

    tree = drafted_tree(np.random.default_rng(63), 2, 15, 8, 63)
    row, token, lead = tree_sample._draft_leads(tree, np.random.default_rng(64), 1000)
    slots = tree["token"].shape[1]
    childless = int((~((tree["first_child"] >= 0) & (tree["first_child"] < slots))).sum())
    assert childless > 0
    assert len(row) == int(tree["n_nodes"].sum()) + childless   # one lead per taken node, in its parent's row
    assert np.array_equal(np.unique(row), np.arange(2 * slots))  # every row leads somewhere
    for g, s in [(0, 0), (1, 0), (0, int(tree["first_child"][0, 0]))]:
        kids = token[row == g * slots + s]
        first = int(tree["first_child"][g, s])
        assert kids[0] == tree["token"][g, first]
        assert (np.diff(lead[row == g * slots + s]) < 0).all()   # later siblings lead less
    leaf = int(np.flatnonzero(tree["first_child"][0] < 0)[0])
    assert (row == leaf).sum() == 1 and 0 <= token[row == leaf][0] < 1000
    assert 14 <= lead.max() <= 16
