// kernels/topk/radix.cuh -- the general path (any V <= 1024): one block of 1024 threads per row runs an exact radix
// select on the 50-bit composite (key, reversed id) over shared-memory histograms, gathers the V selected elements,
// sorts them (bitonic) and writes the row; the softmax statistics come with the first pass. general_impl<Tin>
// serves kdt_topk_general_{f32,bf16}. See plans/kernels/topk.md, "General path".
#pragma once

#include <float.h>
#include <stdint.h>

#include "common/bits.cuh"
#include "common/ptx.cuh"
#include "topk/config.cuh"
#include "topk/elements.cuh"
#include "topk/keys.cuh"
#include "topk/softmax.cuh"

namespace topk {

// The composite c = key << ID_BITS | (ID_MASK - id): larger c = better in (key desc, id asc); unique.
__device__ __forceinline__ unsigned long long comp(float x, int id) {
    return ((unsigned long long)f2key(x) << ID_BITS) | (unsigned long long)(ID_MASK - (uint32_t)id);
}

// The largest composite with key k (k's element of the smallest id).
__device__ __forceinline__ unsigned long long comp_ceiling(uint32_t k) {
    return ((unsigned long long)k << ID_BITS) | ID_MASK;
}

// Row `row`'s output at `place` from composite cc: its id and log-probability, with the row's softmax base bm and
// the log of its sum of exponentials lsum.
__device__ __forceinline__ void write_output(unsigned long long cc, int row, int V, int place, float bm, float lsum,
                                             int* __restrict__ top_ids, float* __restrict__ top_logp) {
    const size_t o = (size_t)row * V + place;
    top_ids[o] = (int)(ID_MASK - (uint32_t)(cc & ID_MASK));
    top_logp[o] = (key2f((uint32_t)(cc >> ID_BITS)) - bm) - lsum;
}

// Warp-uniform shared-memory histogram increment, aggregated over lanes hitting the same bin (real logits
// crowd into a few top-bit bins; plain atomics would serialise 32-way).
__device__ __forceinline__ void warp_hist_add(uint32_t* hist, uint32_t bin, bool ok, int lane) {
    if (!__any_sync(FULL, ok)) return;
    const uint32_t peers = __match_any_sync(FULL, ok ? bin : 0xffffffffu);
    if (ok && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (uint32_t)__popc(peers));
}

// The block barrier of the select's steps: __syncthreads where every thread comes from the same code (the general
// path), the divergent kind where warps entered from different places (the gate path's prune, see gate.cuh).
struct AlignedBarrier {
    __device__ __forceinline__ static void sync() { __syncthreads(); }
};
struct DivergentBarrier {
    __device__ __forceinline__ static void sync() { kdt::block_barrier_divergent(); }
};

// Exclusive prefix sum over the block in thread order (GEN_THREADS threads).
template <class Barrier>
__device__ __forceinline__ uint32_t block_excl_scan(uint32_t v, uint32_t* s_w, int lane, int warp) {
    const uint32_t inc = kdt::warp_inclusive_scan(v);
    if (lane == 31) s_w[warp] = inc;
    Barrier::sync();
    if (warp == 0) {
        const uint32_t t = kdt::warp_inclusive_scan(lane < GEN_WARPS ? s_w[lane] : 0u);
        if (lane < GEN_WARPS) s_w[lane] = t;
    }
    Barrier::sync();
    const uint32_t r = (warp ? s_w[warp - 1] : 0u) + inc - v;
    Barrier::sync();
    return r;
}

// The radix select of the `need` best composites among those for_each_comp visits (for_each_comp(f) calls f(cc, ok)
// for each, warp-uniformly), all of which share the top nb0 bits P0 (0, 0: none known): 11-bit digits below the
// prefix, each histogram over the elements that share the prefix chosen so far, until the chosen bin holds at most
// `slack` more than the number still needed (slack 0: exactly the `need` best; at most 50 bits). Returns the prefix
// P and its bits nb: the selected are the composites with (cc >> (COMP_BITS - nb)) >= P, need of them plus at most
// slack. Barrier: AlignedBarrier or DivergentBarrier. With first_ready, hist already holds the first digit's
// histogram (hist zero otherwise); hist is zero on return.
template <class Barrier, class ForEachComp>
__device__ __forceinline__ void radix_select(uint32_t need, uint32_t slack, bool first_ready, unsigned long long P0,
                                             int nb0, ForEachComp&& for_each_comp, uint32_t* hist, uint32_t* s_w,
                                             uint32_t& s_digit, uint32_t& s_above, unsigned long long& P, int& nb) {
    constexpr int T = GEN_THREADS;
    constexpr int BPT = GEN_BINS / T;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    P = P0;
    nb = nb0;
    int w = min(11, COMP_BITS - nb);
    // the histogram of the next digit over the elements with prefix P
    auto histogram = [&]() {
        const int shp = COMP_BITS - nb, shd = COMP_BITS - nb - w;
        const uint32_t mask = (1u << w) - 1u;
        const unsigned long long Pc = P;
        for_each_comp([&](unsigned long long cc, bool ok) {
            warp_hist_add(hist, (uint32_t)(cc >> shd) & mask, ok && (cc >> shp) == Pc, lane);
        });
        Barrier::sync();
    };
    if (!first_ready) histogram();
    for (;;) {
        const int nbins = 1 << w;
        uint32_t c = 0u;
#pragma unroll
        for (int q = 0; q < BPT; ++q) {
            const int idx = tid * BPT + q;
            if (idx < nbins) c += hist[nbins - 1 - idx];
        }
        const uint32_t ex = block_excl_scan<Barrier>(c, s_w, lane, warp);
        if (ex < need && need <= ex + c) {   // exactly one thread
            uint32_t run = ex;
#pragma unroll
            for (int q = 0; q < BPT; ++q) {
                const int idx = tid * BPT + q;
                if (idx < nbins) {
                    const uint32_t h = hist[nbins - 1 - idx];
                    if (run + h >= need) {
                        s_digit = (uint32_t)(nbins - 1 - idx);
                        s_above = run;
                        break;
                    }
                    run += h;
                }
            }
        }
        Barrier::sync();
        const uint32_t d = s_digit;
        const uint32_t hd = hist[d];
        need -= s_above;
        P = (P << w) | d;
        nb += w;
        Barrier::sync();
        for (int i = tid; i < GEN_BINS; i += T) hist[i] = 0u;
        Barrier::sync();
        if (hd - need <= slack) break;  // the bin is taken whole (at nb = 50 it holds one element: always)
        w = min(11, COMP_BITS - nb);
        histogram();
    }
}

// Bitonic sort, descending, of cand[0 .. p2) (p2 a power of two, 32 <= p2 <= GEN_THREADS: one element a thread)
// by the whole block: strides below 32 between the lanes of a warp (shuffles), the rest through shared memory
// (15 stages of block barriers at p2 = 1024 instead of 55).
__device__ __forceinline__ void bitonic_sort_desc(unsigned long long* cand, int p2) {
    const int tid = threadIdx.x;
    const bool mine = tid < p2;            // warp-uniform: p2 is a multiple of 32
    unsigned long long a = mine ? cand[tid] : 0ull;
    for (int k = 2; k <= p2; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            unsigned long long b;
            if (j >= 32) {
                __syncthreads();           // every read of the previous stage is done
                if (mine) cand[tid] = a;
                __syncthreads();
                b = mine ? cand[tid ^ j] : 0ull;
            } else {
                b = __shfl_xor_sync(FULL, a, j);
            }
            // the lower index of a pair keeps the larger in a descending run ((i & k) == 0), the smaller otherwise
            const bool lower = (tid & j) == 0, desc = (tid & k) == 0;
            a = (lower == desc) ? (a > b ? a : b) : (a < b ? a : b);
        }
    }
    __syncthreads();
    if (mine) cand[tid] = a;
    __syncthreads();
}

// cand[0..V) sorted descending (zeros padding to a power of two >= 32) and written as row `row`'s outputs: ids,
// and log-probs from the row's (max, sum-exp) in s_stat. cand holds at least max(p2, 32) entries.
__device__ __forceinline__ void sort_and_write(unsigned long long* cand, int V, const float* s_stat, int row,
                                               int* __restrict__ top_ids, float* __restrict__ top_logp) {
    constexpr int T = GEN_THREADS;
    const int tid = threadIdx.x;
    int p2 = 32;
    while (p2 < V) p2 <<= 1;
    for (int i = V + tid; i < p2; i += T) cand[i] = 0ull;
    __syncthreads();
    bitonic_sort_desc(cand, p2);
    const float bm = s_stat[0];
    const float lsum = logf(s_stat[1]);
    for (int r = tid; r < V; r += T) write_output(cand[r], row, V, r, bm, lsum, top_ids, top_logp);
}

// A row's top V (any V <= MAX_V) and log-probabilities from one block: pass 1 (statistics and the top digit),
// the refining passes of the radix select, the gather of exactly V elements, a bitonic sort, the outputs.
template <typename Tin>
__device__ __forceinline__ void general_impl(const Tin* __restrict__ logits, int* __restrict__ top_ids,
                                             float* __restrict__ top_logp, int vocab, int V) {
    using E = Elem<Tin>;
    constexpr int T = GEN_THREADS;
    constexpr int U = GEN_U;

    __shared__ uint32_t hist[GEN_BINS];
    __shared__ unsigned long long cand[MAX_V];
    __shared__ uint32_t s_w[GEN_WARPS];
    __shared__ float s_m[GEN_WARPS];
    __shared__ float s_s[GEN_WARPS];
    __shared__ float s_stat[2];
    __shared__ uint32_t s_digit, s_above, s_cnt;

    if (V < 1 || V > MAX_V || V > vocab || vocab > MAX_VOCAB) return;   // launcher bug guard

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int row = blockIdx.x;
    const Tin* rp = logits + (size_t)row * (size_t)vocab;

    // f(x, id, ok) on every slot of the row, called warp-uniformly (ok = false past the end of the row);
    // U coalesced scalar loads in flight per thread
    auto for_each = [&](auto&& f) {
        for (int b = 0; b < vocab; b += T * U) {
            float x[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int j = b + u * T + tid;
                x[u] = j < vocab ? E::load1(rp + j) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int j = b + u * T + tid;
                f(x[u], j, j < vocab);
            }
        }
    };

    for (int i = tid; i < GEN_BINS; i += T) hist[i] = 0u;
    __syncthreads();

    // pass 1: softmax statistics + histogram of the top 11 bits (= key >> 21)
    float m = -FLT_MAX, s = 0.0f;
    for (int b = 0; b < vocab; b += T * U) {
        float x[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = b + u * T + tid;
            ok[u] = j < vocab;
            x[u] = ok[u] ? E::load1(rp + j) : neg_inf();
        }
        float gm = x[0];
#pragma unroll
        for (int u = 1; u < U; ++u) gm = fmaxf(gm, x[u]);
        raise_max(m, s, gm);
        float ev[U];
#pragma unroll
        for (int u = 0; u < U; ++u) ev[u] = ex2((x[u] - m) * LOG2E);
        s += tree_sum(ev);
#pragma unroll
        for (int u = 0; u < U; ++u) warp_hist_add(hist, f2key(x[u]) >> 21, ok[u], lane);
    }
    warp_fold_stats(m, s);
    if (lane == 0) { s_m[warp] = m; s_s[warp] = s; }
    __syncthreads();
    if (warp == 0) fold_stats(s_m, s_s, GEN_WARPS, s_stat, lane);
    // (the __syncthreads inside block_excl_scan orders s_stat and hist)

    unsigned long long P;
    int nb;
    radix_select<AlignedBarrier>((uint32_t)V, 0u, true, 0ull, 0,
                 [&](auto&& f) { for_each([&](float x, int j, bool ok) { f(comp(x, j), ok); }); },
                 hist, s_w, s_digit, s_above, P, nb);

    // gather exactly V elements: prefix >= P
    if (tid == 0) s_cnt = 0u;
    __syncthreads();
    {
        const int shp = COMP_BITS - nb;
        const unsigned long long Pc = P;
        for_each([&](float x, int j, bool ok) {
            const unsigned long long cc = comp(x, j);
            const bool sel = ok && (cc >> shp) >= Pc;
            const uint32_t bal = __ballot_sync(FULL, sel);
            if (bal) {
                uint32_t b0 = 0u;
                if (lane == __ffs(bal) - 1) b0 = atomicAdd(&s_cnt, (uint32_t)__popc(bal));
                b0 = __shfl_sync(FULL, b0, __ffs(bal) - 1);
                const uint32_t slot = b0 + (uint32_t)__popc(bal & ((1u << lane) - 1u));
                if (sel && slot < (uint32_t)MAX_V) cand[slot] = cc;
            }
        });
    }
    __syncthreads();
    sort_and_write(cand, V, s_stat, row, top_ids, top_logp);
}

}  // namespace topk
