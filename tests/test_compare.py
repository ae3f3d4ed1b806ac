"""The comparator: every field type, ULP distance, NaN never passing; and the poison patterns."""

from __future__ import annotations

import numpy as np
import pytest

from kdt.compare import AbsTol, Exact, RowScaledTol, hex_bits, ulp_distance
from kdt.dtypes import BF16
from kdt.verify import POISON_PATTERNS


def test_exact_ints_report_index_and_bits():
    expected = np.arange(12, dtype=np.int32).reshape(3, 4)
    got = expected.copy()
    got[2, 1] = -1
    result = Exact().compare("parent", expected, got)
    assert result.mismatches == 1 and not result.ok
    diff = result.diffs[0]
    assert diff.index == (2, 1) and diff.expected == 9 and diff.got == -1
    assert diff.expected_bits == "0x00000009" and diff.got_bits == "0xffffffff"


def test_exact_uint32_masks():
    expected = np.array([[1, 3]], np.uint32)
    assert Exact().compare("mask", expected, expected.copy()).ok
    assert Exact().compare("mask", expected, np.array([[1, 7]], np.uint32)).mismatches == 1


def test_exact_floats_are_bitwise():
    expected = np.array([0.0, 1.0, -np.inf], np.float32)
    assert Exact().compare("logw", expected, expected.copy()).ok
    signed = Exact().compare("logw", expected, np.array([-0.0, 1.0, -np.inf], np.float32))
    assert signed.mismatches == 1  # -0.0 is not +0.0 bit for bit
    next_up = np.nextafter(np.float32(1.0), np.float32(2.0))
    result = Exact().compare("logw", expected, np.array([0.0, next_up, -np.inf], np.float32))
    assert result.mismatches == 1 and result.diffs[0].ulp == 1


def test_nan_never_passes():
    nan = np.array([np.nan], np.float32)
    assert not Exact().compare("logw", nan, nan.copy()).ok
    assert not AbsTol(1.0).compare("top_logp", nan, nan.copy()).ok
    assert not AbsTol(1.0).compare("top_logp", np.array([0.0], np.float32), nan).ok
    rows = np.ones((2, 4), np.float32)
    bad = rows.copy()
    bad[1, 2] = np.nan
    assert not RowScaledTol(1.0, 1e-3, 1.0).compare("out", rows, bad).ok


def test_abs_tol_edges():
    policy = AbsTol(1e-5)
    expected = np.array([-1.0, -np.inf, 2.0], np.float32)
    assert policy.compare("top_logp", expected, np.array([-1.000009, -np.inf, 2.0], np.float32)).ok
    assert not policy.compare("top_logp", expected, np.array([-1.00002, -np.inf, 2.0], np.float32)).ok
    assert not policy.compare("top_logp", expected, np.array([-1.0, -3e38, 2.0], np.float32)).ok  # inf vs finite


def test_row_scaled_tolerance():
    policy = RowScaledTol(8e-3, 1e-3, 4e-3)
    expected = np.random.default_rng(0).standard_normal((3, 5, 64)).astype(np.float32)
    close = expected * np.float32(1 + 1e-4)
    assert policy.compare("out", expected, close).ok
    off = expected.copy()
    off[1, 2, 7] += 0.5
    result = policy.compare("out", expected, off)
    assert result.mismatches == 1 and result.diffs[0].index == (1, 2, 7)
    tiny = np.zeros((1, 1, 4), np.float32)
    assert policy.compare("out", tiny, tiny + np.float32(7e-6)).ok  # under 8e-3 * floor 1e-3
    assert not policy.compare("out", tiny, tiny + np.float32(1e-5)).ok


def test_bf16_outputs_compare_as_floats():
    expected = np.array([[1.0, 2.0]], np.float32)
    got = expected.astype(BF16)
    assert RowScaledTol(8e-3, 1e-3, 4e-3).compare("out", expected, got).ok


def test_ulp_distance_across_zero_and_to_infinity():
    a = np.array([0.0, -0.0, 1.0, np.float32(3.4028235e38)], np.float32)
    b = np.array([-0.0, np.float32(-1e-45), 1.0, np.inf], np.float32)
    assert ulp_distance(a, b).tolist() == [0, 1, 0, 1]


def test_shape_mismatch_is_a_mismatch():
    result = Exact().compare("n_nodes", np.zeros(3, np.int32), np.zeros(4, np.int32))
    assert not result.ok and "shape" in result.worst


def test_hex_bits_of_bf16():
    assert hex_bits(np.array([1.0], np.float32).astype(BF16)[0]) == "0x3f80"


@pytest.mark.parametrize("width, dtype", [(2, BF16), (4, np.float32), (8, np.float64)])
def test_poison_patterns_are_nan_and_distinct(width, dtype):
    first, second = POISON_PATTERNS[width]
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    with np.errstate(invalid="ignore"):   # signalling NaN payloads may raise "invalid" when widened
        values = np.array([first, second], bits).view(dtype).astype(np.float64)
    assert np.isnan(values).all() and first != second
    ints = np.array([first, second], bits).view({2: np.int16, 4: np.int32, 8: np.int64}[width])
    assert (ints < -1).any() or (np.abs(ints.astype(np.int64)) > 1 << 20).all()  # no slot, depth or rank
