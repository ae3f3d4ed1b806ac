"""topk: the reference against a plain-Python definition, and its bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdt.dtypes import to_bf16
from kdt.stages import topk as stage
from refs.errors import BadInput
from refs.topk import topk

grid = st.sampled_from([3.0, 1.5, 0.0, -0.0, -0.5, -2.0, -np.inf])


@st.composite
def logits(draw):
    groups, depth, vocab = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 40))
    values = np.array(draw(st.lists(grid, min_size=groups * depth * vocab, max_size=groups * depth * vocab)),
                      np.float32).reshape(groups, depth, vocab)
    values[:, :, draw(st.integers(0, vocab - 1))] = 0.25  # at least one finite logit per row
    k = draw(st.integers(1, vocab))
    return values, k


@settings(max_examples=200, deadline=None)
@given(logits(), st.booleans())
def test_matches_plain_python(case, bf16):
    values, k = case
    if bf16:
        values = to_bf16(values)
    out = topk(values, k)
    for g in range(values.shape[0]):
        for d in range(values.shape[1]):
            row = [float(v) for v in values[g, d]]
            order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
            finite = [v for v in row if v != -math.inf]
            peak = max(finite)
            lse = peak + math.log(math.fsum(math.exp(v - peak) for v in finite))
            assert out["top_ids"][g, d].tolist() == order
            want = np.array([row[i] - lse for i in order], np.float32)
            np.testing.assert_allclose(out["top_logp"][g, d], want, rtol=0, atol=1e-6)


def test_golden_cases_cover_their_descriptions():
    cases = {case.name: case for case in stage.make_cases()}
    masked = stage.SPEC.reference(cases["masked_vocab_neg_inf"].inputs, {"k": 8})
    assert np.isneginf(masked["top_logp"][0, 0, 5:]).all()  # fewer finite logits than V
    assert masked["top_ids"][0, 0, 5:].tolist() == [5, 6, 7]  # -inf ties: smaller id first
    zeros = stage.SPEC.reference(cases["signed_zeros"].inputs, {"k": 12})
    assert zeros["top_ids"][0, 0].tolist() == list(range(12))


@pytest.mark.parametrize("values, k, argument", [
    (np.array([[[1.0, np.nan]]], np.float32), 1, "logits"),
    (np.array([[[-np.inf, -np.inf]]], np.float32), 1, "logits"),
    (np.array([[[1.0, 2.0]]], np.float32), 3, "k"),
    (np.array([[[1.0, 2.0]]], np.float32), 0, "k"),
    (np.array([[[1.0, 2.0]]], np.float64), 1, "logits"),
    (np.array([[1.0, 2.0]], np.float32), 1, "logits"),
])
def test_bad_input_is_named(values, k, argument):
    with pytest.raises(BadInput) as error:
        topk(values, k)
    assert error.value.argument == argument


# --- the kernel on the GPU ------------------------------------------------------------------------------

@pytest.mark.gpu
def test_kernel_matches_golden(root):
    from tests.gpu_checks import assert_golden_passes

    assert_golden_passes("topk", root)


@pytest.mark.gpu
@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_kernel_matches_reference_on_random_inputs(seed):
    from tests.gpu_checks import assert_random_case_passes

    assert_random_case_passes("topk", seed)
