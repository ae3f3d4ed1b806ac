"""Every registered stage's kernel on the GPU: its golden file (eager and replayed from a CUDA graph) and fresh
random inputs against the reference, outputs poisoned (kdt.verify). Path-by-path tests live with each stage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdt import stages
from tests.gpu_checks import assert_golden_passes, assert_random_case_passes


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("kernel", stages.names())
def test_kernel_matches_golden(kernel, graph, root):
    assert_golden_passes(kernel, root, graph=graph)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", stages.names())
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_kernel_matches_reference_on_random_inputs(kernel, seed):
    assert_random_case_passes(kernel, seed)
