// kernels/tree_build/finalize.cuh -- the finalize of the serial and select paths (the small path has its own, warp
// 0 only, in small.cuh): after the build, the whole block writes every output from the records it left in shared
// memory (rec_s, logw_s, fc_s / ns_s, misc[0] = n_nodes): the per-slot outputs, and the block exits of pointer
// jumping that the mask rows follow (tree_build_body copies the rows out itself, through per-warp tiles). Called
// by tree_build_body (serial.cuh). See plans/kernels/tree-build.md, "Finalize".
#pragma once

#include <stdint.h>

#include "tree_build/layout.cuh"

namespace {

// n_nodes[g] = n and the request's rows (from `row` = g * N) of the per-slot outputs: slot 0 is the root, slots
// 1..n the taken nodes, the rest unused (-1 / -inf). Tokens at ranks >= Vs (the _g entries) come from global memory.
__device__ __forceinline__ void write_slot_outputs(int g, int N, int n, size_t row, int V, int Vs, int tid,
                                                   const int* __restrict__ gid, const int* ids_s, const int* rec_s,
                                                   const float* logw_s, const int* fc_s, const int* ns_s,
                                                   int* __restrict__ n_nodes, int* __restrict__ out_parent,
                                                   int* __restrict__ out_depth, int* __restrict__ out_token,
                                                   int* __restrict__ out_rank, float* __restrict__ out_logw,
                                                   int* __restrict__ out_first_child,
                                                   int* __restrict__ out_next_sibling) {
    for (int i = tid; i < N; i += kThreads) {
        int par = -1, dep = -1, tok = -1, rnk = -1, fcv = -1, nsv = -1;
        float lw = -INFINITY;
        if (i == 0) {
            dep = 0;
            lw = 0.0f;
            fcv = fc_s[0];
        } else if (i <= n) {
            const uint32_t rc = (uint32_t)rec_s[i];
            par = (int)(rc >> 16);
            rnk = (int)((rc >> 6) & 1023u);
            dep = (int)(rc & 63u) + 1;
            tok = (rnk < Vs) ? ids_s[(dep - 1) * Vs + rnk] : gid[(size_t)(dep - 1) * V + rnk];
            lw = logw_s[i];
            fcv = fc_s[i];
            nsv = ns_s[i];
        }
        out_parent[row + i] = par;
        out_depth[row + i] = dep;
        out_token[row + i] = tok;
        out_rank[row + i] = rnk;
        out_logw[row + i] = lw;
        out_first_child[row + i] = fcv;
        out_next_sibling[row + i] = nsv;
    }
    if (tid == 0) n_nodes[g] = n;
}

// Per 32-slot block b (one warp per block): for slot j in it, ent[j] = (bits of j's ancestors-or-self inside
// block b, first ancestor below block b or -1), by pointer jumping over the in-block parent chain (< 32 links, 5
// rounds of shuffles). ent's loop contents are dead by now. Ends with a block barrier: the mask rows read ent next.
__device__ __forceinline__ void mask_block_exits(int W, int n, int lane, int warp, const int* rec_s, uint2* ent) {
    for (int b = warp; b < W; b += kWarps) {
        const int j = (b << 5) + lane;
        const bool valid = j <= n;
        const int par = (valid && j > 0) ? (int)((uint32_t)rec_s[j] >> 16) : -1;
        uint32_t acc = valid ? (1u << lane) : 0u;
        int nxt = (par >= (b << 5)) ? (par & 31) : -1;    // next link inside the block (lane), or -1
        int ex = par;                                      // the exit, once nxt == -1
#pragma unroll
        for (int round = 0; round < 5; ++round) {
            const int src = nxt >= 0 ? nxt : lane;
            const uint32_t oa = __shfl_sync(kFull, acc, src);
            const int on = __shfl_sync(kFull, nxt, src);
            const int oe = __shfl_sync(kFull, ex, src);
            if (nxt >= 0) {
                acc |= oa;
                nxt = on;
                ex = oe;
            }
        }
        if (valid) ent[j] = make_uint2(acc, (uint32_t)ex);
    }
    __syncthreads();
}

}  // namespace
