// kernels/tree_sample/depth.cuh -- the every-slot path's view of its request's tree: the pointer rows and tokens
// staged in shared memory (for the depths, then the walk), and the depth of a slot: the number of accepts after
// which the walk reaches it (root 0, first_child + 1, next_sibling + 0), pointers followed only inside [0, N). On a
// tree (one way into each slot, none into the root) by pointer jumping: log2(N) rounds. On other pointer structures
// (a slot reachable two ways, a cycle through the root) by min-plus relaxation: the least depth, a round per level.
// Both are deterministic, so the 8 blocks of a cluster agree; the walk redraws any slot it reaches at another depth.
#pragma once

#include <stdint.h>

#include "common/ptx.cuh"
#include "tree_sample/row.cuh"

namespace ts {

constexpr int SLOTS_MAX = 256;       // the every-slot path's largest N (the launcher keeps to it)
constexpr int SLOTS_BLOCKS_PER_SM = 2;  // the every-slot kernel's blocks per multiprocessor (its register budget)
constexpr int UNREACHED = 0x3fffffff;

struct TreeSmem {
    int token[SLOTS_MAX];
    int first_child[SLOTS_MAX];
    int next_sibling[SLOTS_MAX];
    int way_in[SLOTS_MAX];           // 2 * (the slot pointing here) + (1: as first child), or -1; then the jumps
    int depth[SLOTS_MAX];
    int drawn[2 * SLOTS_MAX];        // (token, depth) of every slot's draw, staged for the walk
    int is_tree;                     // one way into every slot, none into the root: each slot drawn at the only
};                                   // depth the walk can reach it with

// The first child of `slot` (in sibling order) carrying token x, or -1: pointers followed only inside [0, N), and
// at most N of them (a hostile cycle ends). The walk's one step; the rows are global or shared memory.
__device__ __forceinline__ int child_carrying(const int* __restrict__ token, const int* __restrict__ first_child,
                                              const int* __restrict__ next_sibling, int num_slots, int slot, int x) {
    int child = first_child[slot];
    for (int steps = 0; child >= 0 && child < num_slots && steps < num_slots; ++steps) {
        if (token[child] == x) return child;
        child = next_sibling[child];
    }
    return -1;
}

// The least depths by min-plus relaxation, in warp 0 (its rounds at warp barriers: a round per level).
__device__ void relaxed_depths(int num_slots, TreeSmem& tree) {
    for (int i = threadIdx.x; i < num_slots; i += 32) tree.depth[i] = i == 0 ? 0 : UNREACHED;
    __syncwarp();
    for (int round = 0; round <= num_slots; ++round) {
        bool changed = false;
        for (int i = threadIdx.x; i < num_slots; i += 32) {
            const int here = tree.depth[i];
            if (here == UNREACHED) continue;
            const int child = tree.first_child[i], sibling = tree.next_sibling[i];
            if (child >= 0 && child < num_slots && here + 1 < tree.depth[child]) {
                atomicMin(&tree.depth[child], here + 1);
                changed = true;
            }
            if (sibling >= 0 && sibling < num_slots && here < tree.depth[sibling]) {
                atomicMin(&tree.depth[sibling], here);
                changed = true;
            }
        }
        if (!__any_sync(0xffffffffu, changed)) break;  // also the round's barrier: its writes -> every lane
    }
}

// The depths of a tree by pointer jumping, in warp 0: each slot's pointer up and its distance there, doubled each
// round (read everything, warp barrier, write, warp barrier) until it points at the root; a slot that never gets
// there (no way in, or on a cycle away from the root) is unreached.
__device__ void jumped_depths(int num_slots, TreeSmem& tree) {
    constexpr int PER_LANE = SLOTS_MAX / 32;  // slot lane + 32 k is this lane's k-th (all loops fully unrolled:
    int up[PER_LANE], dist[PER_LANE];         // the arrays stay in registers)
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
        const int i = threadIdx.x + 32 * k;
        const int way = i < num_slots ? tree.way_in[i] : -1;
        up[k] = i == 0 || way < 0 ? i : way >> 1;
        dist[k] = i == 0 || way < 0 ? 0 : way & 1;
    }
    __syncwarp();
    const auto publish = [&]() {
#pragma unroll
        for (int k = 0; k < PER_LANE; ++k) {
            const int i = threadIdx.x + 32 * k;
            if (i < num_slots) {
                tree.way_in[i] = up[k];
                tree.depth[i] = dist[k];
            }
        }
        __syncwarp();
    };
    publish();
    const int rounds = num_slots > 1 ? 32 - __clz(num_slots - 1) : 0;  // 2^rounds >= N - 1, the longest path
    for (int round = 0; round < rounds; ++round) {
#pragma unroll
        for (int k = 0; k < PER_LANE; ++k) {
            if (threadIdx.x + 32 * k < num_slots) {
                dist[k] += tree.depth[up[k]];
                up[k] = tree.way_in[up[k]];
            }
        }
        __syncwarp();
        publish();
    }
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
        const int i = threadIdx.x + 32 * k;
        if (i < num_slots) tree.depth[i] = up[k] == 0 ? dist[k] : UNREACHED;
    }
}

// The same for N <= 32, one slot per lane: the pointers and distances jump by shuffles, in registers.
__device__ void shuffled_depths(int num_slots, TreeSmem& tree) {
    const int i = threadIdx.x;
    const int way = i < num_slots ? tree.way_in[i] : -1;
    int up = i == 0 || way < 0 ? i : way >> 1, dist = i == 0 || way < 0 ? 0 : way & 1;
    const int rounds = num_slots > 1 ? 32 - __clz(num_slots - 1) : 0;
    for (int round = 0; round < rounds; ++round) {
        dist += __shfl_sync(0xffffffffu, dist, up);
        up = __shfl_sync(0xffffffffu, up, up);
    }
    if (i < num_slots) tree.depth[i] = up == 0 ? dist : UNREACHED;
}

// The request's rows into `tree` by asynchronous copies from warp 0 (the warp that finds the depths and waits for
// them): issued at the start of the launch, they land during the row's first pass, holding no registers.
__device__ __forceinline__ void stage_tree_rows(const int* __restrict__ token, const int* __restrict__ first_child,
                                                const int* __restrict__ next_sibling, int num_slots, TreeSmem& tree) {
    if (threadIdx.x >= 32) return;
    for (int i = threadIdx.x; i < num_slots; i += 32) {
        kdt::cp_async4(kdt::smem_addr(&tree.token[i]), token + i);
        kdt::cp_async4(kdt::smem_addr(&tree.first_child[i]), first_child + i);
        kdt::cp_async4(kdt::smem_addr(&tree.next_sibling[i]), next_sibling + i);
    }
    kdt::cp_async_commit();
}

// Every slot's depth into tree.depth (UNREACHED where the walk cannot reach it), from the rows stage_tree_rows
// copied, by warp 0 alone at warp barriers (no block barrier: the other warps go on with the row's first pass), the
// block reading them after a later block barrier (before the first pass, not inside the first exchange: there they
// cost more than the wait they were to hide in; plans/kernels/tree-sample.md).
__device__ void find_depths(int num_slots, TreeSmem& tree) {
    if (threadIdx.x >= 32) return;
    kdt::cp_async_wait<0>();
    for (int i = threadIdx.x; i < num_slots; i += 32) tree.way_in[i] = -1;
    __syncwarp();
    // the ways in: each slot claims its first child and its next sibling; a second claim, or one of the root, and
    // this is not a tree
    bool not_a_tree = false;
    for (int i = threadIdx.x; i < num_slots; i += 32) {
        const int child = tree.first_child[i], sibling = tree.next_sibling[i];
        if (child >= 0 && child < num_slots && (child == 0 || atomicCAS(&tree.way_in[child], -1, 2 * i + 1) != -1))
            not_a_tree = true;
        if (sibling >= 0 && sibling < num_slots && (sibling == 0 || atomicCAS(&tree.way_in[sibling], -1, 2 * i) != -1))
            not_a_tree = true;
    }
    __syncwarp();
    const bool is_tree = !__any_sync(0xffffffffu, not_a_tree);
    if (threadIdx.x == 0) tree.is_tree = is_tree;
    if (!is_tree) relaxed_depths(num_slots, tree);
    else if (num_slots <= 32) shuffled_depths(num_slots, tree);
    else jumped_depths(num_slots, tree);
}

// The walk of a tree on draws staged in tree.drawn, each made at the one depth the walk can reach its slot with, by
// one warp: each lane finds its slots' accepted children at once (the first child, in sibling order, carrying the
// slot's draw, where the slot's depth is under max_depth; into tree.way_in, free since the depths), lane 0 follows
// them, and the lanes write -1 past the walk's end. out: the request's first entry of accept_index/accept_tokens.
__device__ void walk_tree(int num_slots, int max_depth, TreeSmem& tree, int* __restrict__ accept_len,
                          int* __restrict__ accept_index, int* __restrict__ accept_tokens) {
    const int lane = threadIdx.x & 31;
    for (int slot = lane; slot < num_slots; slot += 32) {
        const int depth = tree.drawn[2 * slot + 1];
        tree.way_in[slot] = depth >= 0 && depth < max_depth
                                ? child_carrying(tree.token, tree.first_child, tree.next_sibling, num_slots, slot,
                                                 tree.drawn[2 * slot])
                                : -1;
    }
    __syncwarp();
    int length = 0;
    if (lane == 0) {
        accept_index[0] = 0;
        for (int cur = 0;; ++length) {
            accept_tokens[length] = tree.drawn[2 * cur];
            cur = tree.way_in[cur];
            if (cur < 0) break;
            accept_index[length + 1] = cur;
        }
        *accept_len = length;
    }
    length = __shfl_sync(0xffffffffu, length, 0);
    for (int i = length + 1 + lane; i <= max_depth; i += 32) {
        accept_index[i] = -1;
        accept_tokens[i] = -1;
    }
}

}  // namespace ts
