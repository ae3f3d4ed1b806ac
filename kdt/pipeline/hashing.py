"""Counter-based hashing: the same uint32 arithmetic in numpy, CuPy and kernels/synthetic_target.cu.

All the pipeline's randomness (the target's n-gram buckets, the drafter's choices and noise) is a hash of what it
is for, so the numpy and CuPy versions of the models give the same numbers without sharing a generator.
"""

from __future__ import annotations

import numpy as np

MASK32 = 0xFFFFFFFF
_M1, _M2 = 0x7FEB352D, 0x846CA68B


def mix_int(x: int) -> int:
    """lowbias32 on a Python int (scalars stay in Python: numpy scalars warn on the intended overflow)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * _M1) & MASK32
    x ^= x >> 15
    x = (x * _M2) & MASK32
    return x ^ (x >> 16)


def mix(x):
    """lowbias32 on a uint32 array (numpy or CuPy): multiplication wraps modulo 2**32."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(_M1)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(_M2)
    return x ^ (x >> np.uint32(16))


def counter_key(*parts: int) -> int:
    """One uint32 key for a tuple of integers (seed, salt, step, ...)."""
    x = 0
    for part in parts:
        x = mix_int(x ^ (part & MASK32))
    return x


def hash_of(xp, key: int, *arrays):
    """Hash of (key, arrays...) elementwise, broadcast; at least one array (1-d or more). The array is always
    the left operand, so a numpy scalar never has to dispatch to a CuPy array."""
    x = None
    for array in arrays:
        part = array.astype(xp.uint32)
        x = mix(part ^ np.uint32(key) if x is None else x ^ part)
    return x


def uniform(xp, key: int, *arrays):
    """Uniform in [0, 1) with 24 bits, float64: `u < 1.0` always holds and `u < 0.0` never does."""
    return (hash_of(xp, key, *arrays) >> np.uint32(8)).astype(xp.float64) * 2.0**-24
