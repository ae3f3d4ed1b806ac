// kernels/verify_attn/mainloop_wgmma.cuh -- kdt_verify_attn_fwd on sm_90a (attend_wgmma): the warp-specialised
// wgmma pipeline. Warpgroup 0 computes S = Q K^T (m64n64: all keys of a tile over all of Dqk), the online softmax
// and P V for value columns 0..255; warpgroup 1 loads the key tiles (cp.async, or whole prefix pages by tensor
// copy) and computes P V for columns 256..511. P_k lives in the rope column block of tile k's own buffer; the
// handoffs are shared-memory mbarriers (config.cuh, MB_*). With value_split = 2 a CTA owns half the value columns:
// warpgroup 0 computes S and the softmax only, warpgroup 1 P V of the CTA's 256 columns (under warpgroup 0's S of
// the next tile). Compiled only for sm_90a. Schedule, mbarrier parities and their proofs:
// plans/kernels/verify-attn.md, "sm_90a pipeline".
#pragma once

#include <stdint.h>

#include "common/cluster.cuh"
#include "common/mbarrier.cuh"
#include "common/ptx.cuh"
#include "common/wgmma.cuh"
#include "verify_attn/config.cuh"
#include "verify_attn/params.cuh"
#include "verify_attn/softmax.cuh"
#include "verify_attn/tiles.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace va {

using kdt::cp_async_commit;
using kdt::cp_async_wait;
using kdt::fence_proxy_async;
using kdt::mbar_arrive;
using kdt::mbar_init;
using kdt::mbar_wait;
using kdt::pack_bf16;
using kdt::reg_fence_all;
using kdt::smem_addr;
using kdt::wgmma_commit;
using kdt::wgmma_desc_sw128;
using kdt::wgmma_desc_sw128_mn;
using kdt::wgmma_fence;
using kdt::wgmma_m64n256k16_tb;
using kdt::wgmma_m64n64k16;
using kdt::wgmma_retire;

// O (m64n256 fragment) += P V of one key tile on wgmma, issued and committed, not waited (wgmma_retire): A = P
// at p_addr (K-major 128-byte swizzle, k16 step kk at +32*kk bytes inside the 128-byte row), B = V at v_addr,
// this warpgroup's 256 value columns (MN-major: LBO = BLK to the next 64 value columns, SBO = 8*TROW to the
// next 8 keys, k16 step kk at +16*TROW bytes).
__device__ __forceinline__ void pv_wgmma(float (&o)[O_NT][4], uint32_t p_addr, uint32_t v_addr) {
    const uint64_t dp = wgmma_desc_sw128(p_addr);
    const uint64_t dv = wgmma_desc_sw128_mn(v_addr, BLK, 8 * TROW);
    reg_fence_all(o);  // a rescale of o is done before the fence
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KSTEPS_PV; ++kk)
        wgmma_m64n256k16_tb(o, dp + static_cast<uint64_t>((32 * kk) >> 4),
                            dv + static_cast<uint64_t>((16 * TROW * kk) >> 4));
    wgmma_commit();
    reg_fence_all(o);
}

// S (64 rows x 64 keys) = Q K^T over all of Dqk on wgmma, into d (zeroed first): the DQK/64 column blocks m x 4
// k16 steps kk, both operands K-major 128-byte swizzle, step (m, kk) at +m*BLK + 32*kk bytes from the
// descriptors dq / dk; committed and retired. d[4nt + e] = row rowA (e < 2) / rowB, key 8nt + 2cq + (e & 1).
__device__ __forceinline__ void s_wgmma(float (&d)[4 * PIPE_NT], uint64_t dq, uint64_t dk) {
#pragma unroll
    for (int e = 0; e < 4 * PIPE_NT; ++e) d[e] = 0.f;
    reg_fence_all(d);
    wgmma_fence();
#pragma unroll
    for (int m = 0; m < DQK / 64; ++m)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const uint64_t off = static_cast<uint64_t>((m * BLK + 32 * kk) >> 4);
            wgmma_m64n64k16(d, dq + off, dk + off);
        }
    wgmma_commit();
    reg_fence_all(d);
    wgmma_retire(d);
}

// Sends o[j] for j in [FIRST, FIRST + O_NT / 2), normalised, into the partner's inbox (pair_merge_store): st.async
// to `inbox_there` (the inbox in the partner's window), each completing its bytes on the partner's INBOX barrier.
template <int FIRST>
__device__ __forceinline__ void pair_send(const float (&o)[O_NT][4], uint32_t inbox_there, uint32_t bar_there,
                                          int tid, float invA, float invB) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const float inv = half ? invB : invA;
#pragma unroll
        for (int jp = 0; jp < O_NT / 4; ++jp) {
            const int j = FIRST + 2 * jp;
            uint4 bits;
            bits.x = __float_as_uint(inv != 0.f ? o[j][2 * half] * inv : 0.f);
            bits.y = __float_as_uint(inv != 0.f ? o[j][2 * half + 1] * inv : 0.f);
            bits.z = __float_as_uint(inv != 0.f ? o[j + 1][2 * half] * inv : 0.f);
            bits.w = __float_as_uint(inv != 0.f ? o[j + 1][2 * half + 1] * inv : 0.f);
            kdt::store_async_to_block(inbox_there + 16 * ((2 * jp + half) * THREADS + tid), bits, bar_there);
        }
    }
}

// Merges o[j] for j in [FIRST, FIRST + O_NT / 2) of row `half` (scaled by `own`) with what arrived (scaled by
// `theirs`) into dst + 8 j (pair_merge_store); den == 0: +0, never -0.
template <int FIRST>
__device__ __forceinline__ void pair_merge_row(const float (&o)[O_NT][4], const float4* inbox, int tid, int half,
                                               float own, float theirs, bool any, float* dst) {
#pragma unroll
    for (int jp = 0; jp < O_NT / 4; ++jp) {
        const int j = FIRST + 2 * jp;
        const float4 peer = inbox[(2 * jp + half) * THREADS + tid];
        *reinterpret_cast<float2*>(dst + 8 * j) =
            any ? make_float2(fmaf(o[j][2 * half], own, peer.x * theirs),
                              fmaf(o[j][2 * half + 1], own, peer.y * theirs))
                : make_float2(0.f, 0.f);
        *reinterpret_cast<float2*>(dst + 8 * (j + 1)) =
            any ? make_float2(fmaf(o[j + 1][2 * half], own, peer.z * theirs),
                              fmaf(o[j + 1][2 * half + 1], own, peer.w * theirs))
                : make_float2(0.f, 0.f);
    }
}

// The end of a paired CTA whose partner holds key tiles too. Rank r keeps the value columns of o[j] for j in
// [16r, 16r + 16) in both warpgroups (columns 128r..+127 and 256 + 128r..+127) and sends the other sixteen j,
// normalised, with the rows' lse, into the partner's first key buffer (distributed shared memory, [j pair][half]
// [thread] float4: conflict-free on both sides): both warpgroups send 32 KB and merge 32 KB. Each merges its kept
// columns with what arrived through the lse weights, as the combine would, and writes them to slot c's partial:
// half the bytes of two splits' partials, for the store and for the combine. One cluster barrier: the partner is
// past its mainloop (its key buffers free). The sends are st.async, each completing its bytes on the receiver's
// INBOX mbarrier, whose one arrival (thread 0's) announced the INBOX_BYTES it waits for: a CTA reads its inbox once
// they have all landed, with no second cluster barrier. A CTA's shared memory is read by no one else, and written by
// its partner only before its INBOX wait ends, so either may exit after it.
__device__ __forceinline__ void pair_merge_store(const FwdParams& p, const CtaWork& w, unsigned char* smem,
                                                 const float (&o)[O_NT][4], int wg, int tid, int rowA, int rowB,
                                                 int cq, int rank) {
    // a thread's O_NT / 2 float4 of o (two j of one row each), then the rows' lse
    constexpr uint32_t INBOX_BYTES = THREADS * (O_NT / 2) * 16 + ROWS * 4;
    static_assert(THREADS * (O_NT / 2) * 16 <= KV_TILE_BYTES, "the inbox is the first key buffer");
    static_assert(INBOX_BYTES < (1u << 20), "an mbarrier's tx-count holds the bytes it waits for");
    float4* inbox = reinterpret_cast<float4*>(smem + OFF_KV);
    float* peer_lse = reinterpret_cast<float*>(smem + OFF_PEER_LSE);
    const float* lse_s = reinterpret_cast<const float*>(smem + OFF_PAIR_LSE);
    const float* invl_s = reinterpret_cast<const float*>(smem + OFF_INVL);
    const uint32_t partner = static_cast<uint32_t>(rank ^ 1);
    const uint32_t mb_inbox = smem_addr(smem) + OFF_BAR + 8 * MB_INBOX;
    const uint32_t bar_there = kdt::cluster_addr(mb_inbox, partner);
    if (tid == 0) kdt::mbar_arrive_expect_tx(mb_inbox, INBOX_BYTES);
    kdt::cluster_sync();  // the partner is past its mainloop: its inbox (first key buffer) is read no more
    // the register indices must be constants: one branch a rank
    const uint32_t inbox_there = kdt::cluster_addr(inbox, partner);
    if (rank == 0)
        pair_send<O_NT / 2>(o, inbox_there, bar_there, tid, invl_s[rowA], invl_s[rowB]);
    else
        pair_send<0>(o, inbox_there, bar_there, tid, invl_s[rowA], invl_s[rowB]);
    if (wg == 0 && cq == 0) {
        const uint32_t lse_there = kdt::cluster_addr(peer_lse, partner);
        kdt::store_async_to_block(lse_there + 4 * rowA, __float_as_uint(lse_s[rowA]), bar_there);
        kdt::store_async_to_block(lse_there + 4 * rowB, __float_as_uint(lse_s[rowB]), bar_there);
    }
    mbar_wait(mb_inbox, 0);  // the partner's INBOX_BYTES have landed (the barrier's first phase)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = half ? rowB : rowA;
        const int gr = w.r0 + row;
        if (gr >= w.R) continue;
        const float lm = lse_s[row], lp = peer_lse[row];
        const float mx = fmaxf(lm, lp);
        const float wm = mx != NEG_INF ? expf(lm - mx) : 0.f, wp = mx != NEG_INF ? expf(lp - mx) : 0.f;
        const float den = wm + wp;
        const float own = den > 0.f ? wm * invl_s[row] / den : 0.f;  // this CTA's O is not normalised yet
        const float theirs = den > 0.f ? wp / den : 0.f;
        float* dst = p.part_o + ((static_cast<size_t>(w.split) * p.G + w.g) * w.Rpad + gr) * DV + PV_WG_N * wg + 2 * cq;
        if (rank == 0)
            pair_merge_row<0>(o, inbox, tid, half, own, theirs, den > 0.f, dst);
        else
            pair_merge_row<O_NT / 2>(o, inbox, tid, half, own, theirs, den > 0.f, dst);
        if (wg == 0 && cq == 0 && rank == 0)
            p.part_lse[(static_cast<size_t>(w.split) * p.G + w.g) * w.Rpad + gr] = den > 0.f ? mx + logf(den) : NEG_INF;
    }
}

// The whole sm_90a CTA: the exit of a CTA without work, mbarrier init, prologue (Q + tile kb by all threads,
// tile kb+1 by WG1, left in flight), the two warpgroups' loops, then O / l stored by both. One function, like
// attend_mma: splitting it (the idle exit, the warpgroups' loops, the O store) changed the SASS. tid_in:
// threadIdx.x as the kernel read it, taken by reference for the same reason (plans/kernels/verify-attn.md,
// "SASS identity").
// PAIRED (kdt_verify_attn_fwd_paired): splits 2c and 2c + 1 are a cluster of two and merge their partials into slot
// c (pair_merge_store); rank 1 of a pair whose split holds no key tile leaves the slot to rank 0, which then
// stores alone (its split holds the request's last tiles: `exchange` false) or, holding none either, marks it empty.
template <bool PAIRED>
__device__ __forceinline__ void attend_wgmma(const FwdParams& p, unsigned char* smem, const int& tid_in) {
    const int tid = tid_in;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const CtaWork w = PAIRED ? paired_work(cta_work(p)) : cta_work(p);
    const int pair_rank = PAIRED ? static_cast<int>(blockIdx.z) & 1 : 0;
    if (PAIRED && pair_rank == 1 && w.r0 < w.active && w.kb >= w.ke) return;
    VA_RETURN_IF_NO_WORK(p, w, tid)
    // rank 1 holds tiles here; rank 0 exchanges unless its split ends the request's tiles (rank 1's then holds none)
    const bool exchange = PAIRED && (pair_rank == 1 || w.ke < w.n_pref + (p.N + KV_T - 1) / KV_T);

    // the fields as locals (the kernel's own variables before the reshape; reading w.kb etc. at each use
    // compiled differently)
    const int g = w.g, split = w.split, R = w.R, r0 = w.r0, Rpad = w.Rpad, active = w.active, plen = w.plen,
              n_pref = w.n_pref, kb = w.kb, ke = w.ke;
    const int G = p.G, N = p.N, H = p.H, W = p.W, out_bf16 = p.out_bf16;
    const float scale_log2e = p.scale_log2e;
    void* __restrict__ out = p.out;
    float* __restrict__ part_o = p.part_o;
    const uint32_t* __restrict__ mask = p.mask;
    const uint16_t* __restrict__ kv_cache = p.kv_cache;
    const uint16_t* __restrict__ kv_tree = p.kv_tree;
    const uint32_t sQ = smem_addr(smem);
    const uint32_t sKV = sQ + OFF_KV;
    float* alpha_s = reinterpret_cast<float*>(smem + OFF_ALPHA);
    float* invl_s = reinterpret_cast<float*>(smem + OFF_INVL);
    const int* bt_row = p.block_table + static_cast<size_t>(g) * p.max_pages;

    const int gq = lane >> 2, cq = lane & 3;
    const int wg = warp >> 2;                     // 0: S + softmax + P V cols 0..255; 1: loads + P V 256..511
    // value_split 2: WG0 S + softmax only, WG1 loads + P V of the CTA's columns 256 value_half..+255
    const bool halved = w.value_split > 1;
    const bool does_pv = !halved || wg == 1;
    const int value_block = halved ? w.value_half : wg;        // this warpgroup's 256 P V columns
    const int rowA = 16 * (warp & 3) + gq;        // D-fragment rows of this thread (S and P V alike)
    const int rowB = rowA + 8;
    const int grA = r0 + rowA, grB = r0 + rowB;
    const bool split_mode = p.num_splits > 1;
    // One query tile a request: no other CTA reads this CTA's key tiles, which stream from DRAM once.
    const bool one_query_tile = static_cast<int>(gridDim.x) == w.value_split;
    // WG1's key tiles: with one query tile, evicted from L2 first, so the stream does not push out the split
    // partials (0.95 at G4 N8 P32768 and G16 N8 P8192; elsewhere the default policy: other CTAs read the same keys
    // from L2). Tile kb, copied by all threads in the prologue, keeps the default.
    const uint64_t key_policy = kdt::l2_policy(one_query_tile);
    // mbarrier i at sBar + 8 i (MB_*); initialised here, published by the prologue's __syncthreads
    const uint32_t sBar = sQ + OFF_BAR;
    const uint32_t mb_pready = sBar + 8 * MB_PREADY, mb_full = sBar + 8 * MB_FULL, mb_sdone = sBar + 8 * MB_SDONE;
    if (tid == 0) {
#pragma unroll
        for (int i = 0; i < PIPE_MBARS; ++i)
            mbar_init(sBar + 8 * i, (i >= MB_EMPTY && i < MB_SDONE) ? MB_EMPTY_ARRIVALS
                                    : i >= MB_LANDED                    ? 1
                                                                        : MB_HANDOFF_ARRIVALS);
        if (PAIRED) kdt::fence_mbarrier_init_cluster();  // INBOX: the partner's st.async complete on it
    }

    // ---- prologue: Q + tile kb (all threads), tile kb+1 (WG1, its own cp.async group, left in flight). A paired
    // CTA whose request has several query tiles issues tile kb+1 only once Q and tile kb have landed: those two
    // then share the start's burst of copies with no other tile, and the first S starts sooner. Elsewhere tile kb+1
    // goes at once (with one query tile the copies' bytes in flight set the pace). Two whole branches, not one
    // condition around the copy: so the unpaired kernel's SASS stays the plain order's (plans/kernels/verify-attn.md,
    // "sm_90a pipeline").
    load_q_tile(sQ, p, w, tid);
    load_kv_tile(sKV, kb, kb < n_pref ? __ldg(bt_row + (kb * KV_T) / PAGE) : 0, n_pref, plen, N, g, kv_cache,
                 kv_tree);
    cp_async_commit();
    if (PAIRED && !one_query_tile) {
        const int page1 = wg == 1 && kb + 1 < n_pref ? __ldg(bt_row + ((kb + 1) * KV_T) / PAGE) : 0;
        cp_async_wait<0>();
        fence_proxy_async();  // this thread's cp.async writes (Q, tile kb) -> visible to wgmma (async proxy)
        __syncthreads();      // Q and tile kb in smem for everyone; the mbarriers are initialised
        if (wg == 1 && kb + 1 < ke) {
            load_kv_tile_wg1(sKV + KV_TILE_BYTES, kb + 1, page1, n_pref, plen, N, g, kv_cache, kv_tree, key_policy);
            cp_async_commit();
        }
    } else {
        if (wg == 1 && kb + 1 < ke) {
            load_kv_tile_wg1(sKV + KV_TILE_BYTES, kb + 1,
                             kb + 1 < n_pref ? __ldg(bt_row + ((kb + 1) * KV_T) / PAGE) : 0, n_pref, plen, N, g,
                             kv_cache, kv_tree, key_policy);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        fence_proxy_async();
        __syncthreads();
    }

    float o[O_NT][4];     // m64n256 D fragment: o[j][e] = row rowA (e < 2) / rowB, column 256 wg + 8j + 2cq + (e&1)
#pragma unroll
    for (int j = 0; j < O_NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
    // P V of tile k for this warpgroup's 256 value columns (pv_wgmma below): A = P_k (column block P_BLK of the
    // tile), B = V = column blocks 4 value_block..+3 of the tile; retired by the same warpgroup (wgmma_retire).

    if (wg == 0) {
        // ---- WG0: S = Q K^T (m64n64, all keys, all of Dqk), online softmax, P, its half of P V
        const bool actA = grA < active, actB = grB < active;
        float mB = NEG_INF, mA = NEG_INF;  // running max (scaled, log2 units); this order: ptxas's registers follow it
        float lA = 0.f, lB = 0.f;          // partial row sums over this thread's columns
        const uint64_t dq = wgmma_desc_sw128(sQ);
        for (int k = kb; k < ke; ++k) {
            const int it = k - kb;
            const uint32_t tile = sKV + static_cast<uint32_t>((it & 1) * KV_TILE_BYTES);
            // tile k landed (WG1 waited + fenced its cp.async): FULL phase it-1 (WG1 arrives in each of its
            // iterations with k + 1 < ke, i.e. 0..n-2 of the split's n tiles: phase j in iteration j)
            if (it > 0) mbar_wait(mb_full, (it - 1) & 1);

            // tree tile: mask bits of keys j0..j0+63 for rows rowA / rowB (issued before S: latency hidden)
            const bool tree = k >= n_pref;
            const int j0 = (k - n_pref) * KV_T;
            uint64_t wA = 0u, wB = 0u;
            if (tree && j0 < N) {
                const uint32_t* mrow = mask + static_cast<size_t>(g) * N * W + (j0 >> 5);
                const bool two = (j0 >> 5) + 1 < W;  // keys j0+32.. exist (W = ceil(N / 32))
                if (actA) {
                    const uint32_t* m = mrow + (grA / H) * W;
                    wA = __ldg(m) | (two ? static_cast<uint64_t>(__ldg(m + 1)) << 32 : 0u);
                }
                if (actB) {
                    const uint32_t* m = mrow + (grB / H) * W;
                    wB = __ldg(m) | (two ? static_cast<uint64_t>(__ldg(m + 1)) << 32 : 0u);
                }
            }

            // S (64 rows x 64 keys): 36 wgmma.m64n64k16 over the 9 column blocks x 4 k16 steps; Q and K both
            // K-major 128-byte swizzle. d[4nt + e] = row rowA (e < 2) / rowB, key 8nt + 2cq + (e & 1).
            float d[4 * PIPE_NT];
            s_wgmma(d, dq, wgmma_desc_sw128(tile));
            // P_k overwrites the rope block of tile k, which every warp's share of the S wgmma reads (all 64
            // key rows): all four warps must be past their wait first.
            mbar_arrive(mb_sdone);
            mbar_wait(mb_sdone, it & 1);

            // scale, mask, row max: a thread holds 16 keys of each of its two rows, a quad holds the whole
            // row (no cross-warp exchange); valid keys c < lim (+ mask bit on tree)
            float mxA, mxB;
            scale_mask_rowmax<PIPE_NT, true>(d, cq, tree ? N - j0 : plen - k * KV_T, tree, wA, wB, scale_log2e,
                                             mxA, mxB);
            float muA, muB;
            const float alA = move_max<MAX_SLACK>(mA, mxA, muA), alB = move_max<MAX_SLACK>(mB, mxB, muB);

            // P = exp2(s - m) -> bf16 into the rope block of tile k (64 rows x 128 B, chunk c of row r at
            // c ^ (r & 7): the K-major 128-byte swizzle atom layout the P V wgmma reads); row sums in fp32
            float sumA, sumB;
            write_p<PIPE_NT, TROW>(d, muA, muB, tile + static_cast<uint32_t>(P_BLK * BLK + rowA * TROW + 4 * cq), 0,
                                   rowA & 7, sumA, sumB);
            lA = lA * alA + sumA;
            lB = lB * alB + sumB;
            if (cq == 0) {  // WG1 rescales its O columns with the same alpha (read after PREADY)
                alpha_s[rowA] = alA;
                alpha_s[rowB] = alB;
            }
            fence_proxy_async();  // this thread's P stores (generic proxy) -> visible to P V wgmma (async)
            mbar_arrive(mb_pready);  // release: P_k and alpha_k (PREADY phase it)

            if (does_pv) {
                rescale_rows(o, alA, alB);  // this warpgroup's previous P V has retired (wgmma_retire below)
                pv_wgmma(o, tile + static_cast<uint32_t>(P_BLK * BLK),
                         tile + static_cast<uint32_t>(value_block * (PV_WG_N / 64) * BLK));
                wgmma_retire(o);
            }
            // WG1 refills this buffer with tile k+2 once both warpgroups' P V of tile k retired (release:
            // also orders this thread's P_k stores before the cp.async overwrite of the rope block; with
            // value_split WG1 alone reads V, and WG0 arrives for its P_k stores only)
            if (k + 2 < ke) mbar_arrive(sBar + 8 * (MB_EMPTY + (it & 1)));
        }
        // row sums -> 1 / l and lse (WG0 alone holds the running max and every tile's row sums)
        lA = quad_sum(lA);
        lB = quad_sum(lB);
        if (cq == 0) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = half ? rowB : rowA;
                const bool act = half ? actB : actA;
                const float m = half ? mB : mA;
                const float L = half ? lB : lA;
                finish_row(p, w, split_mode, invl_s, row, act, m, L,
                           exchange ? reinterpret_cast<float*>(smem + OFF_PAIR_LSE) : nullptr);
            }
        }
    } else {
        // ---- WG1: key tile loads (tile k+2 into tile k's buffer), its half of P V. With kv_tma the prefix tiles
        // whole in their page (k < plen / KV_T) come by tensor copy, issued by WG1's first thread on LANDED[buffer]
        // (the tiles before any cp.async one, so the n-th use of a buffer's LANDED is its n-th tensor copy).
        int page2 = kb + 2 < n_pref ? __ldg(bt_row + ((kb + 2) * KV_T) / PAGE) : 0;
        const int tma_tiles = p.kv_tma ? plen / KV_T : 0;
        for (int k = kb; k < ke; ++k) {
            const int it = k - kb;
            const uint32_t tile = sKV + static_cast<uint32_t>((it & 1) * KV_TILE_BYTES);
            mbar_wait(mb_pready, it & 1);  // P_k, alpha_k in smem (WG0 fenced its P stores)
            // read alpha before the FULL arrive below: WG0 writes alpha_{k+1} only after its FULL wait
            rescale_rows(o, alpha_s[rowA], alpha_s[rowB]);
            pv_wgmma(o, tile + static_cast<uint32_t>(P_BLK * BLK),
                     tile + static_cast<uint32_t>(value_block * (PV_WG_N / 64) * BLK));
            if (k + 1 < ke) {
                // tile k+1 -> visible to WG0's S wgmma, waited while this warpgroup's P V runs: the only cp.async
                // group in flight, or (from the third tile on) the tensor copy issued in iteration it - 1 into
                // buffer (it + 1) & 1, that buffer's ((it - 1) >> 1)-th
                if (it >= 1 && k + 1 < tma_tiles) {
                    mbar_wait(sBar + 8 * (MB_LANDED + ((it + 1) & 1)), ((it - 1) >> 1) & 1);
                } else {
                    cp_async_wait<0>();
                    fence_proxy_async();
                }
                mbar_arrive(mb_full);  // release: tile k+1, and this thread's alpha_k read (FULL phase it)
            }
            wgmma_retire(o);
            if (k + 2 < ke) {
                // every P V read of tile k retired (this thread's just now, the other WG1 warps' and WG0's
                // when EMPTY[it & 1] completes); it completes once per use of the buffer, i.e. for the
                // (it >> 1)-th time at tile it
                const uint32_t mb_empty = sBar + 8 * (MB_EMPTY + (it & 1));
                mbar_arrive(mb_empty);
                mbar_wait(mb_empty, (it >> 1) & 1);
                if (k + 2 < tma_tiles) {
                    if (tid == WG_THREADS)
                        copy_page_tile(tile, p.kv_map, page2, sBar + 8 * (MB_LANDED + (it & 1)), key_policy);
                } else {
                    load_kv_tile_wg1(tile, k + 2, page2, n_pref, plen, N, g, kv_cache, kv_tree, key_policy);
                    cp_async_commit();
                }
                page2 = k + 3 < n_pref ? __ldg(bt_row + ((k + 3) * KV_T) / PAGE) : 0;
            }
        }
    }
    __syncthreads();  // invl_s (WG0) -> both warpgroups
    if (exchange) {
        pair_merge_store(p, w, smem, o, wg, tid, rowA, rowB, cq, pair_rank);
        return;
    }

    // ---- store O / l: this thread's rows rowA / rowB, columns 256 value_block + 8j + 2cq (+1)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = half ? rowB : rowA;
        const int gr = r0 + row;
        if (gr >= R || !does_pv) continue;
        const float inv = invl_s[row];
        const size_t obase = split_mode ? ((static_cast<size_t>(split) * G + g) * Rpad + gr) * DV
                                        : (static_cast<size_t>(g) * R + gr) * DV;
#pragma unroll
        for (int j = 0; j < O_NT; ++j) {
            const int col = PV_WG_N * value_block + 8 * j + 2 * cq;
            // inv == 0 (row past n_nodes / no key): +0, never -0 (the contract's zero rows)
            const float v0 = inv != 0.f ? o[j][2 * half] * inv : 0.f;
            const float v1 = inv != 0.f ? o[j][2 * half + 1] * inv : 0.f;
            if (split_mode) {
                *reinterpret_cast<float2*>(part_o + obase + col) = make_float2(v0, v1);
            } else if (out_bf16) {
                *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(out) + obase + col) = pack_bf16(v0, v1);
            } else {
                *reinterpret_cast<float2*>(static_cast<float*>(out) + obase + col) = make_float2(v0, v1);
            }
        }
    }
}

}  // namespace va
#endif
