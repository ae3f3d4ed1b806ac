// kernels/tree_sample/depth.cuh -- the every-slot path's view of its request's tree: the pointer rows and tokens
// staged in shared memory (for the depths, then the walk), and the depth of a slot: the number of accepts after
// which the walk reaches it (root 0, first_child + 1, next_sibling + 0). Min-plus relaxation, pointers followed
// only inside [0, N): on a tree each slot has one way in and this is the walk's depth; on other pointer structures
// (a slot reachable two ways, cycles) it is the least such depth, the same in every block, and the walk redraws
// any slot it reaches at another depth.
#pragma once

#include <stdint.h>

#include "tree_sample/row.cuh"

namespace ts {

constexpr int SLOTS_MAX = 256;       // the every-slot path's largest N (the launcher keeps to it)
constexpr int UNREACHED = 0x3fffffff;

struct TreeSmem {
    int token[SLOTS_MAX];
    int first_child[SLOTS_MAX];
    int next_sibling[SLOTS_MAX];
    int depth[SLOTS_MAX];
    int drawn[2 * SLOTS_MAX];        // (token, depth) of every slot's draw, staged for the walk
};

// Stages the request's rows into `tree`; returns the depth of `slot` (UNREACHED when the walk cannot reach it)
// in every thread of the block. The relaxation runs in warp 0 alone, its rounds at warp barriers: a round per
// level of the tree, and a 16-deep chain at block barriers cost more than the draw's first pass.
__device__ int slot_depth(const int* __restrict__ token, const int* __restrict__ first_child,
                          const int* __restrict__ next_sibling, int num_slots, int slot, TreeSmem& tree) {
    for (int i = threadIdx.x; i < num_slots; i += THREADS) {
        tree.token[i] = token[i];
        tree.first_child[i] = first_child[i];
        tree.next_sibling[i] = next_sibling[i];
        tree.depth[i] = i == 0 ? 0 : UNREACHED;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
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
    __syncthreads();
    return tree.depth[slot];
}

}  // namespace ts
