// kernels/common/bits.cuh -- small helpers the kernels share: float bit casts, the order-preserving uint32 key of
// a float, and a warp-wide inclusive prefix sum. Device-only, header-only, __forceinline__.
#pragma once

#include <stdint.h>

namespace kdt {

__device__ __forceinline__ float bits_to_float(uint32_t u) { return __uint_as_float(u); }

__device__ __forceinline__ uint32_t float_to_bits(float f) { return __float_as_uint(f); }

// Order-preserving key: a > b as floats (not NaN, -0.0 != +0.0 here) iff ordered_key(a) > ordered_key(b) as
// unsigned integers. Negative floats: ~bits; the rest: bits | 0x80000000. Callers map -0.0 or -inf as they need.
__device__ __forceinline__ uint32_t ordered_key(float x) {
    const uint32_t u = float_to_bits(x);
    return u ^ ((uint32_t)((int32_t)u >> 31) | 0x80000000u);
}

// Inverse of ordered_key.
__device__ __forceinline__ float ordered_float(uint32_t k) {
    return bits_to_float((k & 0x80000000u) ? (k ^ 0x80000000u) : ~k);
}

// Inclusive prefix sum over the 32 lanes of a full warp, in lane order.
template <typename T>
__device__ __forceinline__ T warp_inclusive_scan(T v) {
    const int lane = (int)(threadIdx.x & 31u);
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
        const T other = __shfl_up_sync(0xffffffffu, v, offset);
        if (lane >= offset) v += other;
    }
    return v;
}

}  // namespace kdt
