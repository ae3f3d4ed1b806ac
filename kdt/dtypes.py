"""The contract's element types, and bf16 as stored (uint16 raw bits) versus as computed (ml_dtypes)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

BFLOAT16 = "bfloat16"
BF16 = np.dtype(ml_dtypes.bfloat16)


def to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16, round to nearest even (ml_dtypes' cast)."""
    return np.asarray(values, np.float32).astype(BF16)


def storage(array: np.ndarray) -> tuple[np.ndarray, str | None]:
    """The array as it is written (bf16 as uint16 bits) and the `dtype` attribute that marks it."""
    if array.dtype == BF16:
        return array.view(np.uint16), BFLOAT16
    return array, None


def from_storage(raw: np.ndarray, dtype_attr: str | None) -> np.ndarray:
    if dtype_attr == BFLOAT16:
        if raw.dtype != np.uint16:
            raise TypeError(f"a bfloat16 dataset must hold uint16 bits, found {raw.dtype}")
        return raw.view(BF16)
    return raw


def name(dtype: np.dtype) -> str:
    return BFLOAT16 if np.dtype(dtype) == BF16 else np.dtype(dtype).name
