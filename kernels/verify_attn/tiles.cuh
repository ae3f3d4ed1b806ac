// kernels/verify_attn/tiles.cuh -- getting Q and key tiles into shared memory: cp.async loaders that write the
// swizzled layouts of config.cuh (TROW / BLK), and the source row of a key (prefix page through the block table,
// or tree slot; zero-filled past the end). Used by both mainloops of kdt_verify_attn_fwd; load_kv_tile_wg1 and
// copy_page_tile (a whole page by tensor copy) are the sm_90a producer warpgroup's. The layouts:
// plans/kernels/verify-attn.md, "Tiles and swizzles".
#pragma once

#include <stdint.h>

#include "common/mbarrier.cuh"
#include "common/ptx.cuh"
#include "verify_attn/config.cuh"
#include "verify_attn/params.cuh"

namespace va {

using kdt::cp_async16_zfill;
using kdt::thread_x;

// Load TROWS rows of 576 bf16 into a swizzled smem tile, by threads 0..LOADERS-1. Thread tid copies row tid / TPR,
// chunks tid % TPR + TPR*i. `src_row` is that row in global memory; valid == false zero-fills it (src-size 0: the
// address is not read). Every copy is one cp.async with immediate offsets from two or three base registers:
//   TPR % 8 == 0: chunk lc + TPR*i lives at (lc ^ r7) + TPR*i;
//   TPR == 4:     chunk lc + 4*(2m + b) lives at 8m + ((4b + lc) ^ r7).
template <int TROWS, int LOADERS = THREADS>
__device__ __forceinline__ void load_rows(uint32_t s_tile, const uint16_t* src_row, bool valid) {
    const int tid = static_cast<int>(thread_x());  // re-read per call: cheaper than holding the offsets live
    constexpr int TPR = LOADERS / TROWS;
    constexpr int CPT = (ROW_CHUNKS + TPR - 1) / TPR;
    static_assert(TPR % 8 == 0 || TPR == 4, "loader swizzle cases");
    const int row = tid / TPR;
    const int lc = tid % TPR;
    const int r7 = row & 7;
    const uint32_t dst_row = s_tile + static_cast<uint32_t>(row * TROW);
    const char* src = reinterpret_cast<const char*>(src_row) + lc * 16;
    const uint32_t nbytes = valid ? 16u : 0u;
    if constexpr (TPR % 8 == 0) {
        static_assert(TPR % 8 != 0 || !WGMMA, "TPR % 8 == 0 loader: mma.sync layout only");
        const uint32_t dst = dst_row + static_cast<uint32_t>((lc ^ r7) << 4);
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
            if (ROW_CHUNKS % TPR == 0 || lc + TPR * i < ROW_CHUNKS)
                cp_async16_zfill(dst + TPR * 16 * i, src + TPR * 16 * i, nbytes);
        }
    } else {
        const uint32_t dst0 = dst_row + static_cast<uint32_t>((lc ^ r7) << 4);
        const uint32_t dst1 = dst_row + static_cast<uint32_t>(((lc + 4) ^ r7) << 4);
#pragma unroll
        for (int i = 0; i < CPT; ++i)
            cp_async16_zfill(((i & 1) ? dst1 : dst0) + BLK * (i >> 1), src + 64 * i, nbytes);
    }
}

// The CTA's 64 query rows (rows past `active` zero-filled), loaded by the whole CTA.
__device__ __forceinline__ void load_q_tile(uint32_t sQ, const FwdParams& p, const CtaWork& w, int tid) {
    constexpr int TPR = THREADS / ROWS;
    const int row = tid / TPR;
    const bool valid = w.r0 + row < w.active;
    const uint16_t* src = valid ? p.q + (static_cast<size_t>(w.g) * w.R + w.r0 + row) * DQK : p.q;
    load_rows<ROWS>(sQ, src, valid);
}

// Row `row` of key tile k of a request: prefix tiles first (k < n_pref; `page` = block_table entry of the tile,
// read ahead by the caller), then tree tiles. valid = false past the prefix / past N (the row is zero-filled,
// never NaN; the returned pointer is then any in-bounds row).
__device__ __forceinline__ const uint16_t* kv_row_source(int k, int row, int page, int n_pref, int plen, int N, int g,
                                                         const uint16_t* __restrict__ kv_cache,
                                                         const uint16_t* __restrict__ kv_tree, bool& valid) {
    if (k < n_pref) {
        const int tok0 = k * KV_T;
        valid = tok0 + row < plen;
        return valid ? kv_cache + (static_cast<size_t>(page) * PAGE + (tok0 % PAGE) + row) * DQK : kv_cache;
    }
    const int j = (k - n_pref) * KV_T + row;
    valid = j < N;
    return valid ? kv_tree + (static_cast<size_t>(g) * N + j) * DQK : kv_cache;
}

// Key tile k of a request, loaded by threads 0..LOADERS-1 (the whole CTA by default).
template <int LOADERS = THREADS>
__device__ __forceinline__ void load_kv_tile(uint32_t s_tile, int k, int page, int n_pref, int plen, int N, int g,
                                             const uint16_t* __restrict__ kv_cache,
                                             const uint16_t* __restrict__ kv_tree) {
    constexpr int TPR = LOADERS / KV_T;
    const int row = static_cast<int>(thread_x()) / TPR;
    bool valid;
    const uint16_t* src = kv_row_source(k, row, page, n_pref, plen, N, g, kv_cache, kv_tree, valid);
    load_rows<KV_T, LOADERS>(s_tile, src, valid);
}

// sm_90a: key tile k loaded by warpgroup 1 alone (128 threads, wgmma 128-byte swizzle layout). Thread t copies
// chunks t % 8 + 8i (i = 0..8, i.e. chunk t % 8 of column block i) of rows t / 8 + 16p (p = 0..3): 8 threads
// cover 128 contiguous bytes of a row, and the four rows share row & 7, so one lane offset serves all 36
// copies (the rest are immediates: p * 16 rows, i * BLK). `policy`: the L2 cache policy of the lines (kdt::l2_policy).
__device__ __forceinline__ void load_kv_tile_wg1(uint32_t s_tile, int k, int page, int n_pref, int plen, int N,
                                                 int g, const uint16_t* __restrict__ kv_cache,
                                                 const uint16_t* __restrict__ kv_tree, uint64_t policy) {
    static_assert(!WGMMA || (KV_T == 64 && ROW_CHUNKS == 8 * (DQK / 64) && WG_THREADS == 128),
                  "WG1 loader: 64 rows x 9 blocks");
    const int t = static_cast<int>(thread_x()) - WG_THREADS;
    const int lc = t & 7;
    const int row0 = t >> 3;  // 0..15
    const uint32_t dst = s_tile + static_cast<uint32_t>(row0 * TROW + ((lc ^ (row0 & 7)) << 4));
#pragma unroll
    for (int p = 0; p < KV_T / 16; ++p) {
        bool valid;
        const uint16_t* src = kv_row_source(k, row0 + 16 * p, page, n_pref, plen, N, g, kv_cache, kv_tree, valid);
        const char* s8 = reinterpret_cast<const char*>(src) + lc * 16;
        const uint32_t nbytes = valid ? 16u : 0u;
#pragma unroll
        for (int i = 0; i < DQK / 64; ++i)
            cp_async16_zfill(dst + 16 * TROW * p + BLK * i, s8 + 128 * i, nbytes, policy);
    }
}

// sm_90a: a prefix key tile whose page is whole, by the tensor-copy engine, from one thread: `landed` armed with the
// tile's bytes, then nine copies of one 64 x 64 box a column block (the map's 128-byte swizzle writes the layout
// above). `map`: kv_cache as bf16 [pages * PAGE, DQK] (the launcher's TensorMap); `policy` as load_kv_tile_wg1's.
__device__ __forceinline__ void copy_page_tile(uint32_t s_tile, const kdt::TensorMap* map, int page, uint32_t landed,
                                               uint64_t policy) {
    static_assert(!WGMMA || (KV_T == PAGE && DQK % 64 == 0), "sm_90a: a key tile is a page of 64-column blocks");
    kdt::mbar_arrive_expect_tx(landed, KV_TILE_BYTES);
#pragma unroll
    for (int i = 0; i < DQK / 64; ++i)
        kdt::tensor_copy_2d_to_shared(s_tile + static_cast<uint32_t>(BLK * i), map, 64 * i, page * PAGE, landed,
                                      policy);
}

}  // namespace va
