// kernels/tree_sample/depth.cuh -- the depth of a slot in its request's tree, for the every-slot path: the number
// of accepts after which the walk reaches it (root 0, first_child + 1, next_sibling + 0). Min-plus relaxation over
// the request's pointer rows staged in shared memory, pointers followed only inside [0, N): on a tree each slot
// has one way in and this is the walk's depth; on other pointer structures (a slot reachable two ways, cycles) it
// is the least such depth, the same in every block, and the walk redraws any slot it reaches at another depth.
#pragma once

#include <stdint.h>

#include "tree_sample/row.cuh"

namespace ts {

constexpr int SLOTS_MAX = 256;       // the every-slot path's largest N (the launcher keeps to it)
constexpr int UNREACHED = 0x3fffffff;

struct DepthSmem {
    int first_child[SLOTS_MAX];
    int next_sibling[SLOTS_MAX];
    int depth[SLOTS_MAX];
};

// depth of `slot` (UNREACHED when the walk cannot reach it), in every thread of the block.
__device__ int slot_depth(const int* __restrict__ first_child, const int* __restrict__ next_sibling, int num_slots,
                          int slot, DepthSmem& s) {
    for (int i = threadIdx.x; i < num_slots; i += THREADS) {
        s.first_child[i] = first_child[i];
        s.next_sibling[i] = next_sibling[i];
        s.depth[i] = i == 0 ? 0 : UNREACHED;
    }
    __syncthreads();
    for (int round = 0; round <= num_slots; ++round) {
        int changed = 0;
        for (int i = threadIdx.x; i < num_slots; i += THREADS) {
            const int here = s.depth[i];
            if (here == UNREACHED) continue;
            const int child = s.first_child[i], sibling = s.next_sibling[i];
            if (child >= 0 && child < num_slots && here + 1 < s.depth[child]) {
                atomicMin(&s.depth[child], here + 1);
                changed = 1;
            }
            if (sibling >= 0 && sibling < num_slots && here < s.depth[sibling]) {
                atomicMin(&s.depth[sibling], here);
                changed = 1;
            }
        }
        if (!__syncthreads_or(changed)) break;
    }
    const int depth = s.depth[slot];
    __syncthreads();
    return depth;
}

}  // namespace ts
