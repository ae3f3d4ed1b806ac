// kernels/topk/keys.cuh -- the one order every path ranks by: a logit's order-preserving uint32 key (f2key,
// key2f), the strict order (key desc, id asc) on (key, id) pairs (better), and a warp's best pair. Used by every
// entry point. Why -0.0 and -inf map as they do: plans/kernels/topk.md, "Ordering key".
#pragma once

#include <stdint.h>

#include "common/bits.cuh"
#include "topk/config.cuh"

namespace topk {

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Order-preserving float -> uint32 (larger float -> larger key), -0.0 mapped to +0.0 first; -inf -> 0x007fffff,
// so key 0 lies below every legal logit and marks an empty slot.
__device__ __forceinline__ uint32_t f2key(float x) {
    return kdt::ordered_key(__fadd_rn(x, 0.0f));     // -0 + +0 = +0 (round to nearest)
}
__device__ __forceinline__ float key2f(uint32_t k) { return kdt::ordered_float(k); }

// (ka, ia) strictly before (kb, ib) in (key desc, id asc).
__device__ __forceinline__ bool better(uint32_t ka, uint32_t ia, uint32_t kb, uint32_t ib) {
    return ka > kb || (ka == kb && ia < ib);
}

// (key, id) of the best entry over a warp: the largest key, then the smallest id.
__device__ __forceinline__ uint2 warp_best(uint32_t k, uint32_t i) {
    const uint32_t best_k = __reduce_max_sync(FULL, k);
    return make_uint2(best_k, __reduce_min_sync(FULL, k == best_k ? i : ~0u));
}

}  // namespace topk
