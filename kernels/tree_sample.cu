// kernels/tree_sample.cu -- `tree-sample`: sampled, lossless acceptance of a DDTree draft tree (contract:
// plans/contracts.md, `tree-sample`). Design plan, and what this first version leaves for it: plans/kernels/tree-sample.md.
//
// Contract in brief
//   inputs  token, first_child, next_sibling int32 [G, N]; target_logits [G, N, vocab] float32 or bf16 (uint16 raw
//           bits); per request temperature float32, top_k int32 (0 off), top_p float32 (1 off), seed uint64,
//           position int64 (the absolute position of the token drawn at the root); max_depth = K.
//   outputs accept_len int32 [G]; accept_index, accept_tokens int32 [G, K+1], as tree-accept's.
//   Walk: cur = 0, d = 0; x = sample(g, cur, position + d); the first child of cur (sibling order) carrying x is
//   accepted while d < K; otherwise x is the bonus. Pointers are followed only inside [0, N); a malformed tree
//   stops the walk, never hangs.
//
// Entry point
//   kdt_tree_sample  grid = G, block = kdt_tree_sample_threads (512): a block walks one request, drawing each
//                    visited row with the whole block (tree_sample/draw.cuh). Static smem ~3 KB; no workspace.
//                    Graph-capturable: every per-request value is read on the device.
//
// Memory traffic (this first version: correct, not fast): per visited row, one pass for temperature only, ~9
//   passes with top-k (4 + 4 radix passes, then the draw) and ~10 more with top-p; the later passes of a row come
//   from L2. At most K + 1 rows per request.
//
// Limits (the launcher raises beyond): 1 <= vocab < 2^31; G < 2^31 (one block each).

#include <stdint.h>

#include "tree_sample/draw.cuh"

extern "C" __constant__ int kdt_tree_sample_threads = ts::THREADS;  // read by kdt/launch/tree_sample.py

template <typename Tin>
__device__ void walk(const Tin* __restrict__ logits, int vocab, const int* __restrict__ token,
                     const int* __restrict__ first_child, const int* __restrict__ next_sibling, int num_slots,
                     int max_depth, float temperature, int top_k, float top_p, uint64_t seed, uint64_t position,
                     int* __restrict__ accept_index, int* __restrict__ accept_tokens, int& accepted, ts::Smem& s) {
    const int g = static_cast<int>(blockIdx.x);
    const size_t slots = static_cast<size_t>(g) * static_cast<size_t>(num_slots);
    int cur = 0;
    for (int d = 0;; ++d) {
        const Tin* row = logits + (slots + static_cast<size_t>(cur)) * static_cast<size_t>(vocab);
        const int x = ts::draw(row, vocab, temperature, top_k, top_p, seed, position + static_cast<uint64_t>(d), s);
        if (threadIdx.x == 0) {
            int next = -1;
            if (d < max_depth) {
                int child = first_child[slots + cur];
                for (int steps = 0; child >= 0 && child < num_slots && steps < num_slots; ++steps) {
                    if (token[slots + child] == x) {
                        next = child;
                        break;
                    }
                    child = next_sibling[slots + child];
                }
            }
            const size_t out = static_cast<size_t>(g) * static_cast<size_t>(max_depth + 1);
            accept_tokens[out + d] = next >= 0 ? token[slots + next] : x;
            if (next >= 0) accept_index[out + d + 1] = next;
            s.next = next;
        }
        __syncthreads();
        cur = s.next;
        __syncthreads();
        if (cur < 0) {
            accepted = d;
            return;
        }
    }
}

extern "C" __global__ void __launch_bounds__(ts::THREADS)
    kdt_tree_sample(const void* __restrict__ target_logits, int bf16, int vocab, const int* __restrict__ token,
                    const int* __restrict__ first_child, const int* __restrict__ next_sibling, int num_slots,
                    int max_depth, const float* __restrict__ temperature, const int* __restrict__ top_k,
                    const float* __restrict__ top_p, const unsigned long long* __restrict__ seed,
                    const long long* __restrict__ position, int* __restrict__ accept_len,
                    int* __restrict__ accept_index, int* __restrict__ accept_tokens) {
    __shared__ ts::Smem s;
    const int g = static_cast<int>(blockIdx.x);
    const size_t out = static_cast<size_t>(g) * static_cast<size_t>(max_depth + 1);
    for (int i = threadIdx.x; i <= max_depth; i += ts::THREADS) {  // -1 where the walk writes nothing
        accept_index[out + i] = i == 0 ? 0 : -1;
        accept_tokens[out + i] = -1;
    }
    __syncthreads();
    int accepted = 0;
    const uint64_t pos = static_cast<uint64_t>(position[g]);
    if (bf16)
        walk(static_cast<const uint16_t*>(target_logits), vocab, token, first_child, next_sibling, num_slots, max_depth,
             temperature[g], top_k[g], top_p[g], seed[g], pos, accept_index, accept_tokens, accepted, s);
    else
        walk(static_cast<const float*>(target_logits), vocab, token, first_child, next_sibling, num_slots, max_depth,
             temperature[g], top_k[g], top_p[g], seed[g], pos, accept_index, accept_tokens, accepted, s);
    if (threadIdx.x == 0) accept_len[g] = accepted;
}
