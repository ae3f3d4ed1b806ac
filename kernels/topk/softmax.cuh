// kernels/topk/softmax.cuh -- the softmax statistics, gathered in the same read of the logits as the selection:
// (m, s) pairs with s = sum exp(x - m) and their merges (stat_merge, raise_max, warp / block folds), and the small
// and resident paths' online softmax per group of vectors (Softmax, group_max, group_exp_sum, add_group), and the
// scan step the small and gate paths share (scan_group). Used by every entry point. The modes, the base margin and
// the error budget: plans/kernels/topk.md, "Softmax statistics".
#pragma once

#include <float.h>

#include "common/ptx.cuh"
#include "topk/config.cuh"

namespace topk {

using kdt::ex2;

// (m, s) <- (m, s) (+) (om, os), both meaning s * exp(. - m); m finite (>= -FLT_MAX) so no inf - inf.
__device__ __forceinline__ void stat_merge(float& m, float& s, float om, float os) {
    const float M = fmaxf(m, om);
    s = s * ex2((m - M) * LOG2E) + os * ex2((om - M) * LOG2E);
    m = M;
}

// Online softmax: a new group maximum gm above m rescales s = sum exp(. - m) to the new base.
__device__ __forceinline__ void raise_max(float& m, float& s, float gm) {
    if (gm > m) {
        s *= ex2((m - gm) * LOG2E);
        m = gm;
    }
}

// Every lane ends with the warp's (max, sum of exp) of the lanes' partials.
__device__ __forceinline__ void warp_fold_stats(float& m, float& s) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float om = __shfl_xor_sync(FULL, m, off);
        const float os = __shfl_xor_sync(FULL, s, off);
        stat_merge(m, s, om, os);
    }
}

// Warp 0 folds n (max, sum of exp) partials p_m/p_s[0 .. n) into s_stat[0..1].
__device__ __forceinline__ void fold_stats(const float* p_m, const float* p_s, int n, float* s_stat, int lane) {
    float bm = -FLT_MAX, bs = 0.0f;
    for (int e = lane; e < n; e += 32) stat_merge(bm, bs, p_m[e], p_s[e]);
    warp_fold_stats(bm, bs);
    if (lane == 0) { s_stat[0] = bm; s_stat[1] = bs; }
}

// Sums over a warp (the resident path's sums, all in one base).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(FULL, x, off);
    return x;
}

// Pairwise sum in place: a short serial chain (part of the error budget).
template <int N>
__device__ __forceinline__ float tree_sum(float (&a)[N]) {
#pragma unroll
    for (int w = 1; w < N; w <<= 1) {
#pragma unroll
        for (int i = 0; i + w < N; i += 2 * w) a[i] += a[i + w];
    }
    return a[0];
}

// ---- online softmax of the small and resident paths
// Per thread: m = the running maximum (an element seen so far, or -FLT_MAX before the first finite one) and
// s = sum of exp(x - b) over the elements seen, in a base b >= m that moves only when a group maximum exceeds it,
// and then to fl(gm + BASE_MARGIN): the rescale is rare and sits behind the same warp vote as the candidate
// work. The exponentials are ex2(a) with
//   fused mode (|b| <= FUSED_MAX_B):  a = fl(x * LOG2E - bL), one FFMA, bL = fl(b * LOG2E), the group's sum
//                                      times c = ex2(-(b * LOG2E - bL)) (the rounding residual of bL);
//   exact mode (any other b, where 2^residual may overflow):  a = fl(fl(x - b) * LOG2E).
// Both give s in the same base, so a warp may switch mode whenever b moves. See plans/kernels/topk.md,
// "Softmax statistics".
constexpr float FUSED_MAX_B = 65536.0f;
constexpr float BASE_MARGIN = 4.0f;

struct Softmax {
    float m = -FLT_MAX;
    float b = -FLT_MAX;   // base of s: m <= b <= fl(m + BASE_MARGIN) (b - m <= 4 + ulp(m) / 2)
    float s = 0.0f;
    float bL = 0.0f;      // fl(b * LOG2E)                      (fused mode only)
    float c = 1.0f;       // ex2(-(b * LOG2E - bL))             (fused mode only)
    // the whole warp is in the fused mode: a warp-uniform branch (no reconvergence bookkeeping); the exact
    // mode is right for any b, so a warp with one lane beyond FUSED_MAX_B runs it on every lane
    bool warp_fused = false;

    __device__ __forceinline__ bool fused() const { return fabsf(b) <= FUSED_MAX_B; }

    // A group maximum gm above the base rescales s to a new base above gm. The caller takes m = max(m, gm)
    // and, behind a warp vote on needs_rebase (rarely true), calls rebase_warp on every lane.
    __device__ __forceinline__ bool needs_rebase(float gm) const { return gm > b; }
    __device__ __forceinline__ void rebase_warp(bool moves, float gm) {
        if (moves) rebase(gm);
        warp_fused = __all_sync(FULL, fused());          // b changes only here
    }
    __device__ __forceinline__ void rebase(float gm) {
        const float nb = gm + BASE_MARGIN;               // >= gm (= gm when BASE_MARGIN < ulp(gm) / 2)
        s *= ex2((b - nb) * LOG2E);
        b = nb;
        bL = __fmul_rn(nb, LOG2E);                       // never contracted into the FMA below
        c = ex2(-fmaf(nb, LOG2E, -bL));                  // unused (maybe inf) in the exact mode
    }

    // s -> sum exp(x - m): once per thread, after its scan (b - m = 0 when it saw no finite element).
    __device__ __forceinline__ void finish() {
        s *= ex2((b - m) * LOG2E);
        b = m;
    }
};

// Sum of the exponentials of one group (pairwise tree), in the fused or the exact mode.
template <bool FUSED, typename E, int NV>
__device__ __forceinline__ float group_exp_sum(const typename E::Vec (&v)[NV], const Softmax& sm) {
    constexpr int VW = E::W;
    float ev[NV * VW];
#pragma unroll
    for (int u = 0; u < NV; ++u) {
        float x[VW];
        E::unpack(v[u], x);
#pragma unroll
        for (int e = 0; e < VW; ++e)
            ev[u * VW + e] = ex2(FUSED ? fmaf(x[e], LOG2E, -sm.bL) : (x[e] - sm.b) * LOG2E);
    }
    return tree_sum(ev);
}

// The largest element of a group (a pairwise tree over its vectors: short dependency chains).
template <typename E, int NV>
__device__ __forceinline__ float group_max(const typename E::Vec (&v)[NV]) {
    typename E::VMax vm[NV];
#pragma unroll
    for (int u = 0; u < NV; ++u) vm[u] = E::vmax(v[u]);
#pragma unroll
    for (int w = 1; w < NV; w <<= 1) {
#pragma unroll
        for (int u = 0; u + w < NV; u += 2 * w) vm[u] = E::vmax2(vm[u], vm[u + w]);
    }
    return E::vmax_float(vm[0]);
}

// s += the group's exponentials in the base b, in the warp's mode.
template <typename E, int NV>
__device__ __forceinline__ void add_group(Softmax& sm, const typename E::Vec (&v)[NV]) {
    if (sm.warp_fused) sm.s = fmaf(group_exp_sum<true, E>(v, sm), sm.c, sm.s);
    else sm.s += group_exp_sum<false, E>(v, sm);
}

// One group of NV vectors of a scan (the small and gate paths): the running maximum, then the rare work behind one
// warp vote: on_hot(u, hot) for each vector u some lane of which may hold a candidate (its maximum reaches g.gf;
// called warp-uniformly, g read anew for each vector as on_hot may raise it), and the rescale of the softmax base;
// then the group's exponentials, after the candidates so that the vectors die there (fewer live registers).
template <typename E, int NV, class GateT, class OnHot>
__device__ __forceinline__ void scan_group(const typename E::Vec (&v)[NV], const bool (&valid)[NV], Softmax& sm,
                                           const GateT& g, OnHot&& on_hot) {
    const float gm = group_max<E>(v);
    sm.m = fmaxf(sm.m, gm);
    const bool maybe_hot = gm >= g.gf;
    const bool rebase = sm.needs_rebase(gm);
    if (__any_sync(FULL, maybe_hot || rebase)) {
        if (__any_sync(FULL, maybe_hot)) {
#pragma unroll
            for (int u = 0; u < NV; ++u) {
                const bool hot = valid[u] && E::vmax_float(E::vmax(v[u])) >= g.gf;
                if (__any_sync(FULL, hot)) on_hot(u, hot);
            }
        }
        sm.rebase_warp(rebase, gm);
    }
    add_group<E>(sm, v);
}

}  // namespace topk
