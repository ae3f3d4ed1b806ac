// kernels/tree_build/small.cuh -- the small path: kdt_tree_build_p1 and _p2 without a select pool (B <= 63). Warp 0
// runs the best-first loop with one or two slots per lane, software-pipelined (the previous step's bookkeeping
// inside the next step's REDUX latency), and writes every output itself. See plans/kernels/tree-build.md, "Small
// path".
#pragma once

#include <stdint.h>

#include <type_traits>

#include "common/ptx.cuh"
#include "tree_build/layout.cuh"
#include "tree_build/stage.cuh"

namespace {

// The small path builds N = B + 1 <= 32 * SETS slots with the best-first loop in warp 0, SETS (1 or 2) slots per
// lane: slot q on lane q % 32 of set q / 32, so "smallest slot" is "set 0's lowest lane, else set 1's". Warp 0 runs
// the loop and the finalize alone, with no block barrier after the staging. See plans/kernels/tree-build.md,
// "Small path", for the algorithm and the chain it shortens.
// Its shared memory, inside the p{SETS} layout (P = 32 * SETS): lp1[d] = top_logp[g, d, 1] (-inf for d >= K or
// V == 1) in the bytes of ent and logw, which it does not use; fc where the serial loop keeps it; lp0 in the
// layout's header; lp and ids in region x; with two sets, the finalize's per-parent records in `last` and `rec`.
static_assert(4 * kLp0Len <= off_last(32), "small path: lp1 must fit in ent and logw of P = 32");
constexpr int kSmallUnroll = 4;     // steps per basic block of the loop: steps 1-32 (one set)
constexpr int kSmallUnrollTwoSets = 8;  // steps 33-63 (two sets): longer blocks schedule better there

// How the small path keys a score (larger score, larger key; a dead entry's key is below every live one). The
// general keys (score_key / key_score) cost ~4 and 2 instructions a conversion, a step makes ~5 a set. When every
// log-prob is <= 0 (and none is NaN), every score is +0.0 or negative (never -0.0: the root is +0.0, and
// +0.0 + -0.0 is +0.0) or -inf, and ~bits orders them in one instruction: -inf becomes 0x007fffff, the largest
// dead key, so an entry is live iff its key is above that (the plans' note, "Small path"). Two sets only.
template <bool kNonPositive>
struct SmallKeys {
    static __device__ __forceinline__ uint32_t key(float x) { return score_key(x); }
    static __device__ __forceinline__ float score(uint32_t k) { return key_score(k); }
    static __device__ __forceinline__ bool live(uint32_t k) { return k != 0u; }
};
template <>
struct SmallKeys<true> {
    static constexpr uint32_t kNegInfKey = ~0xff800000u;
    static __device__ __forceinline__ uint32_t key(float x) { return ~__float_as_uint(x); }
    static __device__ __forceinline__ float score(uint32_t k) { return __uint_as_float(~k); }
    static __device__ __forceinline__ bool live(uint32_t k) { return k > kNegInfKey; }
};

// The ancestor bits of a slot: one word per row for one set, two for two.
template <int SETS>
using SmallMask = typename std::conditional<SETS == 1, uint32_t, unsigned long long>::type;

// The finalize (warp 0), SETS slots per lane: taken slots are 1..n, those born with a depth >= 1. Siblings (same
// parent) are taken in rank order, so among them: rank = the number of smaller slots, the first child is the
// smallest slot, the next sibling the next larger slot. Within a set __match_any_sync finds them; with two sets,
// a set-1 slot's siblings in set 0 all come before it (their count and set 1's first child per parent pass
// through shared memory). Unborn slots get distinct non-parent values so that they match nobody.
template <int SETS>
__device__ __forceinline__ void small_finalize(const int (&D)[SETS], const int (&par)[SETS], const float (&L)[SETS],
                                               const SmallMask<SETS> (&mask)[SETS], uint32_t lanes_below, int g,
                                               int N, int Vs, const int* ids_s, unsigned char* smem_raw,
                                               int* __restrict__ n_nodes, int* __restrict__ out_parent,
                                               int* __restrict__ out_depth, int* __restrict__ out_token,
                                               int* __restrict__ out_rank, float* __restrict__ out_logw,
                                               int* __restrict__ out_first_child, int* __restrict__ out_next_sibling,
                                               uint32_t* __restrict__ out_mask) {
    constexpr int P = 32 * SETS;
    int* const fc_s = reinterpret_cast<int*>(smem_raw + off_fc(P));
    const int lane = (int)(threadIdx.x & 31u);
    bool born[SETS];
    int rnk[SETS], next[SETS], n = 0;
    uint32_t sib[SETS];
#pragma unroll
    for (int k = 0; k < SETS; ++k) {
        born[k] = D[k] > 0;
        n += __popc(__ballot_sync(kFull, born[k]));
        sib[k] = __match_any_sync(kFull, born[k] ? par[k] : -2 - (32 * k + lane));
        rnk[k] = __popc(sib[k] & lanes_below);
        const uint32_t later = sib[k] & ~(lanes_below | (1u << lane));
        next[k] = (born[k] && later != 0u) ? 32 * k + __ffs((int)later) - 1 : -1;
    }
    if (born[0] && rnk[0] == 0) fc_s[par[0]] = lane;
    if constexpr (SETS == 2) {
        int* const count0 = reinterpret_cast<int*>(smem_raw + off_last(P));   // per parent: its children in set 0
        int* const first1 = reinterpret_cast<int*>(smem_raw + off_rec(P));    // per parent: its first in set 1
        count0[lane] = count0[32 + lane] = 0;
        first1[lane] = first1[32 + lane] = -1;
        __syncwarp();
        if (born[0] && rnk[0] == 0) count0[par[0]] = __popc(sib[0]);
        if (born[1] && rnk[1] == 0) first1[par[1]] = 32 + lane;
        __syncwarp();
        const int before = born[1] ? count0[par[1]] : 0;
        if (born[1] && rnk[1] == 0 && before == 0) fc_s[par[1]] = 32 + lane;
        rnk[1] += before;
        if (born[0] && next[0] < 0) next[0] = first1[par[0]];
    }
    __syncwarp();
    const int W = SETS == 1 ? 1 : (N + 31) >> 5;   // mask words per row
#pragma unroll
    for (int k = 0; k < SETS; ++k) {
        const int q = 32 * k + lane;
        if (q >= N) continue;
        const bool valid = q <= n;
        // Two sets index in 32 bits (g * N + q < 65536 * 64): fewer address instructions. One set keeps 64: in p1
        // the 32-bit index moved the loop's scheduling, ~2-3% slower at B = 31 (the note, "Small path").
        using Index = typename std::conditional<SETS == 2, uint32_t, size_t>::type;
        const Index i = (Index)g * (Index)N + (Index)q;
        out_parent[i] = born[k] ? par[k] : -1;
        out_depth[i] = valid ? D[k] : -1;
        out_token[i] = born[k] ? ids_s[(D[k] - 1) * Vs + rnk[k]] : -1;
        out_rank[i] = born[k] ? rnk[k] : -1;
        out_logw[i] = valid ? L[k] : -INFINITY;
        out_first_child[i] = fc_s[q];
        out_next_sibling[i] = next[k];
#pragma unroll
        for (int w = 0; w < SETS; ++w)   // W <= SETS: the launcher gives two sets only for N > 32
            if (w < W)
                out_mask[i * W + w] =
                    valid ? static_cast<uint32_t>(static_cast<unsigned long long>(mask[k]) >> (32 * w)) : 0u;
    }
    if (lane == 0) n_nodes[g] = n;
}

// The small path's loop and finalize (warp 0), its scores keyed by SmallKeys<kNonPositive>.
template <int SETS, bool kNonPositive>
__device__ __forceinline__ void small_loop(const float* lp0, const float* lp1, const float* lp_s, const int* ids_s,
                                           int K, int V, int B, int Vs, unsigned char* smem_raw,
                                           int* __restrict__ n_nodes, int* __restrict__ out_parent,
                                           int* __restrict__ out_depth, int* __restrict__ out_token,
                                           int* __restrict__ out_rank, float* __restrict__ out_logw,
                                           int* __restrict__ out_first_child, int* __restrict__ out_next_sibling,
                                           uint32_t* __restrict__ out_mask) {
    using Mask = SmallMask<SETS>;
    using Keys = SmallKeys<kNonPositive>;
    constexpr int P = 32 * SETS;
    const int lane = (int)(threadIdx.x & 31u);
    const int g = (int)blockIdx.x;
    const int N = B + 1;

    // ---- the loop (warp 0) ----
    // Per-lane state, per set k: slot 32 k + lane once taken (the root on lane 0 of set 0) and its entry at rank rho.
    //   L, D, par, mask  logw, depth, parent slot and ancestor bits of the slot
    //   key          the entry's key (0: none; dead: not Keys::live); a newborn's joins one step late (see the note)
    //   adv          the key at rank rho + 1 (0 when rho + 1 == V): the entry after a take
    //   nxt          top_logp[g, D, rho + 2], indices clamped into the staged range: for the adv after that
    //   rc0, rc1     lp0[D + 1], lp1[D + 1]: ranks 0 and 1 under the node this entry would become
    //   ck, ca       that node's entry keys at ranks 0 and 1, had this entry been taken
    //   gl0, gl1     lp0[D + 2], lp1[D + 2]: that node's rc0, rc1 (kept by the one-set steps only, see kLoadRc)
    // Every lane starts with the root's values; key 0 keeps unborn slots out of the argmax, and a slot's birth
    // overwrites every field that differs. Rank, first child and next sibling are derived in the finalize.
    const uint32_t lanes_below = (1u << lane) - 1u;
    const float sc0 = __fadd_rn(0.0f, lp0[0]);
    int D[SETS], rho[SETS], par[SETS];
    float L[SETS], nxt[SETS], rc0[SETS], rc1[SETS], gl0[SETS], gl1[SETS];
    uint32_t adv[SETS], ck[SETS], ca[SETS], key[SETS];
    Mask mask[SETS];
    bool is_w[SETS], is_n[SETS];
#pragma unroll
    for (int k = 0; k < SETS; ++k) {
        D[k] = 0, rho[k] = 0, par[k] = -1, L[k] = 0.0f;
        adv[k] = Keys::key(__fadd_rn(0.0f, lp1[0]));
        nxt[k] = lp_s[min(2, Vs - 1)];
        rc0[k] = lp0[1], rc1[k] = lp1[1], gl0[k] = lp0[2], gl1[k] = lp1[2];
        ck[k] = Keys::key(__fadd_rn(sc0, rc0[k]));
        ca[k] = Keys::key(__fadd_rn(sc0, rc1[k]));
        mask[k] = 1u;
        key[k] = 0u;                        // the root's entry joins through c at step 1
        is_w[k] = false;
        is_n[k] = k == 0 && lane == 0;      // step 0 "bore" the root on lane 0: its key c joins at step 1
    }

    // The previous step's outcome, applied one step late (software pipelining, see the note): the best key, the
    // winner's slot and what it shuffled out.
    uint32_t bal = 1u, m = 0u, c = Keys::key(sc0), a = adv[0];
    Mask wmask = 1u;
    int wl = -1, wD = -1, sp = 0;
    float g0 = rc0[0], g1 = rc1[0];

    // Whether set k can hold a newborn in a step over `active` sets: in a step over both sets (33-63) every newborn
    // is in set 1 (slots 33-63), so set 0's birth is compiled out there. The last apply passes AnySet.
    using AnySet = std::integral_constant<int, 0>;
    const auto bears = [](int k, auto active) { return !(decltype(active)::value == 2 && k == 0); };
    // Slot t's own bit in its mask; in a step over both sets t >= 32, so the bit is in the high word.
    const auto own_bit = [](int t, auto active) -> Mask {
        if constexpr (decltype(active)::value == 2)
            return static_cast<Mask>(static_cast<unsigned long long>(1u << (t & 31)) << 32);
        else return static_cast<Mask>(1u) << (t & (P - 1));
    };

    // Applies the outcome of step t to this lane's registers, branch-free (unchanged inputs recompute
    // unchanged values), in the first `active` sets (the others cannot have changed; AnySet: all, each may bear).
    // Step 0 is the root's birth on lane 0, already in the registers.
    auto apply = [&](int t, auto active) {
        constexpr int ACTIVE = decltype(active)::value == 0 ? SETS : decltype(active)::value;
        // In a step over both sets (and the last apply) the newborn's rc0, rc1 are one load for every lane at depth
        // wD + 2, the same values as the winner's gl0, gl1 that a one-set step shuffles: no gl0, gl1 kept there, a
        // two-set step being bound by its issue. The one-set steps keep the shuffles: their chain waits on the
        // newborn's ck, which the load would delay (the note, "Small path"). wD + 2 <= K + 2, inside lp0 / lp1's 72
        // entries; wD is -1 before the first take.
        constexpr bool kLoadRc = SETS == 2 && decltype(active)::value != 1;
        if constexpr (kLoadRc) g0 = lp0[wD + 2], g1 = lp1[wD + 2];
#pragma unroll
        for (int k = 0; k < ACTIVE; ++k) {
            // The winner: its entry moves to rank rho + 1 (its key already did) and its adv to rank rho + 2.
            const uint32_t w_adv = (rho[k] + 2 < V) ? Keys::key(__fadd_rn(L[k], nxt[k])) : 0u;
            adv[k] = is_w[k] ? w_adv : adv[k];
            rho[k] = is_w[k] ? rho[k] + 1 : rho[k];
            // The newborn: slot t under the winner (slot wl), depth D_w + 1, score Keys::score(m), entry keys c at
            // rank 0 (it joins `key` at the next step) and a at rank 1.
            const bool born = bears(k, active) && is_n[k] && t > 0;
            adv[k] = born ? a : adv[k];
            rho[k] = born ? 0 : rho[k];
            L[k] = born ? Keys::score(m) : L[k];
            D[k] = born ? wD + 1 : D[k];
            rc0[k] = born ? g0 : rc0[k];
            rc1[k] = born ? g1 : rc1[k];
            par[k] = born ? wl : par[k];
            mask[k] = born ? (wmask | own_bit(t, active)) : mask[k];
            // What a take of the entry would hand out. Keys::score(0) is NaN: a dead entry's keys come out dead
            // (general keys) or unused (a dead entry never wins).
            const float sc = Keys::score(bears(k, active) && is_n[k] ? c : key[k]);
            ck[k] = Keys::key(__fadd_rn(sc, rc0[k]));
            ca[k] = Keys::key(__fadd_rn(sc, rc1[k]));
            nxt[k] = lp_s[min(D[k], K - 1) * Vs + min(rho[k] + 2, Vs - 1)];
            if constexpr (!kLoadRc) {
                gl0[k] = lp0[D[k] + 2];     // D <= K <= 64: inside lp0 / lp1's 72 entries
                gl1[k] = lp1[D[k] + 2];
            }
        }
    };

    // Step s: the chain REDUX -> max -> compare -> ballot -> lowest lane -> select -> the next REDUX, with the
    // previous step's bookkeeping issued inside the REDUX's latency. The newborn of step s - 1 still holds key 0
    // in this REDUX: its entry c joins through the max, so the shuffle that brought c overlaps the REDUX. Steps
    // past B are no-ops (no candidate), and so is every step after one that found no live entry (every key stays
    // 0, and the newborn flag guards the merge). With two sets, set 1 wins only where set 0 has no candidate.
    // Steps 1-32 bear slots 1-32 under set-0 winners: set 1 holds no entry yet (slot 32's joins at step 33), so
    // they run with active = 1 set, p1's step.
    auto step = [&](int s, auto active) {
        constexpr int ACTIVE = decltype(active)::value;
        uint32_t lane_best = key[0];
#pragma unroll
        for (int k = 1; k < ACTIVE; ++k) lane_best = max(lane_best, key[k]);
        const uint32_t R = __reduce_max_sync(kFull, lane_best);
        apply(s - 1, active);
        m = max(R, c);
        bool cand[SETS] = {};
        uint32_t ballots[SETS] = {};
#pragma unroll
        for (int k = 0; k < ACTIVE; ++k) {
            key[k] = bears(k, active) && is_n[k] ? c : key[k];
            cand[k] = Keys::live(key[k]) && s <= B && key[k] == m;
            ballots[k] = __ballot_sync(kFull, cand[k]);
        }
        const int win = ACTIVE == 2 && ballots[0] == 0u ? 1 : 0;   // the set of the smallest slot holding m
        bal = win ? ballots[SETS - 1] : ballots[0];
        const uint32_t lower = bal & lanes_below;       // nonzero: a smaller slot holds the best key too
#pragma unroll
        for (int k = 0; k < ACTIVE; ++k) {
            is_w[k] = cand[k] && lower == 0u && k == win;
            // Entry (w, rho) -> (w, rho + 1), if I am the winner. With one set, a candidate's advanced key is
            // selected before the ballot, so after the VOTE the chain holds one LOP3 and one select the compiler
            // cannot fold into a predicate combine (the note, "Small path"); with two sets it measured slower.
            key[k] = ACTIVE == 1 ? kdt::select_nonzero(lower, key[k], cand[k] ? adv[k] : key[k])
                                 : is_w[k] ? adv[k] : key[k];
        }
        // The winner hands the newborn (slot s) what it precomputed; applied at the next step.
        const int wlane = 31 - __clz((int)(bal & (0u - bal)));   // the lowest bit's FLO: no BREV on c's chain
        const bool from1 = SETS == 2 && win;
        c = __shfl_sync(kFull, from1 ? ck[SETS - 1] : ck[0], wlane);
        a = __shfl_sync(kFull, from1 ? ca[SETS - 1] : ca[0], wlane);
        if constexpr (ACTIVE == 1) {    // (a step over both sets loads them in the next apply)
            g0 = __shfl_sync(kFull, gl0[0], wlane);
            g1 = __shfl_sync(kFull, gl1[0], wlane);
        }
        wD = __shfl_sync(kFull, from1 ? D[SETS - 1] : D[0], wlane);
        // Over set 0 alone the winner is a set-0 slot, whose ancestors are too: its mask's high word is 0.
        if constexpr (ACTIVE == 1) wmask = __shfl_sync(kFull, static_cast<uint32_t>(mask[0]), wlane);
        else wmask = __shfl_sync(kFull, from1 ? mask[SETS - 1] : mask[0], wlane);
        wl = wlane + 32 * win;
#pragma unroll
        for (int k = 0; k < SETS; ++k) is_n[k] = bears(k, active) && 32 * k + lane == s && bal != 0u;
        sp = s;
    };

    // Groups of kSmallUnroll (then kSmallUnrollTwoSets) steps in one basic block, so the scheduler can start each
    // REDUX right after the select it depends on; the build stops after a group whose last step took nothing.
    using One = std::integral_constant<int, 1>;
    using All = std::integral_constant<int, SETS>;
    static_assert(32 % kSmallUnroll == 0, "the phases split between groups");
    bool more = true;
    for (int s = 1; s <= min(B, 32); s += kSmallUnroll) {
#pragma unroll
        for (int u = 0; u < kSmallUnroll; ++u) step(s + u, One{});
        if (bal == 0u) {
            more = false;
            break;
        }
    }
    if (SETS == 2 && more)
        for (int s = 33; s <= B; s += kSmallUnrollTwoSets) {
#pragma unroll
            for (int u = 0; u < kSmallUnrollTwoSets; ++u) step(s + u, All{});
            if (bal == 0u) break;
        }
    apply(sp, AnySet{});      // the last step's outcome (a no-op if it took nothing)
    small_finalize<SETS>(D, par, L, mask, lanes_below, g, N, Vs, ids_s, smem_raw, n_nodes, out_parent, out_depth,
                         out_token, out_rank, out_logw, out_first_child, out_next_sibling, out_mask);
}

template <int SETS>
__device__ __forceinline__ void small_build(const float* __restrict__ glp, const int* __restrict__ gid, int K,
                                            int V, int B, int Vs, unsigned char* smem_raw,
                                            int* __restrict__ n_nodes, int* __restrict__ out_parent,
                                            int* __restrict__ out_depth, int* __restrict__ out_token,
                                            int* __restrict__ out_rank, float* __restrict__ out_logw,
                                            int* __restrict__ out_first_child, int* __restrict__ out_next_sibling,
                                            uint32_t* __restrict__ out_mask) {
    static_assert(SETS == 1 || SETS == 2, "small path: one or two slots per lane");
    constexpr int P = 32 * SETS;
    float* const lp1 = reinterpret_cast<float*>(smem_raw);
    int* const fc_s = reinterpret_cast<int*>(smem_raw + off_fc(P));
    float* const lp0 = reinterpret_cast<float*>(smem_raw + off_lp0(P));
    float* const lp_s = reinterpret_cast<float*>(smem_raw + off_x(P));
    int* const ids_s = reinterpret_cast<int*>(smem_raw + off_x(P) + staged_bytes(K, Vs));

    const int tid = (int)threadIdx.x;

    // ---- prologue (whole block): one round of global loads, one barrier ----
    if (tid < P) fc_s[tid] = -1;
    const int not_nonpositive = stage_logprobs<true>(glp, gid, K, V, Vs, lp_s, ids_s, lp0, lp1);
    // Keys as bits only with two sets: with one (B <= 31) the general keys measured ~1% faster (the note).
    bool nonpositive = false;
    if constexpr (SETS == 2) nonpositive = __syncthreads_or(not_nonpositive) == 0;
    else __syncthreads();
    if (tid >= 32) return;      // warp 0 alone from here: no barrier follows
    const auto loop = [&](auto keys_as_bits) {
        small_loop<SETS, decltype(keys_as_bits)::value>(lp0, lp1, lp_s, ids_s, K, V, B, Vs, smem_raw, n_nodes,
                                                         out_parent, out_depth, out_token, out_rank, out_logw,
                                                         out_first_child, out_next_sibling, out_mask);
    };
    if constexpr (SETS == 2) {
        if (nonpositive) loop(std::true_type{});
        else loop(std::false_type{});
    } else {
        loop(std::false_type{});
    }
}

}  // namespace
