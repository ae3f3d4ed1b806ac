// kernels/tree_accept/argmax.cuh -- the fused split-vocab argmax of tree_accept_from_logits: each block's scan of
// its part of one row (16-byte streaming loads, bf16 or float32), the block's reduction, the merge into the
// per-slot workspace keys with the last-block election, and the last block's staging of the walk's rows. See
// plans/kernels/tree-accept.md, "The fused argmax".
#pragma once

#include <stdint.h>

#include "common/bits.cuh"
#include "common/ptx.cuh"
#include "tree_accept/config.cuh"
#include "tree_accept/walk.cuh"

namespace {

using kdt::bf16x2_max;
using kdt::bits_to_float;
using kdt::float_to_bits;

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    return __ldcs(p);  // read once: evict-first
}

// Element e of a 16-byte vector as float.
template <bool kBf16>
__device__ __forceinline__ float vec_elem(const uint4& q, int e) {
    const uint32_t w = (e >> (kBf16 ? 1 : 0)) == 0 ? q.x : (e >> (kBf16 ? 1 : 0)) == 1 ? q.y
                     : (e >> (kBf16 ? 1 : 0)) == 2 ? q.z : q.w;
    if constexpr (kBf16) {
        return bits_to_float((e & 1) ? (w & 0xFFFF0000u) : (w << 16));
    } else {
        return bits_to_float(w);
    }
}

// The max of a 16-byte vector. bf16: 3 max.bf16x2 and one fmax (NaN never reaches the kernel; which zero
// max(-0, +0) returns does not matter: all later comparisons are float comparisons, where -0.0 == +0.0).
template <bool kBf16>
__device__ __forceinline__ float vec_max(const uint4& q) {
    if constexpr (kBf16) {
        const uint32_t m = bf16x2_max(bf16x2_max(q.x, q.y), bf16x2_max(q.z, q.w));
        return fmaxf(bits_to_float(m << 16), bits_to_float(m & 0xFFFF0000u));
    } else {
        return fmaxf(fmaxf(bits_to_float(q.x), bits_to_float(q.y)), fmaxf(bits_to_float(q.z), bits_to_float(q.w)));
    }
}

// (av, ai) beats (bv, bi): larger value, then smaller index; -0.0 == +0.0 (float comparison).
__device__ __forceinline__ bool beats(float av, int ai, float bv, int bi) {
    return av > bv || (av == bv && ai < bi);
}

// 64-bit key whose unsigned order is the `beats` order: order-preserving float bits, then ~index.
__device__ __forceinline__ unsigned long long pack_key(float v, int idx) {
    uint32_t u = (v == 0.0f) ? 0u : float_to_bits(v);  // -0.0 -> +0.0
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);      // kdt::ordered_key's map, in the form kept verified
    return (static_cast<unsigned long long>(u) << 32) | static_cast<unsigned long long>(~static_cast<uint32_t>(idx));
}

__device__ __forceinline__ int key_index(unsigned long long key) {
    return static_cast<int>(~static_cast<uint32_t>(key));
}

// The argmax (value, index) that thread `tid` of `nthreads` sees in split `split` of `splits` of one row.
// `row` is the row's first element (any element-size alignment). Indices are row-relative.
// Vectors handled by a thread are visited in ascending order and a vector replaces the thread's best only
// when its max is strictly larger, so the thread keeps the first occurrence of its maximum.
template <bool kBf16>
__device__ __forceinline__ void scan_row_part(const void* row, int vocab, int split, int splits, int tid,
                                              int nthreads, float& best, int& best_idx) {
    constexpr int kElem = kBf16 ? 2 : 4;
    constexpr int kVec = 16 / kElem;
    constexpr uint32_t kNegInf = kBf16 ? 0xFF80FF80u : 0xFF800000u;  // -inf in every lane of a word
    const unsigned char* bytes = static_cast<const unsigned char*>(row);
    const uintptr_t addr = reinterpret_cast<uintptr_t>(bytes);
    int head = static_cast<int>(((16u - static_cast<uint32_t>(addr & 15u)) & 15u) / kElem);
    head = head < vocab ? head : vocab;
    const int nvec = (vocab - head) / kVec;
    const int tail = head + nvec * kVec;
    const int chunk = (nvec + splits - 1) / splits;
    const int v0 = split * chunk < nvec ? split * chunk : nvec;
    const int v1 = v0 + chunk < nvec ? v0 + chunk : nvec;
    const uint4* vp = reinterpret_cast<const uint4*>(bytes + static_cast<size_t>(head) * kElem);

    float bv = bits_to_float(0xFF800000u);  // -inf
    int bvi = v0 + tid;                     // first vector of this thread (>= v1: none)
    uint4 bq = make_uint4(kNegInf, kNegInf, kNegInf, kNegInf);
    int v = v0 + tid;
#pragma unroll 1
    for (; v + (kArgmaxUnroll - 1) * nthreads < v1; v += kArgmaxUnroll * nthreads) {
        uint4 q[kArgmaxUnroll];
#pragma unroll
        for (int u = 0; u < kArgmaxUnroll; ++u) q[u] = load_stream(vp + v + u * nthreads);
#pragma unroll
        for (int u = 0; u < kArgmaxUnroll; ++u) {
            const float m = vec_max<kBf16>(q[u]);
            if (m > bv) {
                bv = m;
                bvi = v + u * nthreads;
                bq = q[u];
            }
        }
    }
#pragma unroll 1
    for (; v < v1; v += nthreads) {
        const uint4 q = load_stream(vp + v);
        const float m = vec_max<kBf16>(q);
        if (m > bv) {
            bv = m;
            bvi = v;
            bq = q;
        }
    }
    // Resolve the position inside the winning vector (the first element equal to its max; the initial
    // all -inf vector stands for "every value of this thread is -inf": its first element then).
    int bi = kIntMax;
    if (bvi < v1) {
        int k = kVec - 1;
#pragma unroll
        for (int e = kVec - 1; e >= 0; --e)
            if (vec_elem<kBf16>(bq, e) == bv) k = e;
        bi = head + bvi * kVec + k;
    } else {
        bv = bits_to_float(0xFF800000u);
    }
    // Scalar head and tail (fewer than 2 * kVec elements per row), by split 0.
    if (split == 0) {
        for (int e = tid; e < head; e += nthreads) {
            const float x =
                kBf16 ? bits_to_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(bytes)[e]) << 16)
                      : reinterpret_cast<const float*>(bytes)[e];
            if (beats(x, e, bv, bi)) { bv = x; bi = e; }
        }
        for (int e = tail + tid; e < vocab; e += nthreads) {
            const float x =
                kBf16 ? bits_to_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(bytes)[e]) << 16)
                      : reinterpret_cast<const float*>(bytes)[e];
            if (beats(x, e, bv, bi)) { bv = x; bi = e; }
        }
    }
    best = bv;
    best_idx = bi;
}

// Phase 1: this block's argmax over its split of row `row` (g * N + slot). Each thread scans its vectors, each
// warp reduces its lanes' bests, lane 0 of each warp posts the warp's into red_v / red_i; then a block barrier.
// Thread 0's (bv, bi) is warp 0's best. (lane and warp come from the caller: computed here, they move in the
// instruction order and the SASS changes.)
__device__ __forceinline__ void block_part_argmax(const void* __restrict__ target_logits, int logits_bf16, int vocab,
                                                  int split, int splits, size_t row, int tid, int lane, int warp,
                                                  float* red_v, int* red_i, float& bv, int& bi) {
    if (logits_bf16) {
        const void* r = static_cast<const unsigned char*>(target_logits) + row * static_cast<size_t>(vocab) * 2u;
        scan_row_part<true>(r, vocab, split, splits, tid, kArgmaxThreads, bv, bi);
    } else {
        const void* r = static_cast<const unsigned char*>(target_logits) + row * static_cast<size_t>(vocab) * 4u;
        scan_row_part<false>(r, vocab, split, splits, tid, kArgmaxThreads, bv, bi);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_down_sync(0xFFFFFFFFu, bv, off);
        const int oi = __shfl_down_sync(0xFFFFFFFFu, bi, off);
        if (beats(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) { red_v[warp] = bv; red_i[warp] = bi; }
    __syncthreads();
}

// Phase 2: thread 0 folds the other warps' bests into its (bv, bi), merges the block's (value, index) into the
// workspace key of its row with atomicMax, then counts the block on its request (key before count: a fence).
// Returns, block-uniform after a barrier, whether this block is the last of request g (the count reached N * S).
__device__ __forceinline__ bool merge_part_argmax(float& bv, int& bi, const float* red_v, const int* red_i,
                                                  unsigned long long* keys, unsigned int* counts, size_t row, int g,
                                                  int n, int splits, int tid, int& is_last) {
    if (tid == 0) {
        for (int w = 1; w < kArgmaxThreads / 32; ++w)
            if (beats(red_v[w], red_i[w], bv, bi)) { bv = red_v[w]; bi = red_i[w]; }
        atomicMax(keys + row, pack_key(bv, bi));
        __threadfence();  // the key before the count
        const unsigned int done = atomicAdd(counts + g, 1u);
        is_last = (done == static_cast<unsigned int>(n) * static_cast<unsigned int>(splits) - 1u) ? 1 : 0;
    }
    __syncthreads();
    return is_last;
}

// The last block of request g: stages the tree rows with the argmax read back from the workspace (atomicExch:
// read and leave zero), zeroes the path bitmap and the request's counter, then a block barrier. The workspace
// is all-zero again once every request's last block has run.
__device__ __forceinline__ void stage_argmax_rows(WalkSmem& s, unsigned long long* keys, unsigned int* counts, int g,
                                                  int n, int tid, const int* __restrict__ token,
                                                  const int* __restrict__ first_child,
                                                  const int* __restrict__ next_sibling) {
    __threadfence();       // every other block of request g has published its key
    const size_t base = static_cast<size_t>(g) * static_cast<size_t>(n);
    for (int j = tid; j < n; j += kArgmaxThreads) {  // <= kMaxNodes / 256 rounds
        const unsigned long long key = atomicExch(keys + base + j, 0ull);  // read and leave zero
        s.rec[j] = make_rec(__ldg(token + base + j), __ldg(first_child + base + j), __ldg(next_sibling + base + j),
                            key_index(key), n);
    }
    for (int w = tid; w < (n + 31) / 32; w += kArgmaxThreads) s.path[w] = 0u;
    if (tid == 0) atomicExch(counts + g, 0u);
    __syncthreads();
}

}  // namespace
