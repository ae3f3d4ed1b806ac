// kernels/tree_build/serial.cuh -- tree_build_body, what every kdt_tree_build_* entry point runs, and in it the
// serial path: warp 0's best-first loop, one node per step, for every request the small and select paths do not
// take. The body carves the dynamic shared memory, hands p1 / p2 requests without a pool to small_build, stages the
// log-probs, tries select_build (_select entries), runs the loop otherwise, then the finalize (finalize.cuh).
// See plans/kernels/tree-build.md, "Serial path" and "Paths and entry points".
#pragma once

#include <stdint.h>

#include <type_traits>

#include "tree_build/finalize.cuh"
#include "tree_build/layout.cuh"
#include "tree_build/select.cuh"
#include "tree_build/small.cuh"
#include "tree_build/stage.cuh"

// Requests built by the select path since the module loaded (defined in tree_build.cu with the other symbols the
// launcher and the tests read).
extern "C" __device__ unsigned long long kdt_tree_build_select_runs;

namespace {

// In-register tournament over n (key, pay) pairs listed in increasing slot order: the result (index 0) has the
// largest key; equal keys keep the earlier (smaller-slot) pair.
template <int n>
__device__ __forceinline__ void argmax_pairs(uint32_t (&k)[n], uint32_t (&p)[n]) {
#pragma unroll
    for (int stride = 1; stride < n; stride *= 2) {
#pragma unroll
        for (int j = 0; j + stride < n; j += 2 * stride) {
            const bool take = k[j + stride] > k[j];
            k[j] = take ? k[j + stride] : k[j];
            p[j] = take ? p[j + stride] : p[j];
        }
    }
}

// The body of kdt_tree_build_p{NPL}{,_select_narrow,_select_wide,_g,_g_select_wide} (kSelect: the select kind the
// _select entries hold; kPartialLp: the _g entries, ranks >= Vs read from global memory). P = 32 * NPL slots per
// per-slot array; in the serial loop each lane of warp 0 owns NPL slots in NG groups of GS entries (a rescan after
// a take reads one group).
template <int NPL, bool kPartialLp, SelectKind kSelect>
__device__ __forceinline__ void tree_build_body(const float* __restrict__ top_logp, const int* __restrict__ top_ids,
                                                int K, int V, int B, int Vs, int cap, int cap3, bool estimate,
                                                int* __restrict__ n_nodes,
                                                int* __restrict__ out_parent, int* __restrict__ out_depth,
                                                int* __restrict__ out_token, int* __restrict__ out_rank,
                                                float* __restrict__ out_logw, int* __restrict__ out_first_child,
                                                int* __restrict__ out_next_sibling, uint32_t* __restrict__ out_mask) {
    constexpr int P = 32 * NPL;                 // slots per per-slot array (>= N)
    constexpr int GS = NPL < 4 ? NPL : (NPL >= 32 ? 8 : 4);   // entries per group (a rescan reads one group)
    constexpr int NG = NPL / GS;                // groups per lane

    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint2* const ent = reinterpret_cast<uint2*>(smem_raw);
    float* const logw_s = reinterpret_cast<float*>(smem_raw + off_logw(P));
    int* const last_s = reinterpret_cast<int*>(smem_raw + off_last(P));
    int* const rec_s = reinterpret_cast<int*>(smem_raw + off_rec(P));
    int* const fc_s = reinterpret_cast<int*>(smem_raw + off_fc(P));    // fc_s[P + i] is ns_s[i]
    int* const ns_s = reinterpret_cast<int*>(smem_raw + off_ns(P));
    float* const lp0 = reinterpret_cast<float*>(smem_raw + off_lp0(P));
    int* const misc = reinterpret_cast<int*>(smem_raw + off_misc(P));
    float* const lp_s = reinterpret_cast<float*>(smem_raw + off_x(P));
    int* const ids_s = reinterpret_cast<int*>(smem_raw + off_x(P) + staged_bytes(K, Vs));
    int* const scratch = reinterpret_cast<int*>(smem_raw + off_x(P) + 2 * staged_bytes(K, Vs));
    uint32_t* const tiles = reinterpret_cast<uint32_t*>(smem_raw + off_x(P));

    const int tid = (int)threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = (int)blockIdx.x;
    const int N = B + 1;
    const int W = (N + 31) >> 5;
    const float* const glp = top_logp + (size_t)g * K * V;
    const int* const gid = top_ids + (size_t)g * K * V;

    // ---- small path: N <= 64 and the serial loop (no select pool offered) ----
    if constexpr (NPL <= 2 && !kPartialLp) {
        if (cap == 0) {
            small_build<NPL>(glp, gid, K, V, B, Vs, smem_raw, n_nodes, out_parent, out_depth, out_token, out_rank,
                             out_logw, out_first_child, out_next_sibling, out_mask);
            return;
        }
    }

    // ---- prologue: clear per-slot state, stage the log-probs ----
    for (int i = tid; i < P; i += kThreads) {
        ent[i] = make_uint2(0u, (uint32_t)i << 16);     // no entry; pay names its own slot
        fc_s[i] = -1;
        ns_s[i] = -1;
    }
    int positive = stage_logprobs<false>(glp, gid, K, V, Vs, lp_s, ids_s, lp0, nullptr);
    if constexpr (kSelect != SelectKind::none && kPartialLp) {
        // the select path reads the unstaged ranks too: they must be <= 0 as well
        const int fanout = min(V, B + 1);
        for (int i = tid; i < K * (fanout - Vs); i += kThreads) {
            const int d = i / (fanout - Vs);
            positive |= (__ldg(glp + (size_t)d * V + Vs + (i - d * (fanout - Vs))) > 0.0f);
        }
    }
    const bool any_positive = __syncthreads_or(positive) != 0;

    // ---- select path (every log-prob <= 0, B large enough: cap > 0; _g_select_wide reads unstaged ranks from L2) ----
    bool selected = false;
    if constexpr (kSelect != SelectKind::none) {
        // The narrow kind reads only staged ranks: no global pointer, so glp stays read-only (LDG.E.CONSTANT) in the
        // staging loads instead of escaping into the called select function.
        const SelectLogProbs lps{lp_s, kSelect == SelectKind::wide ? glp : nullptr, Vs, V, min(V, B + 1)};
        // The narrow entries hold the narrow kind only: a wider row (no plan launches one) takes the serial loop.
        if (cap > 0 && !any_positive && (kSelect == SelectKind::wide || lps.fanout <= kSelectNarrowFanout)) {
            // One pass over the levels when the pool has room for every counted path (cap > cap3); if it
            // overflows, two passes in the same scratch (20 * cap3 <= 12 * cap + 8 * cap3 bytes).
            // Each kind has its own entries, so ptxas compiles neither with the other in the same kernel.
            const auto attempt = [&](auto keep, int pool) {
                constexpr bool kKeep = decltype(keep)::value;
                if constexpr (kSelect == SelectKind::wide)
                    return select_build<kKeep, true>(lps, K, B, pool, cap3, estimate, scratch, rec_s, logw_s, fc_s,
                                                     ns_s, misc);
                else
                    return select_build<kKeep, false>(lps, K, B, pool, cap3, false, scratch, rec_s, logw_s, fc_s,
                                                      ns_s, misc);
            };
            if (cap > cap3) selected = attempt(std::true_type{}, cap);
            if (!selected) selected = attempt(std::false_type{}, cap3);
            if (selected && tid == 0) atomicAdd(&kdt_tree_build_select_runs, 1ull);
        }
    }

    // ---- best-first loop: warp 0 (see the note, "Serial path"; it stays inline here: as a helper function its
    // p1 instances compile with other registers) ----
    if (!selected && warp == 0) {
        // top_logp[g, d, r]: shared memory, or (kPartialLp only, K * V over the budget) global for r >= Vs.
        auto LP = [&](int d, int r) -> float {
            if constexpr (kPartialLp) return (r < Vs) ? lp_s[d * Vs + r] : __ldg(glp + (size_t)d * V + r);
            else return lp_s[d * Vs + r];
        };

        // Every pay this lane ever holds names a slot it owns (slot % 32 == lane), with depth < 64 and
        // rank <= 1023 (ranks stay below B <= 1023), so loads addressed by it stay in range even for key 0.
        uint32_t gk[NG], gp[NG];                            // per group of GS entries: best (key, pay)
#pragma unroll
        for (int gi = 0; gi < NG; ++gi) {
            gk[gi] = 0u;
            gp[gi] = (uint32_t)lane << 16;
        }
        uint32_t bkey = 0u, bpay = (uint32_t)lane << 16;   // this lane's best entry (key 0: none)
        if (lane == 0) {                                     // the root (slot 0, depth 0) and its entry at rank 0
            const uint32_t k0 = score_key(__fadd_rn(0.0f, lp0[0]));
            ent[0] = make_uint2(k0, 0u);
            logw_s[0] = 0.0f;
            gk[0] = k0;
            bkey = k0;
        }
        // Loaded for my best q at the end of each step (and before the first), consumed after the next step's
        // collectives so their latency hides behind them.
        uint32_t pk[GS], pp[GS];        // q's group
        float q_lw, q_a;                // logw[q], top_logp[g, D(q), rank + 1] (unused when rank + 1 == V)
        int q_last;                     // last child taken under q
        auto load_best = [&]() {
            const uint32_t q = bpay >> 16;
            const uint32_t gq = (q >> 5) / GS;
#pragma unroll
            for (int j = 0; j < GS; ++j) {
                const uint2 e = ent[((gq * GS + (uint32_t)j) << 5) | (uint32_t)lane];
                pk[j] = e.x;
                pp[j] = e.y;
            }
            q_lw = logw_s[q];
            q_last = last_s[q];
            // rank + 1, clamped into the staged range: beyond it the value is never used (rank + 1 == V, or the
            // root after its B-th child, at the last step).
            q_a = LP((int)(bpay & 63u), min((int)((bpay >> 6) & 1023u) + 1, (kPartialLp ? V : Vs) - 1));
        };
        load_best();
        // top_logp[g, D(q) + 1, 0] (-inf when D(q) + 1 == K: no child) and the key of the child entry my best
        // would create if taken: 0 when depth K is reached or the score is -inf (and when I hold no entry:
        // key 0 decodes to NaN).
        float b_nlp = lp0[(bpay & 63u) + 1];
        uint32_t bchild = score_key(__fadd_rn(key_score(bkey), b_nlp));

        int n = 0;
        for (int s = 1; s <= B; ++s) {
            const uint32_t m = __reduce_max_sync(kFull, bkey);
            // m == 0: no live entry, every remaining candidate is -inf (or none is left): the build stops. The
            // step still runs to its end with every store and update switched off (no branch here).
            const bool alive = m != 0u;

            // The winner: the lane holding m, or with tied scores the one whose best has the smallest slot
            // (pay's slot field is on top and slots are unique across lanes). It hands out its best's pay
            // and child key.
            const bool cand = (bkey == m);
            const uint32_t bal = __ballot_sync(kFull, cand);
            int wl = __ffs((int)bal) - 1;
            if (__popc(bal) > 1) wl = (int)(__reduce_min_sync(kFull, cand ? bpay : 0xffffffffu) >> 16) & 31;
            const uint32_t w = __shfl_sync(kFull, bpay, wl);
            const uint32_t ck = __shfl_sync(kFull, bchild, wl);

            // Spec: my state if my best entry q is the one taken (it advances to rank + 1).
            const uint32_t q = bpay >> 16;
            const uint32_t iq = q >> 5;                     // q's entry index in this lane
            const uint32_t gq = iq / GS;                    // q's group
            const int rq = (int)((bpay >> 6) & 1023u);
            const uint32_t badv = (rq + 1 < V) ? score_key(__fadd_rn(q_lw, q_a)) : 0u;
            const uint32_t apay = bpay + 64u;   // rank + 1 <= 1023: q had rank + 1 children by then
            uint32_t tk[GS], tp[GS];
#pragma unroll
            for (int j = 0; j < GS; ++j) {
                const bool me = (gq * GS + (uint32_t)j) == iq;
                tk[j] = me ? badv : pk[j];
                tp[j] = me ? apay : pp[j];
            }
            argmax_pairs<GS>(tk, tp);           // q's group after the advance
            uint32_t uk[NG], up[NG];
#pragma unroll
            for (int gi = 0; gi < NG; ++gi) {
                const bool mine = (uint32_t)gi == gq;
                uk[gi] = mine ? tk[0] : gk[gi];
                up[gi] = mine ? tp[0] : gp[gi];
            }
            argmax_pairs<NG>(uk, up);           // my best after the advance: (uk[0], up[0])
            const float nlp_spec = lp0[(up[0] & 63u) + 1];

            // The taken candidate: entry p at rank r becomes slot s at depth ds with score sc.
            const uint32_t p = w >> 16;
            const int r = (int)((w >> 6) & 1023u);
            const int ds = (int)(w & 63u) + 1;
            const float sc = key_score(m);
            const float nlp_s = lp0[ds + 1];
            const bool is_w = alive && lane == wl;                      // my best was taken (p == q, r == rq)
            const bool is_o = alive && lane == (s & 31);                // slot s is mine
            const uint32_t pay_s = ((uint32_t)s << 16) | (uint32_t)(ds < K ? ds : 0);
            const uint32_t gs = ((uint32_t)s >> 5) / GS;

            if (is_w) {     // entry p advances; link s after p's previous child
                ent[p] = make_uint2(badv, apay);
                fc_s[r == 0 ? (int)p : P + q_last] = s;     // first_child[p] or next_sibling[last child of p]
                last_s[p] = s;
            }
            if (is_o) {     // record slot s and add its entry (key ck; 0 when ds == K or the score is -inf)
                ent[s] = make_uint2(ck, pay_s);
                logw_s[s] = sc;
                rec_s[s] = (int)w;   // parent << 16 | rank << 6 | depth - 1
            }
            // Registers, branch-free: the winner takes its spec, then the owner folds entry s in (s is the
            // largest slot it owns, so it needs a strictly larger key).
#pragma unroll
            for (int gi = 0; gi < NG; ++gi) {
                const bool wg = is_w && (uint32_t)gi == gq;
                const uint32_t k1 = wg ? tk[0] : gk[gi];
                const uint32_t p1 = wg ? tp[0] : gp[gi];
                const bool og = is_o && (uint32_t)gi == gs && ck > k1;
                gk[gi] = og ? ck : k1;
                gp[gi] = og ? pay_s : p1;
            }
            const uint32_t k1 = is_w ? uk[0] : bkey;
            const uint32_t p1 = is_w ? up[0] : bpay;
            const float n1 = is_w ? nlp_spec : b_nlp;
            const bool fold = is_o && ck > k1;
            bkey = fold ? ck : k1;
            bpay = fold ? pay_s : p1;
            b_nlp = fold ? nlp_s : n1;
            load_best();
            bchild = score_key(__fadd_rn(key_score(bkey), b_nlp));
            if (!alive) break;
            n = s;
        }
        if (lane == 0) misc[0] = n;
    }
    __syncthreads();

    // ---- finalize (whole block) ----
    const int n = misc[0];
    const size_t row = (size_t)g * N;
    write_slot_outputs(g, N, n, row, V, Vs, tid, gid, ids_s, rec_s, logw_s, fc_s, ns_s, n_nodes, out_parent,
                       out_depth, out_token, out_rank, out_logw, out_first_child, out_next_sibling);
    mask_block_exits(W, n, lane, warp, rec_s, ent);

    // Mask rows, 32 rows per warp pass: zero the warp's tile, each lane writes its row's nonzero words (one per
    // ancestor block, found by following the block exits in ent), then the warp copies the tile out coalesced.
    // (This loop stays here: in a helper of its own it compiles differently on sm_90 or sm_120.)
    uint32_t* const tile = tiles + warp * 32 * W;
    for (int c = warp; c < W; c += kWarps) {
        const int row0 = c << 5;
        const int rows = min(32, N - row0);
        const int cnt = rows * W;
        for (int k = lane; k < cnt; k += 32) tile[k] = 0u;
        __syncwarp();
        const int i = row0 + lane;
        if (lane < rows && i <= n) {
            int j = i;
            while (j >= 0) {
                const uint2 e = ent[j];
                tile[lane * W + (j >> 5)] = e.x;
                j = (int)e.y;
            }
        }
        __syncwarp();
        uint32_t* const dst = out_mask + (row + row0) * W;
        for (int k = lane; k < cnt; k += 32) dst[k] = tile[k];
        __syncwarp();
    }
}

}  // namespace
