// kernels/tree_build/stage.cuh -- the prologue every path starts with: stage_logprobs copies the request's
// [K, Vs] log-probs and ids, and each depth's rank-0 (and for the small path rank-1) log-prob, into shared
// memory with one memory round trip. Used by every entry point (small_build and tree_build_body).
#pragma once

#include "tree_build/layout.cuh"

namespace {

// Stages top_logp[g, :, :Vs] and top_ids[g, :, :Vs] into lp_s / ids_s ([K][Vs]), lp0[d] = top_logp[g, d, 0] and,
// with kLp1, lp1[d] = top_logp[g, d, 1] (-inf for d >= K; lp1 also for V == 1), d < kLp0Len. Each thread issues
// its first element's loads and its lp0 / lp1 loads before any store: a store right behind its load stalls the
// thread (in-order issue) until the data arrives, so a store between two loads would cost a second memory round
// trip before the barrier. Returns whether this thread staged a log-prob > 0 (with kLp1, the small path's: one not
// <= 0, so NaN too: the small path keys scores <= 0 as their bits).
template <bool kLp1>
__device__ __forceinline__ int stage_logprobs(const float* __restrict__ glp, const int* __restrict__ gid, int K,
                                              int V, int Vs, float* lp_s, int* ids_s, float* lp0, float* lp1) {
    static_assert(kThreads >= kLp0Len, "one lp0 entry per thread");
    const int tid = (int)threadIdx.x;
    const int count = K * Vs;
    float x = 0.0f, l0 = -INFINITY, l1 = -INFINITY;
    int id = 0;
    if (tid < count) {
        const int d = tid / Vs;
        const int r = tid - d * Vs;
        x = glp[(size_t)d * V + r];
        id = gid[(size_t)d * V + r];
    }
    if (tid < K) {
        l0 = glp[(size_t)tid * V];
        if (kLp1 && V > 1) l1 = glp[(size_t)tid * V + 1];
    }
    int positive = 0;
    for (int i = tid + kThreads; i < count; i += kThreads) {    // K * Vs > kThreads only
        const int d = i / Vs;
        const int r = i - d * Vs;
        const float y = glp[(size_t)d * V + r];
        lp_s[i] = y;
        ids_s[i] = gid[(size_t)d * V + r];
        positive |= kLp1 ? !(y <= 0.0f) : (y > 0.0f);
    }
    if (tid < count) {
        lp_s[tid] = x;
        ids_s[tid] = id;
        positive |= kLp1 ? !(x <= 0.0f) : (x > 0.0f);
    }
    if (tid < kLp0Len) {
        lp0[tid] = l0;
        if (kLp1) lp1[tid] = l1;
    }
    return positive;
}

}  // namespace
