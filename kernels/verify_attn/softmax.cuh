// kernels/verify_attn/softmax.cuh -- the online softmax that both mainloops of kdt_verify_attn_fwd share, on score
// fragments in the mma / wgmma D layout (lane = 4 gq + cq; a quad holds rows rowA = gq and rowB = gq + 8): scale,
// mask and row max, the running-max move, P = exp2(s - mu) into smem with its row sums, O *= alpha (wgmma
// fragment), and the end of a row (1 / l, lse). Scores are in log2 units (scaled by softmax_scale * log2 e), so
// every exponential is one ex2. See plans/kernels/verify-attn.md, "Online softmax".
#pragma once

#include <stdint.h>

#include <type_traits>

#include "common/ptx.cuh"
#include "verify_attn/config.cuh"
#include "verify_attn/params.cuh"

namespace va {

using kdt::ex2;
using kdt::pack_bf16;
using kdt::sts32;

// Entry (nt, e) of a score fragment, flat (wgmma: d[4 nt + e]) or per n8 tile (s[nt][e]); e < 2: row rowA,
// else rowB; column 8 nt + 2 cq + (e & 1).
template <int N>
__device__ __forceinline__ float& frag_at(float (&f)[N], int nt, int e) { return f[4 * nt + e]; }
template <int N>
__device__ __forceinline__ float& frag_at(float (&f)[N][4], int nt, int e) { return f[nt][e]; }

// Scale, mask, row max of NTILES n8 tiles of scores of rows rowA / rowB (this thread: columns 8 nt + 2 cq + {0, 1}):
// s *= scale_log2e, or -inf at columns >= lim and, on a tree tile, where bit c of the row's mask word wA / wB
// is clear; mxA / mxB get the quad's row maxima (a quad holds the fragment's whole row). Two forms, each where
// it measured faster (plans/kernels/verify-attn.md, "Online softmax"):
// - MASK_WORD (sm_90a, whose warpgroup 0 runs the softmax alone between S and P V: its instructions are the
//   tile's critical path): a whole prefix tile takes a branch of its own with no tests; any other tile turns the
//   row's admissible columns into one word, shifted once by 2 cq, so each column's test is a constant bit. The
//   per-column test below had compiled to a branch per column pair there, ~500 of a tile's ~3,800 cycles.
// - otherwise (the mma.sync paths, whose softmax shares a basic block with the mma and hides under it): a test
//   per column; the word form measured 1.02-1.07 slower there.
template <int NTILES, bool MASK_WORD, typename Frag, typename Word>
__device__ __forceinline__ void scale_mask_rowmax(Frag& f, int cq, int lim, bool tree, Word wA, Word wB,
                                                  float scale_log2e, float& mxA, float& mxB) {
    if constexpr (MASK_WORD) {
        constexpr int COLS = 8 * NTILES;
        using Bits = typename std::conditional<(COLS > 32), uint64_t, uint32_t>::type;
        const Bits all = ~Bits(0);
        const Bits in_range = lim >= COLS ? all : lim > 0 ? (Bits(1) << lim) - 1u : Bits(0);
        const Bits keepA = ((tree ? static_cast<Bits>(wA) : all) & in_range) >> (2 * cq);
        const Bits keepB = ((tree ? static_cast<Bits>(wB) : all) & in_range) >> (2 * cq);
        mxA = NEG_INF;
        mxB = NEG_INF;
        if (!tree && lim >= COLS) {
#pragma unroll
            for (int nt = 0; nt < NTILES; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& a = frag_at(f, nt, e);
                    float& b = frag_at(f, nt, 2 + e);
                    a *= scale_log2e;
                    b *= scale_log2e;
                    mxA = fmaxf(mxA, a);
                    mxB = fmaxf(mxB, b);
                }
            }
        } else {
#pragma unroll
            for (int nt = 0; nt < NTILES; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int bit = 8 * nt + e;  // column 8 nt + 2 cq + e
                    float& a = frag_at(f, nt, e);
                    float& b = frag_at(f, nt, 2 + e);
                    a = (keepA >> bit) & 1u ? a * scale_log2e : NEG_INF;
                    b = (keepB >> bit) & 1u ? b * scale_log2e : NEG_INF;
                    mxA = fmaxf(mxA, a);
                    mxB = fmaxf(mxB, b);
                }
            }
        }
    } else {
        mxA = NEG_INF;
        mxB = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < NTILES; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = 8 * nt + 2 * cq + e;
                bool okA = c < lim, okB = c < lim;
                if (tree) {
                    okA = okA && ((wA >> c) & 1u);
                    okB = okB && ((wB >> c) & 1u);
                }
                float& a = frag_at(f, nt, e);
                float& b = frag_at(f, nt, 2 + e);
                a = okA ? a * scale_log2e : NEG_INF;
                b = okB ? b * scale_log2e : NEG_INF;
                mxA = fmaxf(mxA, a);
                mxB = fmaxf(mxB, b);
            }
        }
    }
    mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 1));
    mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 2));
    mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 1));
    mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 2));
}

// Online softmax, one row: the running max m (log2 units) moves to the tile's row max mx where mx exceeds it by
// more than SLACK; returns alpha = exp2(old m - new m), the factor for the row's earlier sums (1 where m stays:
// the rescale of O is skipped then), and sets mu, the base of the tile's exp2(s - mu) (0 while the row has no
// admissible key: p = 0, alpha = 0). A max kept up to SLACK below the true one leaves p <= 2^SLACK, within bf16's
// range, and l, O and lse = m + log2 l hold for any m. SLACK 8 on sm_90a, whose softmax (and warpgroup 1's
// rescale before its P V) is on the tile's critical path; 0 (m = max(m, mx)) on the mma.sync paths, where the
// slack measured no gain (plans/kernels/verify-attn.md, "Online softmax").
template <int SLACK>
__device__ __forceinline__ float move_max(float& m, float mx, float& mu) {
    float mn;
    if constexpr (SLACK == 0)
        mn = fmaxf(m, mx);
    else
        mn = mx > m + static_cast<float>(SLACK) ? mx : m;
    mu = mn == NEG_INF ? 0.f : mn;
    const float alpha = ex2(m - mu);
    m = mn;
    return alpha;
}

// P = exp2(s - mu) of NTILES n8 tiles -> bf16 in a P tile whose rows are PROW bytes apart and whose 16-byte
// chunk c of row r sits at c ^ pz (pz: the swizzle of rowA; rowB = rowA + 8 has the same): `pst` addresses this
// thread's word of row rowA in chunk 0, the tiles are chunks c0 + nt. sumA / sumB = this thread's part of the
// tile's row sums (the caller folds them into l = l * alpha + sum, as the kernel always did).
template <int NTILES, int PROW, typename Frag>
__device__ __forceinline__ void write_p(Frag& s, float muA, float muB, uint32_t pst, int c0, int pz, float& sumA,
                                        float& sumB) {
    float sA = 0.f, sB = 0.f;
#pragma unroll
    for (int nt = 0; nt < NTILES; ++nt) {
        const float p0 = ex2(frag_at(s, nt, 0) - muA), p1 = ex2(frag_at(s, nt, 1) - muA);
        const float p2 = ex2(frag_at(s, nt, 2) - muB), p3 = ex2(frag_at(s, nt, 3) - muB);
        sA += p0 + p1;
        sB += p2 + p3;
        const uint32_t pa = pst + static_cast<uint32_t>(((c0 + nt) ^ pz) << 4);
        sts32(pa, pack_bf16(p0, p1));
        sts32(pa + 8 * PROW, pack_bf16(p2, p3));
    }
    sumA = sA;
    sumB = sB;
}

// sm_90a: O *= alpha per row (rowA: o[j][0..1], rowB: o[j][2..3] of the m64n256 fragment) after a running-max
// move; the max rarely moves after the first tiles, so the 128 multiplies are skipped when alpha == 1 for the
// whole warp. (The mma.sync path reads alpha from smem per m-tile instead: its warps hold all 64 rows.)
__device__ __forceinline__ void rescale_rows(float (&o)[O_NT][4], float alA, float alB) {
    if (__any_sync(0xffffffffu, (alA != 1.f) | (alB != 1.f))) {
#pragma unroll
        for (int j = 0; j < O_NT; ++j) {
            o[j][0] *= alA;
            o[j][1] *= alA;
            o[j][2] *= alB;
            o[j][3] *= alB;
        }
    }
}

// Sum over the quad (lanes 4 gq .. 4 gq + 3) that holds a fragment row: the row's sum over this warp's columns.
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

// The end of CTA row `row`'s softmax: invl_s[row] = 1 / L (0 for a row past n_nodes, act == false, or with no
// admissible key, whose output is then +0) and its natural-log lse (m in log2 units; -inf for such a row) to
// part_lse (split_mode: this CTA's split) or lse, for rows r0 + row < R; with lse_s, to lse_s[row] instead (the
// sm_90a pair merge, which writes the pair's merged lse).
__device__ __forceinline__ void finish_row(const FwdParams& p, const CtaWork& w, bool split_mode, float* invl_s,
                                           int row, bool act, float m, float L, float* lse_s = nullptr) {
    const int gr = w.r0 + row;
    const bool ok = act && L > 0.f;
    invl_s[row] = ok ? 1.f / L : 0.f;
    const float lse_v = ok ? (m + log2f(L)) * LN2 : NEG_INF;
    if (lse_s != nullptr) {
        lse_s[row] = lse_v;
    } else if (gr < w.R && w.value_half == 0) {  // with value_split, both CTAs of the tile hold the same lse
        if (split_mode)
            p.part_lse[(static_cast<size_t>(w.split) * p.G + w.g) * w.Rpad + gr] = lse_v;
        else
            p.lse[static_cast<size_t>(w.g) * w.R + gr] = lse_v;
    }
}

}  // namespace va
