"""The contract's element types, and bf16 as stored (uint16 raw bits) versus as computed (ml_dtypes).

ml_dtypes is imported on first use (`BF16` and the functions below), not with this module: it takes over half a
second, which `kdt --help` should not pay."""

from __future__ import annotations

from functools import cache

import numpy as np

BFLOAT16 = "bfloat16"


@cache
def bf16() -> np.dtype:
    """numpy's dtype of ml_dtypes.bfloat16."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def __getattr__(attribute: str):
    if attribute == "BF16":          # `from kdt.dtypes import BF16`: resolved (and ml_dtypes imported) on use
        return bf16()
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


def to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16, round to nearest even (ml_dtypes' cast)."""
    return np.asarray(values, np.float32).astype(bf16())


def storage(array: np.ndarray) -> tuple[np.ndarray, str | None]:
    """The array as it is written (bf16 as uint16 bits) and the `dtype` attribute that marks it."""
    if array.dtype == bf16():
        return array.view(np.uint16), BFLOAT16
    return array, None


def from_storage(raw: np.ndarray, dtype_attr: str | None) -> np.ndarray:
    if dtype_attr == BFLOAT16:
        if raw.dtype != np.uint16:
            raise TypeError(f"a bfloat16 dataset must hold uint16 bits, found {raw.dtype}")
        return raw.view(bf16())
    return raw


def name(dtype: np.dtype) -> str:
    return BFLOAT16 if np.dtype(dtype) == bf16() else np.dtype(dtype).name
