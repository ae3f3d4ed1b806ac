"""Tensor maps for the tensor-copy engine (TMA, sm_90 on): the driver's cuTensorMapEncodeTiled through ctypes (CuPy
does not expose it), for the `TensorMap` launch arguments of a plan (kdt/launch/plan.py).

A map holds the array's address, so it is made at launch; the same array (address, shape) gives the same 128 bytes,
which are kept (a few dozen maps: a bench rotates over its inputs' copies)."""

from __future__ import annotations

import ctypes
import functools

from kdt.launch.plan import TensorMap

BFLOAT16 = 9                  # CUtensorMapDataType (cuda.h)
INTERLEAVE_NONE = 0           # CUtensorMapInterleave
SWIZZLE_128B = 3              # CUtensorMapSwizzle: 16-byte chunk c of 128-byte row r of a box at c ^ (r % 8)
L2_PROMOTION_256B = 3         # CUtensorMapL2promotion
OOB_FILL_NONE = 0             # CUtensorMapFloatOOBfill: zeros past the tensor's bounds
ELEMENT_BYTES = 2
_NO_MAP = bytes(TensorMap.SIZE)


@functools.cache
def _encode_tiled():
    function = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                         ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                         ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                         ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return function


def tensor_map_bytes(arg: TensorMap, array) -> bytes:
    """The 128 bytes of `arg` for `array` (a C-contiguous bf16 CuPy array): zeros where arg.encode is False."""
    if not arg.encode:
        return _NO_MAP
    cols = array.shape[-1]
    return _encoded(array.data.ptr, array.size // cols, cols, arg.box_rows, arg.box_cols)


@functools.lru_cache(maxsize=64)
def _encoded(address: int, rows: int, cols: int, box_rows: int, box_cols: int) -> bytes:
    """The map of the bf16 [rows, cols] row-major tensor at `address`; a launcher's mistake (an address not
    16-byte aligned, a row not a multiple of 16 bytes, a box past 256 elements or 128 bytes wide) is the driver's
    error, raised."""
    out = (ctypes.c_uint64 * 16)()
    dims = (ctypes.c_uint64 * 2)(cols, rows)
    strides = (ctypes.c_uint64 * 1)(cols * ELEMENT_BYTES)     # bytes between rows; the innermost is implied
    box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
    steps = (ctypes.c_uint32 * 2)(1, 1)
    result = _encode_tiled()(ctypes.addressof(out), BFLOAT16, 2, ctypes.c_void_p(address), dims, strides, box, steps,
                             INTERLEAVE_NONE, SWIZZLE_128B, L2_PROMOTION_256B, OOB_FILL_NONE)
    if result != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled of a bf16 [{rows}, {cols}] tensor at {address:#x}, boxes "
                           f"{box_rows} x {box_cols}: CUresult {result}")
    return bytes(out)
