// kernels/topk/select.cuh -- selection by rank, the building blocks of the small and cluster paths: the gate and
// the per-warp candidate buffer (Gate, warp_select, warp_compact), the block bound from the threads' maxima
// (block_bound), and the merges of sorted top-V lists (pruned_merge, falling back to rank_merge). place_by_rank
// (an entry's rank = the number of better entries) also serves the resident path. How each bound is proven
// safe: plans/kernels/topk.md, "Selection".
#pragma once

#include <stdint.h>

#include "topk/config.cuh"
#include "topk/keys.cuh"

namespace topk {

// The gate of a warp's candidate buffer: an element (k, id) is a candidate iff better(k, id, gk, gi); gi = ~0
// admits key ties. gf is the float image of gk for the one-compare group pre-test (x >= gf; -inf when gk == 0).
struct Gate {
    uint32_t gk, gi;
    float gf;
    __device__ __forceinline__ void set(uint32_t k, uint32_t i) {
        gk = k;
        gi = i;
        gf = k ? key2f(k) : neg_inf();
    }
};

// Entries first, first + stride, ... of buf[0 .. n) go to out_k/out_i[rank] when rank < limit, with rank = the
// number of entries better than it (ids are unique: the ranks are a permutation).
__device__ __forceinline__ void place_by_rank(const uint2* buf, uint32_t n, uint32_t first, uint32_t stride,
                                              uint32_t limit, uint32_t* out_k, uint32_t* out_i) {
    for (uint32_t e = first; e < n; e += stride) {
        const uint2 c = buf[e];
        uint32_t rank = 0;
        for (uint32_t j = 0; j < n; ++j) {
            const uint2 o = buf[j];
            rank += better(o.x, o.y, c.x, c.y) ? 1u : 0u;
        }
        if (rank < limit) {
            out_k[rank] = c.x;
            out_i[rank] = c.y;
        }
    }
}

// Warp-synchronous: the top-VT (best first) of buf[0 .. n) -> out_k/out_i[0 .. VT) (empty slots (0, ~0)).
template <int VT>
__device__ __forceinline__ void warp_select(const uint2* buf, uint32_t n, uint32_t* out_k, uint32_t* out_i, int lane) {
    for (uint32_t r = (uint32_t)lane; r < (uint32_t)VT; r += 32) {
        out_k[r] = 0u;
        out_i[r] = ~0u;
    }
    __syncwarp();
    place_by_rank(buf, n, (uint32_t)lane, 32u, (uint32_t)VT, out_k, out_i);
    __syncwarp();
}

// Warp-synchronous overflow guard: if the buffer could not take another full vector from every lane,
// shrink it to its top VT (via the scratch list out_k/out_i) and tighten the gate to its entry VT-1 (strict:
// later ties with larger ids are rejected).
template <int VT, int VW>
__device__ __forceinline__ void warp_compact(uint2* buf, uint32_t* cnt, uint32_t* out_k, uint32_t* out_i, Gate& g,
                                          int lane) {
    const uint32_t n = *cnt;
    warp_select<VT>(buf, n, out_k, out_i, lane);
    for (int r = lane; r < VT; r += 32) buf[r] = make_uint2(out_k[r], out_i[r]);
    const uint32_t nk = n < (uint32_t)VT ? n : (uint32_t)VT;
    if (n >= (uint32_t)VT) {
        const uint32_t tk = out_k[VT - 1], ti = out_i[VT - 1];
        if (better(tk, ti, g.gk, g.gi)) g.set(tk, ti);
    }
    __syncwarp();
    if (lane == 0) *cnt = nk;
    __syncwarp();
}

// Top-VT of L sorted lists (lists[l*VT .. l*VT+VT-1], best first, empty slots (0, ~0) last) -> ok/oi[0..VT).
// Rank of entry (l, i) = i + sum over other lists of the entries placed before it; equal entries (only empty
// slots) are ordered by list index, so the ranks are a permutation and every output slot is written.
template <int VT>
__device__ __forceinline__ void rank_merge(const uint32_t* lk, const uint32_t* li, int L, uint32_t* ok, uint32_t* oi,
                                           int tid, int nthreads) {
    for (int e = tid; e < L * VT; e += nthreads) {
        const int l = e / VT;
        const int i = e - l * VT;
        const uint32_t ck = lk[e], ci = li[e];
        int rank = i;
#pragma unroll 4
        for (int l2 = 0; l2 < L; ++l2) {
            if (l2 == l) continue;
            const uint32_t* bk = lk + l2 * VT;
            const uint32_t* bi = li + l2 * VT;
            const bool tie_first = l2 < l;
            int pos = 0;
#pragma unroll
            for (int st = VT / 2; st > 0; st >>= 1) {
                const int j = pos + st - 1;
                if (better(bk[j], bi[j], ck, ci) || (tie_first && bk[j] == ck && bi[j] == ci)) pos += st;
            }
            if (better(bk[pos], bi[pos], ck, ci) || (tie_first && bk[pos] == ck && bi[pos] == ci)) ++pos;
            rank += pos;
        }
        if (rank < VT) {
            ok[rank] = ck;
            oi[rank] = ci;
        }
    }
}

// Top-V of L sorted lists, as rank_merge, but usually ranking only a handful of entries. Let t be the best of
// the lists' V-th entries: its list holds V entries >= t, so no entry below t is in the top V. The real
// entries >= t among the first V of each list (on normal rows ~V to 2V of them) are appended to cand and
// ranked by counting among themselves; slots [min(n, V), VT) get empty entries. More than PRUNED_CAP
// survivors (lists that interleave, e.g. one value pattern in every split) -> rank_merge of the whole lists.
// Block-wide; *n must be 0 on entry; the lists must be visible (a barrier before); two barriers inside.
template <int VT>
__device__ __forceinline__ void pruned_merge(const uint32_t* lk, const uint32_t* li, int L, int V, uint32_t* ok,
                                             uint32_t* oi, uint2* cand, uint32_t* n, int tid, int nthreads) {
    // t = max over lists of entry V-1 (larger key, then smaller id); every warp computes it for itself
    const int lane = tid & 31;
    uint32_t tk = 0u;
    uint32_t ti = ~0u;
    for (int l = lane; l < L; l += 32) {
        const uint32_t k = lk[l * VT + V - 1], i = li[l * VT + V - 1];
        if (better(k, i, tk, ti)) { tk = k; ti = i; }
    }
    const uint2 best = warp_best(tk, ti);
    tk = best.x;
    ti = best.y;
    for (int e = tid; e < L * VT; e += nthreads) {
        const int pos = e % VT;
        const uint32_t k = lk[e], i = li[e];
        if (pos < V && k != 0u && !better(tk, ti, k, i)) {
            const uint32_t slot = atomicAdd(n, 1u);
            if (slot < (uint32_t)PRUNED_CAP) cand[slot] = make_uint2(k, i);
        }
    }
    __syncthreads();
    const uint32_t count = *n;
    if (count > (uint32_t)PRUNED_CAP) {
        rank_merge<VT>(lk, li, L, ok, oi, tid, nthreads);
    } else {
        place_by_rank(cand, count, (uint32_t)tid, (uint32_t)nthreads, (uint32_t)V, ok, oi);
        for (int r = (int)min(count, (uint32_t)V) + tid; r < VT; r += nthreads) {
            ok[r] = 0u;
            oi[r] = ~0u;
        }
    }
    __syncthreads();
    if (tid == 0) *n = 0u;       // ready for the next merge (the next barrier orders it)
}

// Block-wide: the VT-th largest of the 256 threads' keys v (0 = the thread holds no element), via a bitonic
// sort of each warp's lane keys and a rank test of the 8 sorted per-warp lists. Returned to every thread.
// When every key is an element of the block's range, VT distinct elements are >= the result, so an element
// below it cannot be in the block's top VT. s_lists (SMALL_WARPS * VT words) is scratch; two barriers.
template <int VT>
__device__ __forceinline__ uint32_t block_bound(uint32_t v, uint32_t* s_lists, uint32_t* s_bound, int lane, int warp,
                                                int tid) {
#pragma unroll
    for (int k = 2; k <= 32; k <<= 1) {                   // bitonic sort, descending over lanes
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
            const uint32_t o = __shfl_xor_sync(FULL, v, j);
            const bool desc = (lane & k) == 0;
            const bool low = (lane & j) == 0;
            v = (low == desc) ? max(v, o) : min(v, o);
        }
    }
    if (lane < VT) s_lists[warp * VT + lane] = v;
    __syncthreads();
    if (tid < SMALL_WARPS * VT) {                        // is entry tid the VT-th largest of the lists?
        const uint32_t e = s_lists[tid];
        int gt = 0, ge = 0;
#pragma unroll
        for (int l = 0; l < SMALL_WARPS; ++l) {
            const uint32_t* L = s_lists + l * VT;
            int p = 0, q = 0;
#pragma unroll
            for (int st = VT / 2; st > 0; st >>= 1) {
                if (L[p + st - 1] > e) p += st;
                if (L[q + st - 1] >= e) q += st;
            }
            gt += p + (L[p] > e ? 1 : 0);
            ge += q + (L[q] >= e ? 1 : 0);
        }
        if (gt < VT && ge >= VT) *s_bound = e;            // all writers write the same value
    }
    __syncthreads();
    return *s_bound;
}

}  // namespace topk
