// kernels/verify_attn/params.cuh -- what a kdt_verify_attn_fwd CTA is given and what it owns: the kernel's
// arguments in one struct (FwdParams), and the CTA's query rows and its split's key-tile range (CtaWork,
// cta_work). Used by both mainloops (mainloop_wgmma.cuh, mainloop_mma.cuh) and the loaders (tiles.cuh).
#pragma once

#include <stdint.h>

#include "common/ptx.cuh"
#include "verify_attn/config.cuh"

namespace va {

// The arguments of kdt_verify_attn_fwd (see the entry's header and plans/contracts.md, `verify-attn`).
struct FwdParams {
    const uint16_t* q;                   // bf16 [G, N, H, DQK]
    const uint16_t* kv_cache;            // bf16 [pages, PAGE, DQK]
    const kdt::TensorMap* kv_map;        // kv_cache as 2D [pages * PAGE, DQK], 64 x 64 boxes, 128-byte swizzle
    int kv_tma;                          // 1: whole prefix tiles by tensor copy through kv_map (sm_90a), else 0
    const int* block_table;              // int32 [G, max_pages]
    const int* prefix_len;               // int32 [G]
    const uint16_t* kv_tree;             // bf16 [G, N, DQK]
    const uint32_t* mask;                // uint32 [G, N, W]
    const int* n_nodes;                  // int32 [G]
    int G, N, H, max_pages, W;
    float scale_log2e;                   // softmax_scale * log2(e)
    int num_splits;
    int value_split;                     // CTAs sharing a query tile by value columns (1, or 2 on sm_90a)
    int out_bf16;
    void* out;                           // float32 or bf16 bits [G, N, H, DV]
    float* lse;                          // float32 [G, N, H]
    float* part_o;                       // num_splits > 1: float32 [S, G, Rpad, DV]
    float* part_lse;                     // num_splits > 1: float32 [S, G, Rpad]
};

// The CTA's share: query rows r0..r0+63 of request g (row r = slot * H + head, the memory order of q / out /
// lse; rows r >= active are past n_nodes), key tiles [kb, ke) of the request (prefix tiles first, then the
// tree's), the key-tile range of split `split`: per = ceil(tiles / num_splits) tiles from the request's own
// prefix_len; and value columns [value_half * DV / value_split, +DV / value_split) of out (grid x = query tiles x
// value_split; value_split is 1 but on sm_90a).
struct CtaWork {
    int g, split;
    int value_split, value_half;         // value_half: which of the value_split column ranges this CTA writes
    int R;                               // query rows of the request (N * H)
    int r0;                              // first row of this CTA
    int Rpad;                            // rows per request in the split workspace (query tiles * ROWS)
    int active;                          // rows r < active are computed (slots 0..n_nodes)
    int plen;                            // prefix tokens of the request
    int n_pref;                          // prefix key tiles
    int kb, ke;                          // this split's key tiles
};

// The sm_90a pair merge (kdt_verify_attn_fwd_paired, clusters of two along z): splits 2c and 2c + 1 write one
// merged partial, slot c. The CTA's work is its own split's; `split` becomes the slot its results go to.
__device__ __forceinline__ CtaWork paired_work(CtaWork w) {
    w.split >>= 1;
    return w;
}

__device__ __forceinline__ CtaWork cta_work(const FwdParams& p) {
    CtaWork w;
    w.g = blockIdx.y;
    w.split = blockIdx.z;
    w.R = p.N * p.H;
    w.value_split = VALUE_SPLIT_MAX > 1 ? p.value_split : 1;
    w.value_half = static_cast<int>(blockIdx.x) % w.value_split;
    w.r0 = static_cast<int>(blockIdx.x) / w.value_split * ROWS;
    w.Rpad = static_cast<int>(gridDim.x) / w.value_split * ROWS;
    const int live = max(p.n_nodes[w.g] + 1, 0);
    w.active = min(live, p.N) * p.H;
    w.plen = p.prefix_len[w.g];
    w.n_pref = (w.plen + KV_T - 1) / KV_T;
    const int n_tiles = w.n_pref + (p.N + KV_T - 1) / KV_T;  // + tree key tiles
    const int per = (n_tiles + p.num_splits - 1) / p.num_splits;
    w.kb = w.split * per;
    w.ke = min(n_tiles, w.kb + per);
    return w;
}

// The exit of a CTA without work: all its rows are past n_nodes, or its split holds no key tile of the request.
// With one split it writes its rows' out = 0 and lse = -inf; with several it marks its partial lse -inf (no
// contribution: the combine skips it); inactive tiles with several splits are written by the combine. A macro,
// expanded at the top of each mainloop (attend_wgmma, attend_mma): as a helper function, or hoisted into the
// kernel, it compiled to other branches (plans/kernels/verify-attn.md, "SASS identity").
#define VA_RETURN_IF_NO_WORK(p, w, tid)                                                                      \
    if ((w).r0 >= (w).active || (w).kb >= (w).ke) {                                                          \
        if ((p).num_splits == 1) {                                                                           \
            const int nrows = min(ROWS, (w).R - (w).r0);                                                     \
            const int vcols = DV / (w).value_split;               /* this CTA's value columns */             \
            const size_t base = (static_cast<size_t>((w).g) * (w).R + (w).r0) * DV + (w).value_half * vcols; \
            if ((p).out_bf16) {                                                                              \
                uint16_t* o = static_cast<uint16_t*>((p).out) + base;                                        \
                for (int i = (tid); i < nrows * (vcols / 8); i += THREADS)                                   \
                    *reinterpret_cast<uint4*>(o + (i / (vcols / 8)) * DV + 8 * (i % (vcols / 8))) =          \
                        make_uint4(0u, 0u, 0u, 0u);                                                          \
            } else {                                                                                         \
                float* o = static_cast<float*>((p).out) + base;                                              \
                for (int i = (tid); i < nrows * (vcols / 4); i += THREADS)                                   \
                    *reinterpret_cast<float4*>(o + (i / (vcols / 4)) * DV + 4 * (i % (vcols / 4))) =         \
                        make_float4(0.f, 0.f, 0.f, 0.f);                                                     \
            }                                                                                                \
            if ((tid) < nrows && (w).value_half == 0)                                                        \
                (p).lse[static_cast<size_t>((w).g) * (w).R + (w).r0 + (tid)] = NEG_INF;                      \
        } else if ((w).r0 < (w).active && (w).value_half == 0) {                                             \
            if ((tid) < ROWS && (w).r0 + (tid) < (w).R)                                                      \
                (p).part_lse[(static_cast<size_t>((w).split) * (p).G + (w).g) * (w).Rpad + (w).r0 + (tid)] = NEG_INF; \
        }                                                                                                    \
        return;                                                                                              \
    }

}  // namespace va
