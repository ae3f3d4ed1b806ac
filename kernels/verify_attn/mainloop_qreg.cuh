// kernels/verify_attn/mainloop_qreg.cuh -- kdt_verify_attn_fwd on the 99 KB parts (attend_qreg: sm_120, and the
// sm_120-emu build on the H200): mma.sync m16n8k16, Q in registers, two warp roles. A CTA owns 32 query rows and
// streams 16-key tiles through a ring of four buffers.
//   S warps 0-3 (warp ds): the Q fragments of all 32 rows for the k16 steps 4j + ds, loaded once (staged through
//     key buffers 2, 3) and kept in registers (72 per thread). Per tile: the S partial of the whole 32 x 16 tile
//     over those steps (B by ldmatrix), stored to exchange buffer (k - kb) & 1, and the cp.async of tile k+2
//     into the key buffer that P V of tile k-2 released. Nothing else: S of tile k+1 runs while the other role
//     works on tile k.
//   P V warps 4-7 (warp 4 + v): O of all 32 rows x value columns 128v..+128 (128 registers): O = O * alpha +
//     P V of tile k (pv_mma.cuh). Warps 4, 5 also run the online softmax of m-tile 0, 1 one tile ahead: after
//     tile k's P V mma they sum the four partials of tile k + 1 (rows whole in a quad: no exchange of row maxima)
//     and write its P and alpha into P buffer (k + 1 - kb) & 1, in the same basic block as the mma, so that the
//     softmax's latencies hide under them.
// The roles meet at mbarriers only (S arrives, P V waits on READY; P V arrives, S waits on FREE), each arrival as
// early as the buffers allow. Smem per tile: keys 18 KB once for S, partials 8 KB written + 8 KB read, P V 20 KB.
// Why this shape and the barrier proofs: plans/kernels/verify-attn.md, "Q in registers".
#pragma once

#include <stdint.h>

#include "common/mbarrier.cuh"
#include "common/mma.cuh"
#include "common/ptx.cuh"
#include "verify_attn/config.cuh"
#include "verify_attn/params.cuh"
#include "verify_attn/pv_mma.cuh"
#include "verify_attn/softmax.cuh"
#include "verify_attn/tiles.cuh"

namespace va {

// Named barriers within a role (128 threads): BAR_S (a landed key tile), BAR_PV (P of a tile written; the softmax
// warps reach it from other instructions than warps 6, 7: the non-aligned barrier). The whole CTA meets only at
// __syncthreads outside the role branches (prologue, epilogue).
constexpr int BAR_S = 1;
constexpr int BAR_PV = 2;
// Between the roles, mbarriers (OFF_BAR + 8 i, ROLE_THREADS arrivals a phase): MB_READY + b (S arrives: the
// partials of a tile are in exchange buffer b), MB_FREE + b (P V arrives: it is done with that tile's key buffer
// and exchange buffer b). The u-th tile of buffer b (tile kb + b + 2u) is phase u of both, parity u & 1; neither
// runs two phases ahead of its waiter (S arrives READY for tile k + 2 only after FREE of tile k, which P V
// arrives after its READY wait of tile k, and symmetrically), as mbar_wait requires. mbarriers, not bar.arrive:
// compute-sanitizer's racecheck models their release / acquire (plans/kernels/verify-attn.md, "Handoffs").
constexpr int MB_READY = 0;
constexpr int MB_FREE = 2;
constexpr int ROLE_THREADS = 128;
constexpr int XCH_BUF = S_WARPS * 4 * 32;     // float4 slots per exchange buffer

__device__ __forceinline__ void attend_qreg(const FwdParams& p, unsigned char* smem, const int& tid_in) {
    static_assert(!QREG || (STAGES == 4 && MT == 2 && NT == 2 && KSTEPS_PV == 1 && P_BUFS == 2 && S_WN == 1 &&
                            S_WARPS * 32 == ROLE_THREADS && PV_WARPS * 32 == ROLE_THREADS),
                  "mainloop_qreg: 32 rows, a ring of four 16-key buffers, one softmax warp per m-tile");
    const CtaWork w = cta_work(p);
    VA_RETURN_IF_NO_WORK(p, w, tid_in)
    const int warp = tid_in >> 5, lane = tid_in & 31;
    const int kb = w.kb, ke = w.ke, N = p.N;
    const uint32_t sKV = kdt::smem_addr(smem) + OFF_KV;
    const uint32_t sQ = sKV + 2 * KV_TILE_BYTES;  // Q is staged in key buffers 2, 3 until it is in registers
    float4* xch = reinterpret_cast<float4*>(smem + OFF_XCH) + lane;  // slot (b, warp, tile t): [XCH_BUF b + 4 warp + t]
    const int* bt_row = p.block_table + static_cast<size_t>(w.g) * p.max_pages;
    const auto page_of = [&](int k) { return k < w.n_pref ? __ldg(bt_row + (k * KV_T) / PAGE) : 0; };
    const auto kv_buffer = [&](int k) { return static_cast<uint32_t>(((k - kb) % STAGES) * KV_TILE_BYTES); };
    // key tile k into its ring buffer, by the S warps
    const auto load_tile = [&](int k) {
        load_kv_tile<ROLE_THREADS>(sKV + kv_buffer(k), k, page_of(k), w.n_pref, w.plen, N, w.g, p.kv_cache, p.kv_tree);
    };
    const uint32_t sBar = kdt::smem_addr(smem) + OFF_BAR;
    const auto ready = [&](int b) { return sBar + 8 * (MB_READY + b); };
    const auto freed = [&](int b) { return sBar + 8 * (MB_FREE + b); };
    if (tid_in == 0)  // published by the prologue's __syncthreads
        for (int i = 0; i < QREG_MBARS; ++i) kdt::mbar_init(sBar + 8 * i, ROLE_THREADS);

    // ---- prologue: Q and tile kb by every thread; tile kb + 1 into key buffer 1 (free: Q is staged in 2, 3) by
    // the S warps, its own group, left in flight while Q goes into registers
    load_q_tile(sQ, p, w, tid_in);
    load_kv_tile(sKV, kb, page_of(kb), w.n_pref, w.plen, N, w.g, p.kv_cache, p.kv_tree);
    kdt::cp_async_commit();
    if (warp < S_WARPS) {
        if (kb + 1 < ke) load_tile(kb + 1);
        kdt::cp_async_commit();
        kdt::cp_async_wait<1>();
    } else {
        kdt::cp_async_wait<0>();
    }
    __syncthreads();

    // P V warp v = warp - S_WARPS: value columns DV_W*v..+DV_W; v < MT: also the softmax of m-tile v (rows rowA,
    // rowA + 8), whose state lives here for the epilogue
    const int v = warp - S_WARPS;
    const int gq = lane >> 2;         // mma group id: fragment rows gq, gq+8
    const int cq = lane & 3;          // thread in group: fragment columns 2cq, 2cq+1
    const bool softmax_warp = warp >= S_WARPS && v < MT;
    const int rowA = 16 * v + gq;
    const int grA = w.r0 + rowA, grB = grA + 8;
    const bool actA = softmax_warp && grA < w.active, actB = softmax_warp && grB < w.active;
    float o[O_NT][4];                  // P V warps: see O_NT for the (row, column) of each register
    float mA = NEG_INF, mB = NEG_INF;  // softmax warps: running max (scaled, log2 units) of rows rowA / rowA + 8
    float lA = 0.f, lB = 0.f;          // softmax warps: row sums (this thread's columns)

    if (warp < S_WARPS) {
        const int ds = warp;              // k16 steps 4j + ds
        const int r7 = lane & 7;          // row & 7 of the ldmatrix row this lane addresses
        const int hi16 = lane >> 4;       // lanes 16..31 address matrices 2,3
        const int hi8 = (lane >> 3) & 1;  // lanes 8..15 / 24..31 address matrices 1,3


        // A (Q, 16 rows x k16): lane addresses row (lane & 15), chunk 2*ks + hi16; B (K, keys as n; non-transposed,
        // two n-tiles): key 8*hi16 + r7, chunk 2*ks + hi8 (see mainloop_mma.cuh). With ks = 4j + ds the chunk is
        // 8j + 2ds + hi, swizzled 8j + ((2ds + hi) ^ r7): one per-lane offset, + 128*j bytes as an immediate.
        const uint32_t qaddr = sQ + static_cast<uint32_t>((lane & 15) * ROW_BYTES + (((2 * ds + hi16) ^ r7) << 4));
        const uint32_t kaddr = sKV + static_cast<uint32_t>((8 * hi16 + r7) * ROW_BYTES + (((2 * ds + hi8) ^ r7) << 4));
        uint32_t qf[MT][QREG_KSTEPS][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < QREG_KSTEPS; ++j)
                kdt::ldsm_x4(qaddr + mt * 16 * ROW_BYTES + j * 128, qf[mt][j][0], qf[mt][j][1], qf[mt][j][2],
                             qf[mt][j][3]);
        kdt::named_barrier(BAR_S, ROLE_THREADS);  // every S warp holds its Q: key buffers 2, 3 are free
        for (int k = kb + 2; k < kb + STAGES; ++k) {
            if (k < ke) load_tile(k);
            kdt::cp_async_commit();
        }

        for (int k = kb; k < ke; ++k) {
            const int it = k - kb;
            const int b = it & 1;
            // tile k has landed: one cp.async group per tile from kb + 1 on (tile kb came with the prologue); at the
            // top of iteration it >= 2 only tile k + 1's is younger
            if (it == 1) kdt::cp_async_wait<2>();
            else if (it > 1) kdt::cp_async_wait<1>();
            kdt::named_barrier(BAR_S, ROLE_THREADS);  // tile k visible to every S warp
            const uint32_t kvoff = kv_buffer(k);

            // ---- S = Q K^T over this warp's k16 steps: acc[mt][nt] = rows 16mt.. x keys 8nt..
            float acc[MT][2][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
#pragma unroll
            for (int j = 0; j < QREG_KSTEPS; ++j) {
                uint32_t b0, b1, b2, b3;
                kdt::ldsm_x4(kaddr + kvoff + j * 128, b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    kdt::mma_bf16(acc[mt][0], qf[mt][j][0], qf[mt][j][1], qf[mt][j][2], qf[mt][j][3], b0, b1);
                    kdt::mma_bf16(acc[mt][1], qf[mt][j][0], qf[mt][j][1], qf[mt][j][2], qf[mt][j][3], b2, b3);
                }
            }

            // ---- exchange buffer b and tile k-2's key buffer are free once P V of tile k-2 is done: the partials
            // go out first (the P V warps wait for them), then the key buffer takes tile k+2 (one group per
            // iteration, empty past the end)
            if (it >= 2) kdt::mbar_wait(freed(b), ((it - 2) >> 1) & 1);
#pragma unroll
            for (int t = 0; t < 4; ++t) xch[32 * (XCH_BUF / 32 * b + 4 * ds + t)] = as_float4(acc[t >> 1][t & 1]);
            kdt::mbar_arrive(ready(b));  // release: the partials of tile k -> the P V warps
            if (it >= 2) {
                if (k + 2 < ke) load_tile(k + 2);
                kdt::cp_async_commit();
            }
        }
    } else {
        const int rowB = rowA + 8;
        const uint32_t sP = kdt::smem_addr(smem) + OFF_P;
        float* alpha_s = reinterpret_cast<float*>(smem + OFF_ALPHA);
        // P stores: row rowA (rowB = rowA + 8 has the same swizzle), columns 8*nt + 2*cq -> chunk nt
        const uint32_t pst = sP + static_cast<uint32_t>(rowA * P_ROW_BYTES + 4 * cq);
        const int pz = pswz(rowA);
        const PvLanes pv = pv_lanes(sP, sKV, v, lane);
#pragma unroll
        for (int j = 0; j < O_NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
        // The softmax of tile k (softmax warps): the partials of m-tile v summed, scaled, masked; P and alpha into
        // P buffer (k - kb) & 1. wA, wB: its rows' mask words (tree tiles: 16 keys, one word), loaded before READY's
        // wait.
        const auto mask_words = [&](int k, uint32_t& wA, uint32_t& wB) {
            const int j0 = (k - w.n_pref) * KV_T;  // first tree slot of the tile
            wA = wB = 0u;
            if (k >= w.n_pref && j0 < N) {
                const uint32_t* mrow = p.mask + static_cast<size_t>(w.g) * N * p.W + (j0 >> 5);
                if (actA) wA = __ldg(mrow + (grA / p.H) * p.W) >> (j0 & 31);
                if (actB) wB = __ldg(mrow + (grB / p.H) * p.W) >> (j0 & 31);
            }
        };
        const auto softmax_tile = [&](int k, uint32_t wA, uint32_t wB) {
            const int b = (k - kb) & 1;
            const bool tree = k >= w.n_pref;
            float s[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const float4 first = xch[32 * (XCH_BUF / 32 * b + 2 * v + nt)];
                s[nt][0] = first.x;
                s[nt][1] = first.y;
                s[nt][2] = first.z;
                s[nt][3] = first.w;
#pragma unroll
                for (int src = 1; src < S_WARPS; ++src)
                    add_float4(s[nt], xch[32 * (XCH_BUF / 32 * b + 4 * src + 2 * v + nt)]);
            }
            // scale, mask, row max (valid columns c: prefix c < lim; tree c < lim and mask bit c)
            float mxA, mxB;
            scale_mask_rowmax<NT, false>(s, cq, tree ? N - (k - w.n_pref) * KV_T : w.plen - k * KV_T, tree, wA,
                                         wB, p.scale_log2e, mxA, mxB);
            float muA, muB;
            const float alA = move_max<0>(mA, mxA, muA), alB = move_max<0>(mB, mxB, muB);
            float sumA, sumB;
            write_p<NT, P_ROW_BYTES>(s, muA, muB, pst + b * P_BYTES, 0, pz, sumA, sumB);
            lA = lA * alA + sumA;
            lB = lB * alB + sumB;
            if (cq == 0) {
                alpha_s[b * ROWS + rowA] = alA;
                alpha_s[b * ROWS + rowB] = alB;
            }
        };
        if (softmax_warp) {
            // tile k + 1's softmax runs in iteration k, after tile k's P V mma (pv_step's rescale branch comes
            // before them: one basic block), so that its latencies hide under the mma
            uint32_t wA, wB;
            mask_words(kb, wA, wB);
            kdt::mbar_wait(ready(0), 0);
            softmax_tile(kb, wA, wB);
            int k = kb;
            for (; k + 1 < ke; ++k) {
                const int it = k - kb;
                const int b = it & 1;
                mask_words(k + 1, wA, wB);
                kdt::mbar_wait(ready(b ^ 1), ((it + 1) >> 1) & 1);
                kdt::named_barrier_divergent(BAR_PV, ROLE_THREADS);  // P and alpha of tile k visible to the P V warps
                pv_step(o, alpha_s + b * ROWS, pv, kv_buffer(k), static_cast<uint32_t>(b * P_BYTES), gq);
                // release: this warp is done with tile k's buffers (its partials were read in iteration k - 1)
                kdt::mbar_arrive(freed(b));
                softmax_tile(k + 1, wA, wB);
            }
            const int b = (k - kb) & 1;
            kdt::named_barrier_divergent(BAR_PV, ROLE_THREADS);
            pv_step(o, alpha_s + b * ROWS, pv, kv_buffer(k), static_cast<uint32_t>(b * P_BYTES), gq);
            kdt::mbar_arrive(freed(b));
        } else {
            for (int k = kb; k < ke; ++k) {
                const int it = k - kb;
                const int b = it & 1;
                kdt::mbar_wait(ready(b), (it >> 1) & 1);             // tile k's keys visible
                kdt::named_barrier_divergent(BAR_PV, ROLE_THREADS);  // P and alpha of tile k visible
                pv_step(o, alpha_s + b * ROWS, pv, kv_buffer(k), static_cast<uint32_t>(b * P_BYTES), gq);
                kdt::mbar_arrive(freed(b));  // release: this warp is done with tile k's buffers
            }
        }
    }

    if (softmax_warp) share_row_sums(smem, lA, lB, rowA, 0, cq);
    __syncthreads();
    if (softmax_warp) finish_rows(p, w, smem, mA, mB, rowA, 0, actA, actB, cq);
    __syncthreads();  // 1 / l of every row is in smem
    if (warp >= S_WARPS) store_o(p, w, smem, o, v, lane);
}

}  // namespace va
