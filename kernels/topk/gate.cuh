// kernels/topk/gate.cuh -- the gate path (32 < V <= 1024, rows 16-byte aligned): one block of 1024 threads per row
// reads the row once, in 16-byte vectors, and keeps in a shared buffer every element whose composite reaches the
// gate, a lower bound of the V-th best composite so far; when the buffer fills, a radix select prunes it to its V
// best and raises the gate. The softmax statistics ride in the same pass; the last prune, a sort and the outputs
// end it. Exact: an element below the gate is below V kept ones. gate_impl<Tin> serves kdt_topk_gate_{f32,bf16}.
// Plan and the share of a row a gate lets through: plans/kernels/topk.md, "Wide V".
#pragma once

#include <float.h>
#include <stdint.h>

#include "topk/config.cuh"
#include "topk/elements.cuh"
#include "topk/keys.cuh"
#include "topk/radix.cuh"
#include "topk/softmax.cuh"

namespace topk {

// The buffer's entries for V (the launcher sizes the dynamic shared memory by it: 8 bytes an entry): room for a
// sub-step's appends (GATE_SLACK) above the prune mark, which leaves at least 4 V (or 1,024) entries between prunes
// (kdt/launch/topk.py computes the same from the exported constants).
__host__ __device__ constexpr int gate_capacity(int V) {
    return GATE_SLACK + (GATE_ROOM_PER_V * V > GATE_MIN_ROOM ? GATE_ROOM_PER_V * V : GATE_MIN_ROOM);
}

// buf[0..n) pruned to its V best (n > V), in place; returns the new gate (the selected prefix as a composite lower
// bound: every kept composite reaches it, every dropped one is below it). `keep` holds V entries (the histogram's
// bytes, free between selects).
__device__ __forceinline__ unsigned long long gate_prune(unsigned long long* buf, uint32_t n, int V, uint32_t* hist,
                                                         unsigned long long* keep, uint32_t* s_w, uint32_t& s_digit,
                                                         uint32_t& s_above, uint32_t& s_cnt) {
    constexpr int T = GATE_THREADS;
    const int tid = threadIdx.x, lane = tid & 31;
    unsigned long long P;
    int nb;
    radix_select((uint32_t)V, false,
                 [&](auto&& f) {
                     for (uint32_t b = 0; b < n; b += T) {
                         const uint32_t i = b + tid;
                         f(i < n ? buf[i] : 0ull, i < n);
                     }
                 },
                 hist, s_w, s_digit, s_above, P, nb);
    // hist is zero again: its bytes hold the V kept while buf is rewritten
    const int shp = COMP_BITS - nb;
    if (tid == 0) s_cnt = 0u;
    __syncthreads();
    for (uint32_t b = 0; b < n; b += T) {
        const uint32_t i = b + tid;
        const unsigned long long cc = i < n ? buf[i] : 0ull;
        const bool sel = i < n && (cc >> shp) >= P;
        const uint32_t bal = __ballot_sync(FULL, sel);
        if (bal) {
            uint32_t b0 = 0u;
            if (lane == __ffs(bal) - 1) b0 = atomicAdd(&s_cnt, (uint32_t)__popc(bal));
            b0 = __shfl_sync(FULL, b0, __ffs(bal) - 1);
            const uint32_t slot = b0 + (uint32_t)__popc(bal & ((1u << lane) - 1u));
            if (sel && slot < (uint32_t)MAX_V) keep[slot] = cc;
        }
    }
    __syncthreads();
    for (int i = tid; i < V; i += T) buf[i] = keep[i];
    __syncthreads();
    for (int i = tid; i < V * 2; i += T) hist[i] = 0u;   // keep's bytes: the histogram again
    if (tid == 0) s_cnt = (uint32_t)V;
    __syncthreads();
    return P << shp;
}

// A row's top V and log-probabilities from one block and one read: buf (dynamic shared memory) holds `capacity`
// entries, gate_capacity(V).
template <typename Tin>
__device__ __forceinline__ void gate_impl(const Tin* __restrict__ logits, int* __restrict__ top_ids,
                                          float* __restrict__ top_logp, int vocab, int V, int capacity) {
    using E = Elem<Tin>;
    constexpr int T = GATE_THREADS;
    constexpr int U = GATE_U;
    constexpr int W = E::W;
    constexpr int QUADS = W / GATE_SUB;                // a vector's sub-steps of GATE_SUB elements
    static_assert(W % GATE_SUB == 0, "whole sub-steps per vector");

    extern __shared__ unsigned long long buf[];
    __shared__ uint32_t hist[GEN_BINS];                // also the V kept while a prune rewrites buf
    __shared__ uint32_t s_w[GEN_WARPS];
    __shared__ float s_m[GEN_WARPS];
    __shared__ float s_s[GEN_WARPS];
    __shared__ float s_stat[2];
    __shared__ uint32_t s_digit, s_above, s_cnt;
    static_assert(GEN_BINS * 4 >= MAX_V * 8, "the histogram's bytes hold V kept composites");
    unsigned long long* const keep = reinterpret_cast<unsigned long long*>(hist);

    if (V < 1 || V > MAX_V || V > vocab || vocab > MAX_VOCAB || vocab % W || capacity < gate_capacity(V))
        return;   // launcher bug guard

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int row = blockIdx.x;
    const typename E::Vec* rp = reinterpret_cast<const typename E::Vec*>(logits + (size_t)row * (size_t)vocab);
    const int vectors = vocab / W;
    const uint32_t mark = (uint32_t)(capacity - GATE_SLACK);   // prune once the buffer holds more

    for (int i = tid; i < GEN_BINS; i += T) hist[i] = 0u;
    if (tid == 0) s_cnt = 0u;
    __syncthreads();

    float m = -FLT_MAX, s = 0.0f;
    unsigned long long gate = 0ull;                      // every composite reaches 0 (-inf's key is above it)
    for (int first = 0; first < vectors; first += T * U) {
        typename E::Vec v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = first + u * T + tid;
            v[u] = i < vectors ? __ldg(rp + i) : E::ninf_vec();
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = first + u * T + tid;
            const bool live = i < vectors;
            float x[W];
            E::unpack(v[u], x);
            float gm = x[0];
#pragma unroll
            for (int e = 1; e < W; ++e) gm = fmaxf(gm, x[e]);
            raise_max(m, s, gm);
            float ev[W];
#pragma unroll
            for (int e = 0; e < W; ++e) ev[e] = ex2((x[e] - m) * LOG2E);
            s += tree_sum(ev);
            // a vector whose largest key is below the gate's holds no candidate (most do once the gate has risen)
            const bool warp_maybe = __any_sync(FULL, live && f2key(gm) >= (uint32_t)(gate >> ID_BITS));
#pragma unroll
            for (int q = 0; q < QUADS; ++q) {
                // a sub-step: at most GATE_SUB appends a thread, then the block checks the buffer's fill
                uint32_t filled = 0u;
#pragma unroll
                for (int e = q * GATE_SUB; e < (q + 1) * GATE_SUB && warp_maybe; ++e) {
                    const unsigned long long cc = comp(x[e], i * W + e);
                    const bool sel = live && cc >= gate;
                    const uint32_t bal = __ballot_sync(FULL, sel);
                    if (bal) {
                        uint32_t b0 = 0u;
                        if (lane == __ffs(bal) - 1) b0 = atomicAdd(&s_cnt, (uint32_t)__popc(bal));
                        b0 = __shfl_sync(FULL, b0, __ffs(bal) - 1);
                        const uint32_t slot = b0 + (uint32_t)__popc(bal & ((1u << lane) - 1u));
                        if (sel) buf[slot] = cc;
                        filled = max(filled, b0 + (uint32_t)__popc(bal));
                    }
                }
                // the fill only grows: the largest a warp saw is the block's once every warp has added
                if (__syncthreads_or(filled > mark)) gate = gate_prune(buf, s_cnt, V, hist, keep, s_w, s_digit,
                                                                       s_above, s_cnt);
            }
        }
    }
    warp_fold_stats(m, s);
    if (lane == 0) { s_m[warp] = m; s_s[warp] = s; }
    __syncthreads();
    if (warp == 0) fold_stats(s_m, s_s, GEN_WARPS, s_stat, lane);
    const uint32_t n = s_cnt;                              // >= V: every element above the gate is in buf
    if (n > (uint32_t)V) gate_prune(buf, n, V, hist, keep, s_w, s_digit, s_above, s_cnt);
    __syncthreads();
    sort_and_write(buf, V, s_stat, row, top_ids, top_logp);
}

}  // namespace topk
