// kernels/topk/gate_maxima.cuh -- the bf16 gate kernels on the 227 KB parts (GATE_BF16_MAXIMA_BYTES > 0): the gate
// from the whole row's vector maxima. The scan keeps each vector's maximum (one bf16 in shared memory) beside the
// softmax and tests nothing. After it, the key of the V-th best maximum is the gate: V vectors hold an element at
// least that good, so it is a lower bound of the V-th best element, and at V = 1,024 of 20,480 vectors only ~5% of
// the vectors reach it. Then only those vectors are read again (from L2, mostly), tested and appended. On rows of real
// logits the buffer gets ~1.5 V entries, below the mark: no prune, and no gate opened at the first step. Exact: an
// element below the gate is below V others. Used by gate_impl (topk/gate.cuh), which supplies the append. Design,
// figures: plans/kernels/topk.md, "The gate from the row's maxima".
#pragma once

#include <stdint.h>

#include "common/ptx.cuh"
#include "topk/config.cuh"
#include "topk/elements.cuh"
#include "topk/keys.cuh"
#include "topk/radix.cuh"
#include "topk/softmax.cuh"

namespace topk {

// The thread's vector j of its scan (step j / GATE_U, vector j % GATE_U of it) as an index into the row's vectors.
// Its maximum is at maxima[j * GATE_THREADS] (maxima: the block's array + threadIdx.x); j < 32 (vocab <= 2^18).
__device__ __forceinline__ int scan_vector(int j, int warp_first, int lane) {
    return (j / GATE_U) * GATE_THREADS * GATE_U + warp_first + (j % GATE_U) * 32 + lane;
}

// One group of NV vectors of the scan (vector u: the thread's vector j0 + u): the running maximum and the rare
// rescale of the softmax base behind one warp vote, each vector's maximum stored, then the exponentials.
template <int NV>
__device__ __forceinline__ void scan_group_maxima(const uint4 (&v)[NV], Softmax& sm, uint16_t* maxima, int j0) {
    using E = Elem<uint16_t>;
    uint32_t vm[NV];
#pragma unroll
    for (int u = 0; u < NV; ++u) vm[u] = E::vmax(v[u]);
    uint32_t top = vm[0];
#pragma unroll
    for (int u = 1; u < NV; ++u) top = E::vmax2(top, vm[u]);
    const float gm = E::vmax_float(top);
    sm.m = fmaxf(sm.m, gm);
    const bool rebase = sm.needs_rebase(gm);
    if (__any_sync(FULL, rebase)) sm.rebase_warp(rebase, gm);
#pragma unroll
    for (int u = 0; u < NV; ++u)
        maxima[(j0 + u) * GATE_THREADS] = (uint16_t)(__float_as_uint(E::vmax_float(vm[u])) >> 16);
    add_group<E>(sm, v);
}

// The 16-bit ordered key of a bf16 value (its float key's high half: f2key of a bf16 value has a constant low half).
__device__ __forceinline__ uint32_t key16(uint32_t bf16) { return f2key(__uint_as_float(bf16 << 16)) >> 16; }

// The gate from the block's maxima (the thread's steps * GATE_U, those of vectors past the end left out): the V-th
// best maximum's value, as the composite that admits every id of it. One histogram of the GEN_BINS bf16 values at and
// below the block's largest maximum (a bin a value: on real rows the top maxima spread over hundreds of bins, so
// plain atomics seldom collide), one block scan from the top; where fewer than V maxima lie that close (a row spread
// over more than GEN_BINS bf16 steps), the radix select over them all. Block-wide, with aligned barriers: every thread
// comes from the end of its scan. hist is zero on entry and on return; warp_sum is scratch.
__device__ __forceinline__ unsigned long long gate_from_row_maxima(const uint16_t* maxima, int warp_first, int lane,
                                                                   int vectors, int steps, int V, uint32_t* hist,
                                                                   uint32_t* warp_sum, uint32_t& digit,
                                                                   uint32_t& above) {
    constexpr int T = GATE_THREADS;
    static_assert(GEN_BINS == 2 * T && GATE_WARPS == 32, "two bins a thread; a warp folds the warps' maxima");
    const int tid = threadIdx.x, warp = tid >> 5;
    const int J = steps * GATE_U;
    uint32_t top = 0u;
    for (int j = 0; j < J; ++j)
        if (scan_vector(j, warp_first, lane) < vectors) top = max(top, key16(maxima[j * T]));
    top = __reduce_max_sync(FULL, top);
    if (lane == 0) warp_sum[warp] = top;
    __syncthreads();
    top = __reduce_max_sync(FULL, warp_sum[lane]);
    for (int j = 0; j < J; ++j) {
        const uint32_t d = top - key16(maxima[j * T]);   // the bin: bf16 steps below the top
        if (scan_vector(j, warp_first, lane) < vectors && d < (uint32_t)GEN_BINS) atomicAdd(&hist[d], 1u);
    }
    __syncthreads();
    const uint32_t h0 = hist[2 * tid], h1 = hist[2 * tid + 1];
    const uint32_t ex = block_excl_scan<AlignedBarrier>(h0 + h1, warp_sum, lane, warp);
    const bool mine = ex < (uint32_t)V && (uint32_t)V <= ex + h0 + h1;   // one thread at most
    if (mine) digit = 2u * (uint32_t)tid + (ex + h0 >= (uint32_t)V ? 0u : 1u);
    hist[2 * tid] = hist[2 * tid + 1] = 0u;
    if (__syncthreads_or(mine)) {
        const uint32_t k = top - digit;                  // the V-th best maximum's 16-bit key
        return (unsigned long long)((k << 16) | ((k & 0x8000u) ? 0u : 0xffffu)) << ID_BITS;
    }
    unsigned long long P;
    int nb;
    radix_select<AlignedBarrier>((uint32_t)V, (uint32_t)V, false, 0ull, 0,
                 [&](auto&& f) {
                     for (int j = 0; j < J; ++j) {   // (key, a tag unique in the block)
                         const uint32_t m = (uint32_t)maxima[j * T] << 16;
                         f(((unsigned long long)f2key(__uint_as_float(m)) << ID_BITS) |
                               (ID_MASK - ((uint32_t)tid * 32u + (uint32_t)j)),
                           scan_vector(j, warp_first, lane) < vectors);
                     }
                 },
                 hist, warp_sum, digit, above, P, nb);
    return ((P << (COMP_BITS - nb)) >> ID_BITS) << ID_BITS;
}

// Every vector of the thread whose maximum reaches gf (x >= gf: ties too, their ids are tested by the caller),
// loaded again and handed to append(v, index, mine) in warp-uniform rounds of GATE_U vectors a lane, their loads in
// flight together (index: in the row's vectors; mine[q]: the lane has a vector in slot q of the round).
template <class Append>
__device__ __forceinline__ void gather_hot(const uint4* rp, const uint16_t* maxima, int warp_first, int lane,
                                           int vectors, int steps, float gf, Append&& append) {
    uint32_t hot = 0u;
    for (int j = 0; j < steps * GATE_U; ++j) {
        const bool reach = scan_vector(j, warp_first, lane) < vectors &&
                           __uint_as_float((uint32_t)maxima[j * GATE_THREADS] << 16) >= gf;
        hot |= (reach ? 1u : 0u) << j;
    }
    while (__any_sync(FULL, hot != 0u)) {
        uint4 v[GATE_U];
        int index[GATE_U];
        bool mine[GATE_U];
#pragma unroll
        for (int q = 0; q < GATE_U; ++q) {
            mine[q] = hot != 0u;
            index[q] = mine[q] ? scan_vector(__ffs(hot) - 1, warp_first, lane) : 0;
            hot &= hot - 1u;
            v[q] = mine[q] ? __ldg(rp + index[q]) : Elem<uint16_t>::ninf_vec();
        }
        append(v, index, mine);
    }
}

}  // namespace topk
