// kernels/verify_attn/mainloop_mma.cuh -- kdt_verify_attn_fwd on the 227 KB parts without wgmma (attend_mma:
// sm_90, sm_100): the synchronous mma.sync m16n8k16 path with the 64-row Q tile resident in smem. Per key tile:
// B0 (tile k in smem, tile k+1 prefetched into the other buffer), S = Q K^T by ldmatrix + mma.sync (split-D),
// B1 (row max across the warps sharing a row), P -> smem, B2, O = O * alpha + P V with warp w owning value
// columns 64w..+64 of all 64 rows (pv_mma.cuh). Layouts and their reasons: plans/kernels/verify-attn.md,
// "mma.sync mainloop".
#pragma once

#include <stdint.h>

#include "common/mma.cuh"
#include "common/ptx.cuh"
#include "verify_attn/config.cuh"
#include "verify_attn/params.cuh"
#include "verify_attn/pv_mma.cuh"
#include "verify_attn/softmax.cuh"
#include "verify_attn/tiles.cuh"

namespace va {

using kdt::cp_async_commit;
using kdt::cp_async_wait;
using kdt::ldsm_x4;
using kdt::mma_bf16;
using kdt::named_barrier;
using kdt::smem_addr;

// The whole CTA on this path: the exit of a CTA without work, prologue, the tile loop, the epilogue
// (share_row_sums, finish_rows, store_o). tid_in: threadIdx.x as the kernel read it (only the kernel's own read
// carries its launch bounds).
__device__ __forceinline__ void attend_mma(const FwdParams& p, unsigned char* smem, const int& tid_in) {
    static_assert(QREG || WGMMA || (SPLIT_D && STAGES == 2), "mainloop_mma: split-D S on two 64-key buffers");
    const int tid = tid_in;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const CtaWork w = cta_work(p);
    VA_RETURN_IF_NO_WORK(p, w, tid)

    const int g = w.g, plen = w.plen, n_pref = w.n_pref, kb = w.kb, ke = w.ke;
    const int N = p.N, H = p.H, W = p.W;
    const uint32_t* __restrict__ mask = p.mask;
    const uint16_t* __restrict__ kv_cache = p.kv_cache;
    const uint16_t* __restrict__ kv_tree = p.kv_tree;
    const uint32_t sQ = smem_addr(smem);
    const uint32_t sKV = sQ + OFF_KV;
    const uint32_t sP = sQ + OFF_P;
    float* redmax = reinterpret_cast<float*>(smem + OFF_REDMAX);
    float* alpha_s = reinterpret_cast<float*>(smem + OFF_ALPHA);
    const float scale_log2e = p.scale_log2e;
    const int* bt_row = p.block_table + static_cast<size_t>(g) * p.max_pages;

    // ---- prologue: Q tile + first key tile in one cp.async group
    load_q_tile(sQ, p, w, tid);
    int page_next = kb < n_pref ? __ldg(bt_row + (kb * KV_T) / PAGE) : 0;
    load_kv_tile(sKV, kb, page_next, n_pref, plen, N, g, kv_cache, kv_tree);
    cp_async_commit();
    page_next = kb + 1 < n_pref ? __ldg(bt_row + ((kb + 1) * KV_T) / PAGE) : 0;

    // ---- per-lane roles and ldmatrix addresses
    const int gq = lane >> 2;         // mma group id: fragment rows gq, gq+8
    const int cq = lane & 3;          // thread in group: fragment columns 2cq, 2cq+1
    const int r7 = lane & 7;          // row & 7 of the ldmatrix row this lane addresses (all bases are 8-aligned)
    const int hi16 = lane >> 4;       // lanes 16..31 address matrices 2,3
    const int hi8 = (lane >> 3) & 1;  // lanes 8..15 / 24..31 address matrices 1,3

    // S role (split-D): warp w = 4*dh + 2*rg + cg computes rows 32rg..+32 x keys 32cg..+32 over the k16 steps
    // 2j + dh; after the exchange with warp w ^ 4 it owns rows own0..own0+15 x those keys
    const int s_cg = warp % S_WN;
    const int s_dh = warp >> 2;
    const int s_rg = (warp >> 1) & 1;
    const int own0 = 32 * s_rg + 16 * s_dh;
    const int rowA = own0 + gq;       // fragment rows of this thread in the CTA tile
    const int rowB = rowA + 8;
    const int grA = w.r0 + rowA, grB = w.r0 + rowB;
    const bool actA = grA < w.active, actB = grB < w.active;

    // A (Q, 16 rows x k16): matrix 0 rows 0-7 / k 0-7, 1 rows 8-15 / k 0-7, 2 rows 0-7 / k 8-15, 3 rows 8-15 / k 8-15
    // -> lane addresses row (lane & 15), chunk 2*ks + hi16. B (K, keys as n, dims as k; non-transposed): matrices
    // (ntile 0, k 0-7), (ntile 0, k 8-15), (ntile 1, k 0-7), (ntile 1, k 8-15) -> lane addresses key 8*hi16 + r7,
    // chunk 2*ks + hi8. With ks = 2j + dh, chunk 2ks + hi = 4j + 2dh + hi and the swizzled chunk is
    // 8*(j>>1) + ((4*(j&1) + 2dh) ^ (hi ^ r7)): two per-lane offsets (j even / odd), + 128*(j>>1) immediate.
    uint32_t qaddr[2], kaddr[2];
#pragma unroll
    for (int v = 0; v < 2; ++v) {
        qaddr[v] = sQ + static_cast<uint32_t>((32 * s_rg + (lane & 15)) * ROW_BYTES +
                                              (((4 * v + 2 * s_dh) ^ (hi16 ^ r7)) << 4));
        kaddr[v] = sKV + static_cast<uint32_t>((TW * s_cg + 8 * hi16 + r7) * ROW_BYTES +
                                               (((4 * v + 2 * s_dh) ^ (hi8 ^ r7)) << 4));
    }
    const PvLanes pv = pv_lanes(sP, sKV, warp, lane);
    // P stores of the S role: row rowA (rowB = rowA + 8 has the same swizzle), column TW*s_cg + 8*nt + 2*cq
    // -> chunk (TW/8)*s_cg + nt
    const uint32_t pst = sP + static_cast<uint32_t>(rowA * P_ROW_BYTES + 4 * cq);
    const int pz = pswz(rowA);

    float o[O_NT][4];  // see O_NT for the (row, column) of each register
#pragma unroll
    for (int j = 0; j < O_NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
    float mA = NEG_INF, mB = NEG_INF;  // running max (scaled, log2 units) of rows rowA / rowB
    float lA = 0.f, lB = 0.f;          // partial row sums over this warp's columns

    for (int k = kb; k < ke; ++k) {
        const int buf = (k - kb) & 1;
        cp_async_wait<0>();
        __syncthreads();  // B0: tile k visible to all; all warps are past tile k-1
        if (k + 1 < ke) {
            load_kv_tile(sKV + static_cast<uint32_t>((buf ^ 1) * KV_TILE_BYTES), k + 1, page_next, n_pref, plen,
                         N, g, kv_cache, kv_tree);
            cp_async_commit();
            page_next = k + 2 < n_pref ? __ldg(bt_row + ((k + 2) * KV_T) / PAGE) : 0;
        }
        const uint32_t kvoff = static_cast<uint32_t>(buf * KV_TILE_BYTES);

        // tree tile: this warp's mask word for its two rows (issued before the S loop to hide latency)
        const bool tree = k >= n_pref;
        const int j0 = (k - n_pref) * KV_T + TW * s_cg;  // first tree slot of this warp's keys
        uint32_t wA = 0u, wB = 0u;
        if (tree && j0 < N) {
            const uint32_t* mrow = mask + static_cast<size_t>(g) * N * W + (j0 >> 5);
            if (actA) wA = __ldg(mrow + (grA / H) * W) >> (j0 & 31);
            if (actB) wB = __ldg(mrow + (grB / H) * W) >> (j0 & 31);
        }

        // ---- S = Q K^T (fp32), split-D: this warp computes rows 32rg..+32 x keys 32cg..+32 over the k16 steps
        // 2j + dh, then exchanges with warp w ^ 4 (same rows and keys, the other half of the dims) through 2 KB of
        // the P buffer (free: every warp is past P V of the previous tile); xch = this lane's slot there. Slot
        // (nt, lane) holds one lane's 4 accumulators of an n-tile: the partner lane holds the same (row, key)
        // elements, so slots are lane-private (no bank conflicts, read-then-overwrite in place needs no barrier).
        // Afterwards s holds rows 32rg + 16dh..+16 x keys 32cg..+32.
        float s[NT][4];
        {
            float4* xch = reinterpret_cast<float4*>(smem + OFF_P + (warp & 3) * 2048) + lane;
            const int pair_bar = 1 + (warp & 3);
            float acc[2][NT][4];  // 32 rows (m-tiles 0,1) x 32 keys, partial over this warp's k16 steps
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
#pragma unroll
            for (int j = 0; j < DQK / 32; ++j) {
                uint32_t a[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
                    ldsm_x4(qaddr[j & 1] + (j >> 1) * 128 + mt * 16 * ROW_BYTES, a[mt][0], a[mt][1], a[mt][2],
                            a[mt][3]);
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4(kaddr[j & 1] + kvoff + (j >> 1) * 128 + np * 16 * ROW_BYTES, b0, b1, b2, b3);
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) {
                        mma_bf16(acc[mt][2 * np], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
                        mma_bf16(acc[mt][2 * np + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
                    }
                }
            }
            // dh = 1 hands over its m-tile 0, dh = 0 adds it and hands over its m-tile 1, dh = 1 adds that
            if (s_dh == 1) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) xch[32 * nt] = as_float4(acc[0][nt]);
            }
            named_barrier(pair_bar, 64);
            if (s_dh == 0) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    add_float4(acc[0][nt], xch[32 * nt]);
                    xch[32 * nt] = as_float4(acc[1][nt]);
                }
            }
            named_barrier(pair_bar, 64);
            if (s_dh == 1) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) add_float4(acc[1][nt], xch[32 * nt]);
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = s_dh ? acc[1][nt][e] : acc[0][nt][e];
        }

        // ---- scale, mask, row max: valid columns c (0..TW-1 of this warp): prefix c < lim; tree c < lim and
        // mask bit c
        float mxA, mxB;
        scale_mask_rowmax<NT, false>(s, cq, tree ? N - j0 : plen - k * KV_T - TW * s_cg, tree, wA, wB,
                                     scale_log2e, mxA, mxB);
        if (cq == 0) {
            redmax[rowA * S_WN + s_cg] = mxA;
            redmax[rowB * S_WN + s_cg] = mxB;
        }
        __syncthreads();  // B1: row maxima; also every exchange is read before P overwrites the buffer
#pragma unroll
        for (int cg = 0; cg < S_WN; ++cg) {
            mxA = fmaxf(mxA, redmax[rowA * S_WN + cg]);
            mxB = fmaxf(mxB, redmax[rowB * S_WN + cg]);
        }
        float muA, muB;
        const float alA = move_max<0>(mA, mxA, muA), alB = move_max<0>(mB, mxB, muB);

        // ---- P = exp2(s - m) -> bf16 smem; partial row sums in fp32
        float sumA, sumB;
        write_p<NT, P_ROW_BYTES>(s, muA, muB, pst, (TW / 8) * s_cg, pz, sumA, sumB);
        lA = lA * alA + sumA;
        lB = lB * alB + sumB;
        if (s_cg == 0 && cq == 0) {
            alpha_s[rowA] = alA;
            alpha_s[rowB] = alB;
        }
        __syncthreads();  // B2: P and alpha of tile k visible to every warp

        pv_step(o, alpha_s, pv, kvoff, 0u, gq);
    }

    share_row_sums(smem, lA, lB, rowA, s_cg, cq);
    __syncthreads();
    finish_rows(p, w, smem, mA, mB, rowA, s_cg, actA, actB, cq);
    __syncthreads();
    store_o(p, w, smem, o, warp, lane);
}

}  // namespace va
