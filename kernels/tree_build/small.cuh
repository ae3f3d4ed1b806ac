// kernels/tree_build/small.cuh -- the small path: kdt_tree_build_p1 without a select pool (B <= 31). Warp 0 runs
// the best-first loop with one slot per lane, software-pipelined (the previous step's bookkeeping inside the
// next step's REDUX latency), and writes every output itself. See plans/kernels/tree-build.md, "Small path".
#pragma once

#include <stdint.h>

#include "tree_build/layout.cuh"
#include "tree_build/stage.cuh"

namespace {

// The small path builds N = B + 1 <= 32 slots, one per lane of warp 0 (slot q on lane q, so lane order is slot
// order), with one mask word per row; warp 0 runs the loop and the finalize alone, with no block barrier after
// the staging. See plans/kernels/tree-build.md, "Small path", for the algorithm and the chain it shortens.
constexpr int kSmallMaxSlots = 32;
// Its shared memory, inside the p1 layout (P = 32): lp1[d] = top_logp[g, d, 1] (-inf for d >= K or V == 1) in
// the bytes of ent and logw, which it does not use; fc where the serial loop keeps it; lp0 in the layout's
// header; lp and ids in region x.
static_assert(4 * kLp0Len <= off_last(kSmallMaxSlots), "small path: lp1 must fit in ent and logw of P = 32");
constexpr int kSmallUnroll = 4;     // steps per basic block of the loop

__device__ __forceinline__ void small_build(const float* __restrict__ glp, const int* __restrict__ gid, int K,
                                            int V, int B, int Vs, unsigned char* smem_raw,
                                            int* __restrict__ n_nodes, int* __restrict__ out_parent,
                                            int* __restrict__ out_depth, int* __restrict__ out_token,
                                            int* __restrict__ out_rank, float* __restrict__ out_logw,
                                            int* __restrict__ out_first_child, int* __restrict__ out_next_sibling,
                                            uint32_t* __restrict__ out_mask) {
    constexpr int P = kSmallMaxSlots;
    float* const lp1 = reinterpret_cast<float*>(smem_raw);
    int* const fc_s = reinterpret_cast<int*>(smem_raw + off_fc(P));
    float* const lp0 = reinterpret_cast<float*>(smem_raw + off_lp0(P));
    float* const lp_s = reinterpret_cast<float*>(smem_raw + off_x(P));
    int* const ids_s = reinterpret_cast<int*>(smem_raw + off_x(P) + staged_bytes(K, Vs));

    const int tid = (int)threadIdx.x;
    const int lane = tid & 31;
    const int g = (int)blockIdx.x;
    const int N = B + 1;

    // ---- prologue (whole block): one round of global loads, one barrier ----
    if (tid < P) fc_s[tid] = -1;
    stage_logprobs<true>(glp, gid, K, V, Vs, lp_s, ids_s, lp0, lp1);
    __syncthreads();
    if (tid >= 32) return;      // warp 0 alone from here: no barrier follows

    // ---- the loop (warp 0) ----
    // Per-lane state: slot `lane` once taken (the root on lane 0) and its entry at rank rho.
    //   L, D, par, mask  logw, depth, parent slot and ancestor bits of the slot
    //   key          the entry's key (0: none or dead); a newborn's joins one step late (see the note)
    //   adv          the key at rank rho + 1 (0 when rho + 1 == V): the entry after a take
    //   nxt          top_logp[g, D, rho + 2], indices clamped into the staged range: for the adv after that
    //   rc0, rc1     lp0[D + 1], lp1[D + 1]: ranks 0 and 1 under the node this entry would become
    //   ck, ca       that node's entry keys at ranks 0 and 1, had this entry been taken
    //   gl0, gl1     lp0[D + 2], lp1[D + 2]: that node's rc0, rc1
    // Every lane starts with the root's values; key 0 keeps unborn lanes out of the argmax, and a lane's birth
    // overwrites every field that differs. Rank, first child and next sibling are derived in the finalize.
    const uint32_t lanes_below = (1u << lane) - 1u;
    int D = 0, rho = 0, par = -1;
    float L = 0.0f;
    const float sc0 = __fadd_rn(0.0f, lp0[0]);
    uint32_t adv = score_key(__fadd_rn(0.0f, lp1[0]));
    float nxt = lp_s[min(2, Vs - 1)];
    float rc0 = lp0[1], rc1 = lp1[1], gl0 = lp0[2], gl1 = lp1[2];
    uint32_t ck = score_key(__fadd_rn(sc0, rc0));
    uint32_t ca = score_key(__fadd_rn(sc0, rc1));
    uint32_t mask = 1u;
    uint32_t key = 0u;                      // lane 0's entry (the root's) joins through c at step 1

    // The previous step's outcome, applied one step late (software pipelining, see the note): the winner
    // flag, the newborn flag, the best key, the winner's lane and what it shuffled out.
    bool is_w = false, is_n = true;         // step 0 "bore" the root on lane 0: its key c joins at step 1
    uint32_t bal = 1u, m = 0u, c = score_key(sc0), a = adv, wmask = 1u;
    int wl = -1, wD = -1, sp = 0;
    float g0 = rc0, g1 = rc1;
    if (lane != 0) is_n = false;

    // Applies the outcome of step t to this lane's registers, branch-free (unchanged inputs recompute
    // unchanged values). Step 0 is the root's birth on lane 0, already in the registers.
    auto apply = [&](int t) {
        // The winner: its entry moves to rank rho + 1 (its key already did) and its adv to rank rho + 2.
        const uint32_t w_adv = (rho + 2 < V) ? score_key(__fadd_rn(L, nxt)) : 0u;
        adv = is_w ? w_adv : adv;
        rho = is_w ? rho + 1 : rho;
        // The newborn: slot t under the winner (lane wl), depth D_w + 1, score key_score(m), entry keys c at
        // rank 0 (it joins `key` at the next step) and a at rank 1.
        const bool born = is_n && t > 0;
        adv = born ? a : adv;
        rho = born ? 0 : rho;
        L = born ? key_score(m) : L;
        D = born ? wD + 1 : D;
        rc0 = born ? g0 : rc0;
        rc1 = born ? g1 : rc1;
        par = born ? wl : par;
        mask = born ? (wmask | (1u << (t & 31))) : mask;
        // What a take of the entry would hand out. key_score(0) is NaN: a dead entry's keys stay 0.
        const float sc = key_score(is_n ? c : key);
        ck = score_key(__fadd_rn(sc, rc0));
        ca = score_key(__fadd_rn(sc, rc1));
        nxt = lp_s[min(D, K - 1) * Vs + min(rho + 2, Vs - 1)];
        gl0 = lp0[D + 2];                   // D <= K <= 64: inside lp0 / lp1's 72 entries
        gl1 = lp1[D + 2];
    };

    // Step s: the chain REDUX -> max -> compare -> ballot -> lowest lane -> select -> the next REDUX, with the
    // previous step's bookkeeping issued inside the REDUX's latency. The newborn of step s - 1 (lane s - 1)
    // still holds key 0 in this REDUX: its entry c joins through the max, so the shuffle that brought c
    // overlaps the REDUX. Steps past B are no-ops (no candidate), and so is every step after one that found
    // no live entry (every key stays 0, and the newborn flag guards the merge).
    auto step = [&](int s) {
        const uint32_t R = __reduce_max_sync(kFull, key);
        apply(s - 1);
        key = is_n ? c : key;
        const bool live = key != 0u && s <= B;
        m = max(R, c);
        // The winner: the smallest slot (= lane) holding the best key.
        const bool cand = live && key == m;
        bal = __ballot_sync(kFull, cand);
        const uint32_t taken = cand ? adv : key;     // entry (w, rho) -> (w, rho + 1), if I am the winner
        const bool lower = (bal & lanes_below) != 0u;
        key = lower ? key : taken;                   // the next REDUX's operand
        is_w = cand && !lower;
        // The winner hands the newborn (slot s, lane s) what it precomputed; applied at the next step.
        wl = __ffs((int)bal) - 1;
        c = __shfl_sync(kFull, ck, wl);
        a = __shfl_sync(kFull, ca, wl);
        g0 = __shfl_sync(kFull, gl0, wl);
        g1 = __shfl_sync(kFull, gl1, wl);
        wD = __shfl_sync(kFull, D, wl);
        wmask = __shfl_sync(kFull, mask, wl);
        is_n = lane == s && bal != 0u;
        sp = s;
    };

    // Groups of kSmallUnroll steps in one basic block, so the scheduler can start each REDUX right after the
    // select it depends on; the build stops after a group whose last step took nothing.
    for (int s = 1; s <= B; s += kSmallUnroll) {
#pragma unroll
        for (int u = 0; u < kSmallUnroll; ++u) step(s + u);
        if (bal == 0u) break;
    }
    apply(sp);      // the last step's outcome (a no-op if it took nothing)

    // ---- finalize (warp 0): one slot per lane ----
    // Taken slots are 1..n, lanes born with a depth >= 1. Siblings (same parent) are taken in rank order, so
    // among them: rank = the number of smaller slots, the first child is the smallest slot, the next sibling
    // the next larger slot. Unborn lanes get distinct non-parent values so that they match nobody.
    const bool born = D > 0;
    const int n = __popc(__ballot_sync(kFull, born));
    const bool valid = lane <= n;
    const uint32_t sib = __match_any_sync(kFull, born ? par : -2 - lane);
    const uint32_t later = sib & ~(lanes_below | (1u << lane));
    const int rnk = __popc(sib & lanes_below);
    if (born && rnk == 0) fc_s[par] = lane;
    __syncwarp();
    if (lane < N) {
        const size_t i = (size_t)g * N + lane;
        out_parent[i] = born ? par : -1;
        out_depth[i] = valid ? D : -1;
        out_token[i] = born ? ids_s[(D - 1) * Vs + rnk] : -1;
        out_rank[i] = born ? rnk : -1;
        out_logw[i] = valid ? L : -INFINITY;
        out_first_child[i] = fc_s[lane];
        out_next_sibling[i] = (born && later != 0u) ? __ffs((int)later) - 1 : -1;
        out_mask[i] = valid ? mask : 0u;    // W == 1
    }
    if (lane == 0) n_nodes[g] = n;
}

}  // namespace
