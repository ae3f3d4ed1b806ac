// kernels/tree_accept.cu -- `tree-accept`: greedy acceptance of a DDTree draft tree (contract: plans/contracts.md,
// `tree-accept`). Design note: plans/kernels/tree-accept.md.
//
// Contract in brief
//   inputs  token, first_child, next_sibling int32 [G, N]; and either target_predict int32 [G, N] or
//           target_logits [G, N, vocab] float32 or bf16 (uint16 raw bits), whose per-slot argmax is fused here
//           (equal logits: smaller id). max_depth = K. n_nodes is not read: the walk follows the pointers alone.
//   outputs accept_len int32 [G]; accept_index, accept_tokens int32 [G, K+1]. Every element is written.
//   Walk: from slot 0, the first child (first_child / next_sibling order) whose token equals the prediction at
//   the current slot is accepted; stop when none matches or K are accepted; bonus = the prediction at the last
//   accepted slot. A malformed tree (cycles, pointers outside [0, N)) stops the walk; it never hangs or reads
//   out of bounds.
//
// Entry points (each serves the whole batch in one launch: graph-capturable, no host sync)
//   tree_accept_from_predict  grid = ceil(G / kdt_tree_accept_walk_warps), block = 32 * walk_warps (1 warp, one
//                             request per warp); static smem 16.5 KB per warp; no workspace. The warp stages the
//                             request's rows, lane 0 walks (tree_accept/walk.cuh).
//   tree_accept_from_logits   grid = G * N * S, block = kdt_tree_accept_argmax_threads (256), S = vocab splits
//                             per row (the launcher's choice); block b: row b / S (request g = row / N), split
//                             b % S. Static smem 16.5 KB; __launch_bounds__(256, 4): <= 64 registers.
//                             Each block's argmax merges into a per-slot workspace key; the last block of a
//                             request stages the rows and walks (tree_accept/argmax.cuh, then walk.cuh).
//                             Workspace: G * N * 8 B keys, then G * 4 B counters; zero on entry, zero on exit.
//
// Memory traffic
//   from_predict: reads 16 B per slot (4 int32 rows), writes 4 + 8 (K+1) B per request.
//   from_logits:  reads G * N * vocab * elem_size once (streaming loads), everything else < 0.1%.
//
// Limits (the launcher raises beyond): 1 <= N <= kdt_tree_accept_max_nodes (1024); K >= 0; 1 <= vocab < 2^31;
//   G * N * S < 2^31 blocks; NaN logits are rejected before launch (-inf is legal).

#include "common/ptx.cuh"
#include "tree_accept/argmax.cuh"
#include "tree_accept/config.cuh"
#include "tree_accept/walk.cuh"

// Read once by the launcher (kdt/launch/tree_accept.py); the numbers live in tree_accept/config.cuh only.
extern "C" {
__constant__ int kdt_tree_accept_max_nodes = kMaxNodes;
__constant__ int kdt_tree_accept_walk_warps = kWalkWarps;
__constant__ int kdt_tree_accept_argmax_threads = kArgmaxThreads;
__constant__ int kdt_tree_accept_argmax_min_blocks = kArgmaxMinBlocks;
__constant__ int kdt_tree_accept_split_min_vectors = kSplitMinVectors;
}

extern "C" __global__ void __launch_bounds__(kWalkWarps * 32)
tree_accept_from_predict(const int* __restrict__ token, const int* __restrict__ first_child,
                         const int* __restrict__ next_sibling, const int* __restrict__ target_predict, int num_groups,
                         int num_slots, int max_depth, int* __restrict__ accept_len, int* __restrict__ accept_index,
                         int* __restrict__ accept_tokens) {
    __shared__ WalkSmem smem[kWalkWarps];
    kdt::after_previous_launch();
    const int warp = kWalkWarps == 1 ? 0 : static_cast<int>(threadIdx.x) >> 5;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int g = static_cast<int>(blockIdx.x) * kWalkWarps + warp;
    if (g >= num_groups) return;  // whole warp; no block-wide barrier below
    WalkSmem& s = smem[warp];
    // Stage the request's four rows: each round's loads before its stores, one memory round trip per 256 slots.
    // (This loop stays in the entry: moved into a helper, the compiler strength-reduces it differently.)
    const int n = num_slots;
    const size_t base = static_cast<size_t>(g) * static_cast<size_t>(n);
    constexpr int kStageUnroll = 8;  // 4 x 8 independent 4-byte loads per lane in flight
    for (int j0 = 0; j0 < n; j0 += 32 * kStageUnroll) {  // <= kMaxNodes / 256 rounds
        int t[kStageUnroll], f[kStageUnroll], x[kStageUnroll], p[kStageUnroll];
#pragma unroll
        for (int u = 0; u < kStageUnroll; ++u) {
            const int j = j0 + u * 32 + lane;
            if (j < n) {
                t[u] = __ldg(token + base + j);
                f[u] = __ldg(first_child + base + j);
                x[u] = __ldg(next_sibling + base + j);
                p[u] = __ldg(target_predict + base + j);
            }
        }
#pragma unroll
        for (int u = 0; u < kStageUnroll; ++u) {
            const int j = j0 + u * 32 + lane;
            if (j < n) s.rec[j] = make_rec(t[u], f[u], x[u], p[u], n);
        }
    }
    for (int w = lane; w < (n + 31) / 32; w += 32) s.path[w] = 0u;
    __syncwarp();
    walk_and_write(s, g, n, max_depth, lane, accept_len, accept_index, accept_tokens);
}

extern "C" __global__ void __launch_bounds__(kArgmaxThreads, kArgmaxMinBlocks)
tree_accept_from_logits(const void* __restrict__ target_logits, int logits_bf16, int vocab, int splits,
                        const int* __restrict__ token, const int* __restrict__ first_child,
                        const int* __restrict__ next_sibling, int num_groups, int num_slots, int max_depth,
                        unsigned char* __restrict__ workspace, int* __restrict__ accept_len,
                        int* __restrict__ accept_index, int* __restrict__ accept_tokens) {
    __shared__ WalkSmem s;
    __shared__ float red_v[kArgmaxThreads / 32];
    __shared__ int red_i[kArgmaxThreads / 32];
    __shared__ int is_last;
    kdt::after_previous_launch();

    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int n = num_slots;
    const int split = static_cast<int>(blockIdx.x % static_cast<unsigned>(splits));
    const size_t row = blockIdx.x / static_cast<unsigned>(splits);  // g * N + slot
    const int g = static_cast<int>(row / static_cast<size_t>(n));
    unsigned long long* keys = reinterpret_cast<unsigned long long*>(workspace);
    unsigned int* counts =
        reinterpret_cast<unsigned int*>(workspace + static_cast<size_t>(num_groups) * static_cast<size_t>(n) * 8u);

    float bv;       // this thread's (value, index), then thread 0's of the block
    int bi;
    block_part_argmax(target_logits, logits_bf16, vocab, split, splits, row, tid, lane, warp, red_v, red_i, bv, bi);
    if (!merge_part_argmax(bv, bi, red_v, red_i, keys, counts, row, g, n, splits, tid, is_last))
        return;     // block-uniform: another block of request g is still scanning; the last one walks
    stage_argmax_rows(s, keys, counts, g, n, tid, token, first_child, next_sibling);
    if (warp == 0) walk_and_write(s, g, n, max_depth, lane, accept_len, accept_index, accept_tokens);
}
