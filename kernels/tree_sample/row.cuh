// kernels/tree_sample/row.cuh -- a row of logits as the draw sees it: the block and cluster shape, the order of a
// draw as one 64-bit value, and the loop that hands each logit of a block's chunk to a pass. Used by
// tree_sample/draw.cuh; design: plans/kernels/tree-sample.md.
#pragma once

#include <stdint.h>

#include "common/bits.cuh"

namespace ts {

constexpr int THREADS = 512;
constexpr int WARPS = THREADS / 32;
constexpr int CLUSTER_MAX = 8;       // the largest cluster (sm_120's portable size): shared arrays are sized for it

// A draw's cluster shape: CLUSTER blocks per row, UNROLL 16-byte loads in flight per thread (a bf16 chunk at vocab
// 163840 in one batch).
template <int CLUSTER_, int UNROLL_>
struct Shape {
    static constexpr int CLUSTER = CLUSTER_, UNROLL = UNROLL_;
    static_assert(CLUSTER <= CLUSTER_MAX, "cluster shape");
};
using Eight = Shape<8, 5>;           // the walk; the every-slot path at two blocks a multiprocessor (many rows)
using Six = Shape<6, 7>;             // the every-slot path at one block a multiprocessor (the plan: six_block_waves)

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(uint16_t bits) { return kdt::bits_to_float(static_cast<uint32_t>(bits) << 16); }

// The order of a draw, z descending then id ascending, as one value (larger comes first): the order key of z
// (-0.0 taken as +0.0, so the id decides between them) above ~id.
__device__ __forceinline__ uint32_t order_key(float z) { return kdt::ordered_key(z == 0.f ? 0.f : z); }
__device__ __forceinline__ unsigned long long packed(uint32_t key, int t) {
    return (static_cast<unsigned long long>(key) << 32) | static_cast<uint32_t>(~t);
}
__device__ __forceinline__ uint32_t key_of(unsigned long long p) { return static_cast<uint32_t>(p >> 32); }
__device__ __forceinline__ int token_of(unsigned long long p) { return static_cast<int>(~static_cast<uint32_t>(p)); }

// Element k of a 16-byte vector of logits (k at run time: selects, no local memory).
__device__ __forceinline__ float element(const uint4& v, int k, const float*) {
    return kdt::bits_to_float(k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w);
}
__device__ __forceinline__ float element(const uint4& v, int k, const uint16_t*) {
    const int half = k >> 1;
    const uint32_t word = half == 0 ? v.x : half == 1 ? v.y : half == 2 ? v.z : v.w;
    return kdt::bits_to_float((k & 1) ? (word & 0xFFFF0000u) : (word << 16));
}

// The loop every pass shares: where row + begin is 16-byte aligned, the whole 16-byte vectors of [begin, end) in
// batches of UNROLL loads in flight per thread, batch(first, w, vectors) for each (w[u] is vector first + u *
// THREADS + thread, zero past `vectors`); then scalar(t, x, live) for the rest, one logit at a time. Trip counts
// are the same for every thread of the block (`live` says whether a thread's item is real), so both may use
// warp-wide primitives.
template <int UNROLL, typename Tin, class Batch, class Scalar>
__device__ __forceinline__ void for_each_batch(const Tin* __restrict__ row, int begin, int end, Batch&& batch,
                                               Scalar&& scalar) {
    constexpr int PER = 16 / static_cast<int>(sizeof(Tin));
    int scalar_from = begin;
    if (begin < end && (reinterpret_cast<uintptr_t>(row + begin) & 15u) == 0) {
        const int vectors = (end - begin) / PER;
        const uint4* vec = reinterpret_cast<const uint4*>(row + begin);
        for (int first = 0; first < vectors; first += THREADS * UNROLL) {
            uint4 w[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int i = first + u * THREADS + static_cast<int>(threadIdx.x);
                w[u] = i < vectors ? __ldg(vec + i) : make_uint4(0u, 0u, 0u, 0u);
            }
            batch(first, w, vectors);
        }
        scalar_from = begin + vectors * PER;
    }
    for (int first = scalar_from; first < end; first += THREADS) {
        const int t = first + static_cast<int>(threadIdx.x);
        scalar(t, t < end ? to_float(row[t]) : 0.f, t < end);
    }
}

// pass(t, x, live) for every logit t in [begin, end) of `row`, x as float32 (lanes past the end: live = false).
// The loops over a batch are kept rolled (the batch shifts through w[0]) so that each pass is compiled twice, not
// UNROLL x 8 times: the draw's passes then fit the instruction cache.
template <int UNROLL, typename Tin, class Pass>
__device__ __forceinline__ void for_each_logit(const Tin* __restrict__ row, int begin, int end, Pass&& pass) {
    constexpr int PER = 16 / static_cast<int>(sizeof(Tin));
    for_each_batch<UNROLL>(
        row, begin, end,
        [&](int first, uint4 (&w)[UNROLL], int vectors) {
#pragma unroll 1
            for (int u = 0; u < UNROLL; ++u) {
                const uint4 v = w[0];
#pragma unroll
                for (int r = 0; r + 1 < UNROLL; ++r) w[r] = w[r + 1];
                const int i = first + u * THREADS + static_cast<int>(threadIdx.x);
#pragma unroll 1
                for (int k = 0; k < PER; ++k) pass(begin + i * PER + k, element(v, k, row), i < vectors);
            }
        },
        pass);
}

// vector(t0, w, live) for every whole 16-byte vector of [begin, end) (logits t0 .. t0 + PER - 1), then scalar(t,
// x, live) for the rest; where row + begin is not 16-byte aligned, scalar for all. For passes cheap enough per
// logit that a vector's worth of work should be one body.
template <int UNROLL, typename Tin, class Vector, class Scalar>
__device__ __forceinline__ void for_each_vector(const Tin* __restrict__ row, int begin, int end, Vector&& vector,
                                                Scalar&& scalar) {
    constexpr int PER = 16 / static_cast<int>(sizeof(Tin));
    for_each_batch<UNROLL>(
        row, begin, end,
        [&](int first, uint4 (&w)[UNROLL], int vectors) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int i = first + u * THREADS + static_cast<int>(threadIdx.x);
                vector(begin + i * PER, w[u], i < vectors);
            }
        },
        scalar);
}

}  // namespace ts
