// kernels/verify_attn/pv_mma.cuh -- what both mma.sync mainloops share (mainloop_mma.cuh, Q resident;
// mainloop_qreg.cuh, Q in registers): the slots of their S exchange, the P tile's swizzle, O = O * alpha + P V
// with P V warp v owning value columns DV_W*v..+DV_W of all ROWS rows, and the end of the CTA (row sums across the
// S_WN warps of a row, 1 / l and lse; O / l to out or to the split partials). Layouts: plans/kernels/verify-attn.md,
// "mma.sync mainloop".
#pragma once

#include <stdint.h>

#include "common/mma.cuh"
#include "common/ptx.cuh"
#include "verify_attn/config.cuh"
#include "verify_attn/params.cuh"
#include "verify_attn/softmax.cuh"

namespace va {

// One n-tile's 4 accumulators as a float4 (a slot of the S exchange), and a partner's added to them.
__device__ __forceinline__ float4 as_float4(const float (&a)[4]) { return make_float4(a[0], a[1], a[2], a[3]); }
__device__ __forceinline__ void add_float4(float (&a)[4], float4 v) {
    a[0] += v.x;
    a[1] += v.y;
    a[2] += v.z;
    a[3] += v.w;
}

// P tile: ROWS x KV_T bf16, rows of P_CHUNKS chunks; chunk c of row r lives at c ^ pswz(r).
__device__ __forceinline__ int pswz(int row) { return (row / (8 / P_CHUNKS)) & (P_CHUNKS - 1); }

// The P V step's per-lane addresses. A (P, 16 rows x k16 keys): lane addresses row 16*mt + (lane & 15), chunk
// 2*kk + hi16 (swizzled by pswz, which depends on lane & 15 only). B (V, keys as k, value columns as n;
// transposed): matrices (keys 0-7, ntile 0), (keys 8-15, ntile 0), (keys 0-7, ntile 1), (keys 8-15, ntile 1) ->
// lane addresses key 8*hi8 + r7, column block DV_W/64*v + np/4, chunk 2*(np%4) + hi16, swizzled by key & 7 = r7.
// Both use the lane offsets xo[u] = ((2u + hi16) ^ r7) * 16 (P: u = kk, when P rows are 8 chunks).
struct PvLanes {
    uint32_t xo[4];
    uint32_t pbase;  // P row (lane & 15), chunk 0
    uint32_t pxo[KSTEPS_PV];  // P chunk offsets of the k16 steps
    uint32_t vbase;  // key 8*hi8 + r7 of key buffer 0, this warp's first column block
};

__device__ __forceinline__ PvLanes pv_lanes(uint32_t sP, uint32_t sKV, int pv_warp, int lane) {
    static_assert(KSTEPS_PV <= 4, "lane offset table");
    const int r7 = lane & 7, hi16 = lane >> 4, hi8 = (lane >> 3) & 1;
    PvLanes l;
#pragma unroll
    for (int v = 0; v < 4; ++v) l.xo[v] = static_cast<uint32_t>(((2 * v + hi16) ^ r7) << 4);
#pragma unroll
    for (int kk = 0; kk < KSTEPS_PV; ++kk)
        l.pxo[kk] = P_CHUNKS == 8 ? l.xo[kk] : static_cast<uint32_t>(((2 * kk + hi16) ^ pswz(lane & 15)) << 4);
    l.pbase = sP + static_cast<uint32_t>((lane & 15) * P_ROW_BYTES);
    l.vbase = sKV + static_cast<uint32_t>((8 * hi8 + r7) * TROW + pv_warp * (DV_W / 64) * BLK);
    return l;
}

// O = O * alpha + P V of one key tile (key buffer at byte offset kvoff, P buffer at poff): ROWS rows x DV_W
// columns per warp, alpha per row from alpha_s. The running max rarely moves after the first tiles: the multiplies
// are skipped when alpha == 1 for the whole warp.
__device__ __forceinline__ void pv_step(float (&o)[O_NT][4], const float* alpha_s, const PvLanes& l, uint32_t kvoff,
                                        uint32_t poff, int gq) {
    float aA[MT], aB[MT];
    bool rescale = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        aA[mt] = alpha_s[16 * mt + gq];
        aB[mt] = alpha_s[16 * mt + gq + 8];
        rescale |= (aA[mt] != 1.f) | (aB[mt] != 1.f);
    }
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int nt = 0; nt < 2 * PV_NP; ++nt) {
                o[2 * PV_NP * mt + nt][0] *= aA[mt];
                o[2 * PV_NP * mt + nt][1] *= aA[mt];
                o[2 * PV_NP * mt + nt][2] *= aB[mt];
                o[2 * PV_NP * mt + nt][3] *= aB[mt];
            }
        }
    }
#pragma unroll
    for (int kk = 0; kk < KSTEPS_PV; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            kdt::ldsm_x4(l.pbase + poff + mt * 16 * P_ROW_BYTES + l.pxo[kk], a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
#pragma unroll
        for (int np = 0; np < PV_NP; ++np) {
            uint32_t b0, b1, b2, b3;
            kdt::ldsm_x4_t(l.vbase + (np / 4) * BLK + l.xo[np % 4] + kvoff + kk * 16 * TROW, b0, b1, b2, b3);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                kdt::mma_bf16(o[2 * PV_NP * mt + 2 * np], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
                kdt::mma_bf16(o[2 * PV_NP * mt + 2 * np + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
            }
        }
    }
}

// The end of a row's softmax, by the threads that hold it: lA / lB are this thread's partial sums of rows rowA /
// rowA + 8 over the columns of key group s_cg (one of S_WN per row). The caller then meets every thread at
// finish_rows_sync before store_o reads invl_s: writers = the threads that call this.
__device__ __forceinline__ void share_row_sums(unsigned char* smem, float lA, float lB, int rowA, int s_cg, int cq) {
    float* redl = reinterpret_cast<float*>(smem + OFF_REDL);
    lA = quad_sum(lA);
    lB = quad_sum(lB);
    if (cq == 0) {
        redl[rowA * S_WN + s_cg] = lA;
        redl[(rowA + 8) * S_WN + s_cg] = lB;
    }
}

// After share_row_sums and a barrier: the full row sums give 1 / l and lse (finish_row), by key group 0's threads.
__device__ __forceinline__ void finish_rows(const FwdParams& p, const CtaWork& w, unsigned char* smem, float mA,
                                            float mB, int rowA, int s_cg, bool actA, bool actB, int cq) {
    const float* redl = reinterpret_cast<const float*>(smem + OFF_REDL);
    float* invl_s = reinterpret_cast<float*>(smem + OFF_INVL);
    if (s_cg == 0 && cq == 0) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = rowA + 8 * half;
            float L = 0.f;
#pragma unroll
            for (int cg = 0; cg < S_WN; ++cg) L += redl[row * S_WN + cg];
            finish_row(p, w, p.num_splits > 1, invl_s, row, half ? actB : actA, half ? mB : mA, L);
        }
    }
}

// After finish_rows and a barrier: P V warp v writes O / l of its value columns: m-tile mt, rows 16mt + gq (+8),
// columns DV_W*v + 8nt + 2cq (+1).
__device__ __forceinline__ void store_o(const FwdParams& p, const CtaWork& w, const unsigned char* smem,
                                        const float (&o)[O_NT][4], int pv_warp, int lane) {
    const int gq = lane >> 2, cq = lane & 3;
    const float* invl_s = reinterpret_cast<const float*>(smem + OFF_INVL);
    const bool split_mode = p.num_splits > 1;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = 16 * mt + gq + 8 * half;
            const int gr = w.r0 + row;
            if (gr >= w.R) continue;
            const float inv = invl_s[row];
            const size_t obase = split_mode ? ((static_cast<size_t>(w.split) * p.G + w.g) * w.Rpad + gr) * DV
                                            : (static_cast<size_t>(w.g) * w.R + gr) * DV;
#pragma unroll
            for (int nt = 0; nt < 2 * PV_NP; ++nt) {
                const int j = 2 * PV_NP * mt + nt;  // O tile (see O_NT)
                const int col = DV_W * pv_warp + 8 * nt + 2 * cq;
                // inv == 0 (row past n_nodes / no key): +0, never -0 (the contract's zero rows)
                const float v0 = inv != 0.f ? o[j][2 * half] * inv : 0.f;
                const float v1 = inv != 0.f ? o[j][2 * half + 1] * inv : 0.f;
                if (split_mode) {
                    *reinterpret_cast<float2*>(p.part_o + obase + col) = make_float2(v0, v1);
                } else if (p.out_bf16) {
                    *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.out) + obase + col) = kdt::pack_bf16(v0, v1);
                } else {
                    *reinterpret_cast<float2*>(static_cast<float*>(p.out) + obase + col) = make_float2(v0, v1);
                }
            }
        }
    }
}

}  // namespace va
