// verify-attn: MLA (absorbed) tree-verify attention over a paged prefix and the tree's own keys.
//
// Contract (plans/contracts.md, `verify-attn`)
//   q bf16 [G,N,H,Dqk], kv_cache bf16 [pages,64,Dqk], block_table int32 [G,max_pages], prefix_len int32 [G],
//   kv_tree bf16 [G,N,Dqk], mask uint32 [G,N,W] (W = ceil(N/32)), n_nodes int32 [G].
//   For slot i <= n_nodes[g] and head h: scores = softmax_scale * q[g,i,h] . key over prefix tokens
//   t < prefix_len[g] (page block_table[g, t/64], row t%64) and over tree slots j with bit j of mask[g,i] set;
//   value = first Dv columns of the key row. out [G,N,H,Dv] (float32 or bf16 bits) = softmax @ V, lse float32
//   [G,N,H] = natural-log logsumexp of the scaled scores. Slots i > n_nodes, and rows with no admissible key:
//   out 0, lse -inf.
//
// Entry points
//   kdt_verify_attn_fwd      a CTA = ROWS query rows (r = slot*H + head) of one request; it streams the request's
//                            keys once, in tiles of KV_T, with an online softmax in fp32. sm_90a: warp-specialised
//                            wgmma pipeline (verify_attn/mainloop_wgmma.cuh); sm_90 / sm_100: mma.sync with Q in
//                            smem (verify_attn/mainloop_mma.cuh); sm_120 (99 KB): mma.sync with Q in registers
//                            (verify_attn/mainloop_qreg.cuh). num_splits > 1 (flash-decoding): split s takes key
//                            tiles [s*per, (s+1)*per) and writes normalised partials to the workspace.
//                            value_split = 2 (sm_90a): two CTAs share a query tile and split, each computing S and
//                            writing value columns [256 h, +256) of it (h = blockIdx.x % 2).
//                            kv_tma = 1 (sm_90a): the prefix tiles whole in their page come by tensor copy through
//                            kv_map (kv_cache as bf16 [pages*64, Dqk], 64 x 64 boxes, 128-byte swizzle); other
//                            builds never read kv_map.
//   kdt_verify_attn_fwd_paired  (sm_90a) the same with splits 2c and 2c + 1 in a cluster of two, merging their
//                            partials over distributed shared memory into one (slot c): half the partial bytes.
//   kdt_verify_attn_combine  merges the split partials through their lse (only when num_splits > 1); drops them
//                            from L2 unwritten after reading where the plan says so (discard_partials).
//
// Launch shape
//   fwd:     grid (ceil(N*H/ROWS) * value_split, G, num_splits) (paired: clusters of (1, 1, 2), value_split 1,
//            num_splits even), block 256, 1 CTA per SM, dynamic smem
//            kdt_verify_attn_smem_bytes:
//            ROWS = 64: 230912 B on sm_90 / sm_100 (Q 72 KB + 2 key tiles of 64 tokens + P 8 KB + row stats),
//            230976 B on sm_90a (+ 8 mbarriers); ROWS = 32 on sm_120: 92832 B (a ring of 4 key tiles of 16 tokens +
//            the S exchange 16 KB + P 2 KB + row stats + 4 mbarriers; Q in registers).
//   combine: grid (N*H, G), block 128 x groups (1-4 groups of 4 warps on one row, one group per 8 splits),
//            6 KB of static smem. Where the main kernel leaves half the SMs idle, a programmatic dependent launch
//            (the plan's overlaps_previous): its blocks start there while the main kernel runs, and wait
//            (griddepcontrol.wait) before reading the partials.
//   num_splits comes from shapes only (graph capturable); the workspace carries nothing between launches.
//
// Memory traffic
//   Keys: every query tile of a request reads all its prefix + tree keys once, ceil(N*H/ROWS) * (prefix + N) *
//   1152 B per request (HBM once, L2 for the other query tiles; with one query tile, sm_90a streams them with an L2
//   evict_first policy). Q ROWS * 1152 B per CTA; out N*H*Dv*4 (or 2) B; lse N*H*4 B; split partials num_splits
//   (paired: num_splits / 2) * G * ceil(N*H/ROWS) * ROWS * 513 * 4 B, written once and read once; paired, each CTA
//   also sends 64 KB to its partner over distributed shared memory.
//
// Limits
//   Dqk = 576 and Dv = 512 only (the launcher rejects others). Page size 64. N*H <= 2^31/ROWS rows per request,
//   G <= 65535 (grid y), any prefix the block table holds.
//
// Design, proofs (swizzles, mbarrier parities), SASS figures and timings: plans/kernels/verify-attn.md.

#include <stdint.h>

#include "common/ptx.cuh"
#include "verify_attn/config.cuh"
#include "verify_attn/mainloop_mma.cuh"
#if defined(KDT_SMEM_99KB)
#include "verify_attn/mainloop_qreg.cuh"  // its tiles and roles exist only in the 99 KB configuration
#endif
#include "verify_attn/mainloop_wgmma.cuh"

// Launch constants: kdt build reads them from the cubin, kdt/launch/verify_attn.py plans with them.
extern "C" __constant__ int kdt_verify_attn_threads = va::THREADS;
extern "C" __constant__ int kdt_verify_attn_rows = va::ROWS;
extern "C" __constant__ int kdt_verify_attn_kv_tile = va::KV_T;
extern "C" __constant__ int kdt_verify_attn_smem_bytes = va::SMEM_BYTES;
extern "C" __constant__ int kdt_verify_attn_dqk = va::DQK;
extern "C" __constant__ int kdt_verify_attn_dv = va::DV;
extern "C" __constant__ int kdt_verify_attn_page = va::PAGE;
extern "C" __constant__ int kdt_verify_attn_combine_group_threads = va::COMBINE_GROUP_THREADS;
extern "C" __constant__ int kdt_verify_attn_combine_max_groups = va::COMBINE_MAX_GROUPS;
extern "C" __constant__ int kdt_verify_attn_combine_unroll = va::COMBINE_UNROLL;
// the most CTAs that may share a query tile by value columns (the fwd's value_split): 2 on sm_90a, else 1
extern "C" __constant__ int kdt_verify_attn_value_split_max = va::VALUE_SPLIT_MAX;
// 1 when S = Q K^T and P V run on wgmma (a cubin built for sm_90a), else 0 (mma.sync); informational only: both
// paths have the same entry points and launch shape.
extern "C" __constant__ int kdt_verify_attn_wgmma = va::WGMMA ? 1 : 0;
// 1 where the cubin holds kdt_verify_attn_fwd_paired (sm_90a), else 0
extern "C" __constant__ int kdt_verify_attn_pair_merge = va::WGMMA ? 1 : 0;
// 1 where the fwd takes the prefix tiles whole in their page by tensor copy when its kv_tma is 1 (sm_90a), else 0
// (the fwd then never reads kv_map)
extern "C" __constant__ int kdt_verify_attn_tensor_keys = va::WGMMA ? 1 : 0;

// num_splits == 1: writes out / lse. num_splits > 1: writes part_o [S][G][Rpad][512] (normalised) and
// part_lse [S][G][Rpad] (natural log, -inf = no contribution), Rpad = query tiles * ROWS = gridDim.x / value_split *
// ROWS.
extern "C" __global__ void __launch_bounds__(va::THREADS, 1)
    kdt_verify_attn_fwd(const uint16_t* __restrict__ q, const uint16_t* __restrict__ kv_cache,
                        const __grid_constant__ kdt::TensorMap kv_map, int kv_tma,
                        const int* __restrict__ block_table, const int* __restrict__ prefix_len,
                        const uint16_t* __restrict__ kv_tree, const uint32_t* __restrict__ mask,
                        const int* __restrict__ n_nodes, int G, int N, int H, int max_pages, int W,
                        float scale_log2e, int num_splits, int value_split, int out_bf16, void* __restrict__ out,
                        float* __restrict__ lse, float* __restrict__ part_o, float* __restrict__ part_lse) {
    extern __shared__ __align__(1024) unsigned char smem[];  // 1 KB: wgmma swizzle atoms
    const va::FwdParams p{q, kv_cache, &kv_map, kv_tma, block_table, prefix_len, kv_tree, mask, n_nodes, G, N, H,
                          max_pages, W, scale_log2e, num_splits, value_split, out_bf16, out, lse, part_o,
                          part_lse};
    const int tid = threadIdx.x;  // read here: only the kernel's own read carries its launch bounds
    kdt::after_previous_launch();  // then the combine's blocks may start, on the SMs this launch leaves idle
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    va::attend_wgmma<false>(p, smem, tid);
#elif defined(KDT_SMEM_99KB)
    va::attend_qreg(p, smem, tid);
#else
    va::attend_mma(p, smem, tid);
#endif
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// kdt_verify_attn_fwd with splits 2c and 2c + 1 in a cluster of two that merge their partials into slot c (the
// plan's pair_splits; value_split 1, num_splits even): part_o / part_lse hold num_splits / 2 slots.
extern "C" __global__ void __cluster_dims__(1, 1, 2) __launch_bounds__(va::THREADS, 1)
    kdt_verify_attn_fwd_paired(const uint16_t* __restrict__ q, const uint16_t* __restrict__ kv_cache,
                               const __grid_constant__ kdt::TensorMap kv_map, int kv_tma,
                               const int* __restrict__ block_table, const int* __restrict__ prefix_len,
                               const uint16_t* __restrict__ kv_tree, const uint32_t* __restrict__ mask,
                               const int* __restrict__ n_nodes, int G, int N, int H, int max_pages, int W,
                               float scale_log2e, int num_splits, int value_split, int out_bf16,
                               void* __restrict__ out, float* __restrict__ lse, float* __restrict__ part_o,
                               float* __restrict__ part_lse) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const va::FwdParams p{q, kv_cache, &kv_map, kv_tma, block_table, prefix_len, kv_tree, mask, n_nodes, G, N, H,
                          max_pages, W, scale_log2e, num_splits, value_split, out_bf16, out, lse, part_o,
                          part_lse};
    const int tid = threadIdx.x;
    kdt::after_previous_launch();
    va::attend_wgmma<true>(p, smem, tid);
}
#endif

// Split combine. grid (N*H, G): one query row per block, in blockDim.x / COMBINE_GROUP_THREADS groups of
// COMBINE_WARPS_PER_ROW warps (the plan gives a group to every COMBINE_UNROLL splits); a group's warp owns
// DV / COMBINE_WARPS_PER_ROW value columns (a float4 per lane), and the groups take alternate batches of
// COMBINE_UNROLL splits, so a row has groups * COMBINE_UNROLL partial loads in flight per lane position (the
// partials come from L2: the loads' latency, not their bytes, bounds this kernel). A row's reads after the wait for
// the main kernel take one trip to L2 before the sums: the group's first batch goes out with the split lse, each
// later one as soon as the batch before is summed; n_nodes (an input) is read before the wait. The
// groups' sums meet in shared memory. Every workspace word read here was written by this launch's main kernel
// (partial O only where its lse is finite), so nothing needs zeroing afterwards. Two blocks an SM (64 registers:
// the batch ahead held 85). (The body stays in the kernel: as a helper it compiled differently on sm_90 and on
// sm_120; plans/kernels/verify-attn.md, "SASS identity".)
extern "C" __global__ void __launch_bounds__(va::COMBINE_GROUP_THREADS * va::COMBINE_MAX_GROUPS, 2)
    kdt_verify_attn_combine(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                            const int* __restrict__ n_nodes, int G, int N, int H, int num_splits, int Rpad,
                            int discard_partials, int out_bf16, void* __restrict__ out, float* __restrict__ lse) {
    using namespace va;
    __shared__ float4 group_sum[COMBINE_MAX_GROUPS - 1][COMBINE_GROUP_THREADS];
    const int lane = threadIdx.x & 31;
    const int g = blockIdx.y;
    const int r = blockIdx.x;
    const int groups = blockDim.x / COMBINE_GROUP_THREADS;
    const int group = threadIdx.x / COMBINE_GROUP_THREADS;
    const int in_group = threadIdx.x % COMBINE_GROUP_THREADS;
    const int col = 4 * in_group;
    const int R = N * H;
    if (r >= R) return;                                           // the whole block
    // n_nodes is an input of the step, not written by the main kernel: read before the wait
    const int active = min(max(n_nodes[g] + 1, 0), N) * H;
    const size_t split_stride = static_cast<size_t>(G) * Rpad;    // rows between two splits of one row
    const float* row_lse = part_lse + static_cast<size_t>(g) * Rpad + r;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float lse_out = NEG_INF;
    if (r < active) {
        kdt::wait_for_prior_launches();  // launched while the main kernel may still run (plan: overlaps_previous)
        kdt::launch_dependents();        // then the next launch's blocks (a block that returns above lets them in)
        const float4* src =
            reinterpret_cast<const float4*>(part_o + (static_cast<size_t>(g) * Rpad + r) * DV + col);
        const size_t src_stride = split_stride * (DV / 4);
        // the row's split lse first, lane j holding splits j + 32 c: read once, ahead of the partials, so the
        // weights are ready when those land (splits past 32 * COMBINE_LSE_CHUNKS, from a `splits` knob past one
        // wave, are read where they are used)
        float ls[COMBINE_LSE_CHUNKS];
#pragma unroll
        for (int c = 0; c < COMBINE_LSE_CHUNKS; ++c)
            ls[c] = lane + 32 * c < num_splits ? row_lse[(lane + 32 * c) * split_stride] : NEG_INF;
        constexpr int HELD = 32 * COMBINE_LSE_CHUNKS;
        // a group's batches of COMBINE_UNROLL partial rows, each issued as soon as the batch before is summed; the
        // first right after the split lse, so one trip to L2 after the wait serves both (a split whose lse is -inf
        // is still loaded, in bounds, and dropped by its zero weight)
        float4 v[COMBINE_UNROLL];
        const auto load_batch = [&](int s0, int j0) {
            const int count = min(32, num_splits - s0);
#pragma unroll
            for (int u = 0; u < COMBINE_UNROLL; ++u)     // all loads first: COMBINE_UNROLL in flight
                v[u] = j0 + u < count ? __ldcs(src + (s0 + j0 + u) * src_stride) : make_float4(0.f, 0.f, 0.f, 0.f);
        };
        load_batch(0, group * COMBINE_UNROLL);
        float mx = NEG_INF;
#pragma unroll
        for (int c = 0; c < COMBINE_LSE_CHUNKS; ++c) mx = fmaxf(mx, ls[c]);
        for (int s = HELD + lane; s < num_splits; s += 32) mx = fmaxf(mx, row_lse[s * split_stride]);
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
        if (mx != NEG_INF) {
            float den = 0.f;
#pragma unroll
            for (int c = 0; c < COMBINE_LSE_CHUNKS; ++c) den += expf(ls[c] - mx);  // 0 past num_splits
            for (int s = HELD + lane; s < num_splits; s += 32) den += expf(row_lse[s * split_stride] - mx);
#pragma unroll
            for (int d = 16; d > 0; d >>= 1) den += __shfl_xor_sync(0xffffffffu, den, d);
            const float inv_den = 1.f / den;
            for (int s0 = 0; s0 < num_splits; s0 += 32) {
                // lane j holds the weight of split s0 + j; 0 for an empty split (lse -inf), whose partial O
                // was never written this launch: it is still loaded (in bounds), but the select drops it
                const int s_lane = s0 + lane;
                float ls_lane = NEG_INF;  // -inf past num_splits
                if (s0 < HELD) {
#pragma unroll
                    for (int c = 0; c < COMBINE_LSE_CHUNKS; ++c)
                        if (s0 == 32 * c) ls_lane = ls[c];
                } else if (s_lane < num_splits) {
                    ls_lane = row_lse[s_lane * split_stride];
                }
                const float w_lane = ls_lane != NEG_INF ? expf(ls_lane - mx) * inv_den : 0.f;
                const int count = min(32, num_splits - s0);
                for (int j0 = group * COMBINE_UNROLL; j0 < count; j0 += groups * COMBINE_UNROLL) {
#pragma unroll
                    for (int u = 0; u < COMBINE_UNROLL; ++u) {
                        const float w = __shfl_sync(0xffffffffu, w_lane, (j0 + u) & 31);
                        if (j0 + u < count && w != 0.f) {
                            acc.x = fmaf(w, v[u].x, acc.x);
                            acc.y = fmaf(w, v[u].y, acc.y);
                            acc.z = fmaf(w, v[u].z, acc.z);
                            acc.w = fmaf(w, v[u].w, acc.w);
                        }
                    }
                    // the group's next batch: further in these 32 splits, else the first of the next 32
                    if (j0 + groups * COMBINE_UNROLL < count)
                        load_batch(s0, j0 + groups * COMBINE_UNROLL);
                    else if (s0 + 32 < num_splits)
                        load_batch(s0 + 32, group * COMBINE_UNROLL);
                }
            }
            lse_out = mx + logf(den);
            // read for the last time: dropped from L2 unwritten (the plan's choice where the call streams more
            // keys than L2 holds, so the dirty partials would be evicted to DRAM before the next call writes them)
            if (discard_partials && in_group % (128 / sizeof(float4)) == 0) {
                for (int s0 = 0; s0 < num_splits; s0 += 32) {
                    const int count = min(32, num_splits - s0);
                    for (int j = group * COMBINE_UNROLL; j < count; j += groups * COMBINE_UNROLL)
#pragma unroll
                        for (int u = 0; u < COMBINE_UNROLL; ++u)
                            if (j + u < count) kdt::discard_l2_line(src + (s0 + j + u) * src_stride);
                }
            }
        }
    }
    if (groups > 1) {                                             // the same for the whole block
        if (group > 0) group_sum[group - 1][in_group] = acc;
        __syncthreads();
        if (group > 0) return;
        for (int k = 0; k < groups - 1; ++k) {
            const float4 other = group_sum[k][in_group];
            acc.x += other.x;
            acc.y += other.y;
            acc.z += other.z;
            acc.w += other.w;
        }
    }
    const size_t orow = static_cast<size_t>(g) * R + r;
    if (out_bf16) {
        uint2 v;
        v.x = pack_bf16(acc.x, acc.y);
        v.y = pack_bf16(acc.z, acc.w);
        *reinterpret_cast<uint2*>(static_cast<uint16_t*>(out) + orow * DV + col) = v;
    } else {
        *reinterpret_cast<float4*>(static_cast<float*>(out) + orow * DV + col) = acc;
    }
    if (threadIdx.x == 0) lse[orow] = lse_out;
}
