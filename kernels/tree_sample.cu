// kernels/tree_sample.cu -- `tree-sample`: sampled, lossless acceptance of a DDTree draft tree (contract:
// plans/contracts.md, `tree-sample`). Design, proofs and measurements: plans/kernels/tree-sample.md.
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
// Entry points (clusters of ts::Eight::CLUSTER = 8 blocks of ts::THREADS = 512, or of ts::Six::CLUSTER = 6; a draw
// is the whole cluster's, each block a chunk of the row: tree_sample/draw.cuh)
//   kdt_tree_sample_slots  grid = G * N clusters, one per (request, slot), two blocks per multiprocessor (one wave):
//                          the slot's depth (tree_sample/depth.cuh, warp 0 while the other warps start the row),
//                          then its draw at position + depth into the workspace, a 64-bit entry per slot [G, N]
//                          (valid bit, depth + 1, token; unreachable slots: depth -1) published without a fence;
//                          the last cluster of a request to count (a counter per request, uint32 [G] after the
//                          entries) polls them, leaves entries and counter zero, and walks: on a tree rank 0's warp
//                          0 alone. Few rows (G * N small): every draw at once, one launch.
//   kdt_tree_sample_slots6 the same in clusters of six, one block per multiprocessor: the plan's choice where they
//                          take at most `six_block_waves` waves (a block alone on its multiprocessor reads faster).
//   kdt_tree_sample_walk   grid = G clusters: the walk, each slot it visits drawn on the spot, one after another:
//                          the path for many rows, which reads only the K + 1 rows a walk visits.
//   Graph-capturable: every per-request value is read on the device; the plan depends on shapes only.
//
// Memory traffic: per draw, the row once from DRAM (the first pass: the max; with top-p alone also the row's mass
//   and each warp's tokens near its max, sent with the max: every block cuts and draws there when they decide),
//   then from L2: top-p alone one more pass only where a warp had more near tokens than it keeps; otherwise 2-3
//   passes per filter (a histogram level, the gather of the cut bin's tokens) and the Gumbel pass.
// Limits (the launcher raises beyond): 1 <= vocab < 2^31; N <= ts::SLOTS_MAX for the every-slot path.

#include <stdint.h>

#include "common/ptx.cuh"
#include "tree_sample/depth.cuh"
#include "tree_sample/draw.cuh"

extern "C" __constant__ int kdt_tree_sample_threads = ts::THREADS;  // read by kdt/launch/tree_sample.py
extern "C" __constant__ int kdt_tree_sample_cluster = ts::Eight::CLUSTER;
extern "C" __constant__ int kdt_tree_sample_slots6_cluster = ts::Six::CLUSTER;
extern "C" __constant__ int kdt_tree_sample_slots_max = ts::SLOTS_MAX;
extern "C" __constant__ int kdt_tree_sample_slots_blocks_per_sm = ts::SLOTS_BLOCKS_PER_SM;

namespace ts {

struct Request {
    int g;
    uint32_t rank;
    float temperature;
    int top_k;
    float top_p;
    uint64_t seed, position;
};

template <class S>
__device__ __forceinline__ Request request(int g, const float* temperature, const int* top_k, const float* top_p,
                                           const unsigned long long* seed, const long long* position) {
    return {g, blockIdx.x % S::CLUSTER, temperature[g], top_k[g], top_p[g], seed[g],
            static_cast<uint64_t>(position[g])};
}

// This block's chunk of row `row` (a multiple of 8 logits: 16-byte aligned chunks), from shapes only: its L2
// prefetch can be issued before any per-request value arrives.
template <class S, typename Tin>
__device__ Draw<Tin, S> chunk_of(const Tin* logits, int vocab, size_t row) {
    const uint32_t rank = blockIdx.x % S::CLUSTER;
    const int chunk = ((vocab + S::CLUSTER - 1) / S::CLUSTER + 7) & ~7;
    const int begin = min(vocab, static_cast<int>(rank) * chunk), end = min(vocab, begin + chunk);
    return {logits + row * static_cast<size_t>(vocab), begin, end, 0.f, rank, 0u, 0.f};
}

__device__ __forceinline__ float inverse_temperature(float temperature) {
    return temperature > 0.f ? 1.f / temperature : 0.f;
}

// round: the exchange rounds of the draws before this one since the last cluster barrier (advanced).
template <class S, typename Tin>
__device__ int draw_row(const Tin* logits, int vocab, size_t row, const Request& q, uint64_t position,
                        uint32_t& round, Smem& s) {
    Draw<Tin, S> d = chunk_of<S>(logits, vocab, row);
    prefetch_chunk(d);
    d.inv_temperature = inverse_temperature(q.temperature);
    d.round = round;
    const int x = draw(d, q.temperature, q.top_k, q.top_p, q.seed, [&] { return position; }, vocab, s);
    round = d.round;
    return x;
}

// The walk of request q.g over its slots' rows row0 .. row0 + num_slots - 1. token, first_child, next_sibling and
// drawn are the request's own rows (global memory on the walk path, shared memory on the every-slot path); drawn
// holds (token, depth) per slot, or is null: a slot whose drawn depth is the walk's takes that token, any other is
// drawn on the spot by the whole cluster.
template <class S, typename Tin>
__device__ void walk(const Tin* logits, int vocab, size_t row0, const int* __restrict__ token,
                     const int* __restrict__ first_child, const int* __restrict__ next_sibling, int num_slots,
                     int max_depth, const Request& q, const int* __restrict__ drawn, int* __restrict__ accept_len,
                     int* __restrict__ accept_index, int* __restrict__ accept_tokens, Smem& s) {
    const size_t out = static_cast<size_t>(q.g) * static_cast<size_t>(max_depth + 1);
    const bool writes = q.rank == 0;
    if (writes)
        for (int i = threadIdx.x; i <= max_depth; i += THREADS) {  // -1 where the walk writes nothing
            accept_index[out + i] = i == 0 ? 0 : -1;
            accept_tokens[out + i] = -1;
        }
    __syncthreads();  // before thread 0 writes over them (levels past 31 are other warps' entries)
    // One level (thread 0): the child of cur carrying x, accepted while d < K, else x is the bonus and the walk ends
    // (-1).
    const auto step = [&](int cur, int d, int x) {
        const int found = d < max_depth ? child_carrying(token, first_child, next_sibling, num_slots, cur, x) : -1;
        if (writes) {
            accept_tokens[out + d] = x;  // a found child carries x
            if (found >= 0) accept_index[out + d + 1] = found;
            if (found < 0) accept_len[q.g] = d;
        }
        return found;
    };
    int cur = 0, d = 0;
    if (drawn != nullptr) {
        // Thread 0 follows the draws made at the walk's own depths without barriers; the cluster draws only from
        // the first slot whose draw is missing or was made at another depth (a pointer structure that is not a tree).
        if (threadIdx.x == 0) {
            while (cur >= 0 && drawn[2 * cur + 1] == d) {
                cur = step(cur, d, drawn[2 * cur]);
                if (cur >= 0) ++d;
            }
            s.next = cur;
            s.next_depth = d;
        }
        __syncthreads();
        cur = s.next, d = s.next_depth;
        __syncthreads();
        // Every block of the cluster gets the same (same tree, same draws). No draw here: no block reads another's
        // shared memory any more, and the walk ends without a cluster barrier.
        if (cur < 0) return;
    }
    uint32_t round = 0;  // the draws follow one another with no cluster barrier between: their exchanges alternate
    for (;; ++d) {        // buffers
        const bool predrawn = drawn != nullptr && drawn[2 * cur + 1] == d;
        const uint64_t position = q.position + static_cast<uint64_t>(d);
        const int x = predrawn ? drawn[2 * cur] : draw_row<S>(logits, vocab, row0 + cur, q, position, round, s);
        if (threadIdx.x == 0) s.next = step(cur, d, x);
        __syncthreads();
        cur = s.next;
        __syncthreads();
        if (cur < 0) break;
    }
    kdt::cluster_sync();  // no block leaves while another may still read its shared memory
}

// A slot's draw in its workspace entry: 64 bits that carry their own validity, so that no fence orders them before
// the count (the reader polls until it sees them): the valid bit, depth + 1 (0: not drawn), the token.
constexpr unsigned long long ENTRY_VALID = 1ull << 63;
__device__ __forceinline__ unsigned long long entry_of(int token, int depth) {
    return ENTRY_VALID | (static_cast<unsigned long long>(static_cast<uint32_t>(depth + 1)) << 32) |
           static_cast<uint32_t>(token);
}

// Rank 0's warp 0: this slot's entry published and the request's count taken, the lanes reading every entry at the
// same time. The last to count polls the entries not yet visible, stages the draws in tree.drawn (token, depth) and
// leaves the entries and the count zero for the next launch; returns whether it was the last.
__device__ bool publish_and_count(unsigned long long* entries, int slot, int num_slots, int x, int depth,
                                  uint32_t* finished, TreeSmem& tree) {
    constexpr int PER_LANE = SLOTS_MAX / 32;
    const int lane = threadIdx.x & 31;
    uint32_t count = 0u;
    if (lane == 0) {
        kdt::global_store_relaxed(entries + slot, entry_of(x, depth));
        count = kdt::global_add_relaxed(finished, 1u);
    }
    unsigned long long entry[PER_LANE];
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
        const int i = lane + 32 * k;
        entry[k] = i < num_slots ? kdt::global_load_relaxed(entries + i) : 0ull;
    }
    if (__shfl_sync(0xffffffffu, count, 0) != static_cast<uint32_t>(num_slots) - 1u) return false;
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
        const int i = lane + 32 * k;
        if (i >= num_slots) continue;
        while (!(entry[k] & ENTRY_VALID)) entry[k] = kdt::global_load_relaxed(entries + i);
        tree.drawn[2 * i] = static_cast<int>(static_cast<uint32_t>(entry[k]));
        tree.drawn[2 * i + 1] = static_cast<int>(static_cast<uint32_t>(entry[k] >> 32) & 0x7fffffffu) - 1;
        kdt::global_store_relaxed(entries + i, 0ull);
    }
    if (lane == 0) *finished = 0u;
    __syncwarp();
    return true;
}

// The every-slot path: this cluster's slot drawn at its depth into its entry of `drawn`; the request's last cluster
// to count walks on them: on a tree (every slot drawn at the one depth the walk can reach it with) rank 0's warp 0
// alone, the blocks arriving at the closing cluster barrier (no block leaves while another may still read its shared
// memory) before that; on another pointer structure the whole cluster, which may draw again.
// The request's values are read here, after the tree's copies are issued: read before the call (a reference to
// them) they went to local memory, a store that waits for the loads before anything else.
template <class S, typename Tin>
__device__ void every_slot(const Tin* logits, int vocab, const int* __restrict__ token,
                           const int* __restrict__ first_child, const int* __restrict__ next_sibling, int num_slots,
                           int max_depth, const float* __restrict__ temperature, const int* __restrict__ top_k,
                           const float* __restrict__ top_p, const unsigned long long* __restrict__ seed,
                           const long long* __restrict__ position, unsigned long long* drawn, unsigned int* finished,
                           int* __restrict__ accept_len, int* __restrict__ accept_index,
                           int* __restrict__ accept_tokens, Smem& s, TreeSmem& tree) {
    const int g = static_cast<int>(blockIdx.x / S::CLUSTER) / num_slots;
    const size_t row0 = static_cast<size_t>(g) * static_cast<size_t>(num_slots);
    const int slot = static_cast<int>(blockIdx.x / S::CLUSTER) - g * num_slots;
    Draw<Tin, S> d = chunk_of<S>(logits, vocab, row0 + slot);
    // No L2 prefetch of the chunk ahead of the first pass (the bulk-copy engine's, or each thread's own): either
    // made the launch slower (plans/kernels/tree-sample.md).
    // The depths found by warp 0 before its share of the first pass (found after it, while warp 0 reads top-p's
    // lists, they cost more than they hid: plans/kernels/tree-sample.md), and the draw abandoned after the first
    // exchange where the walk cannot reach this slot (every block of the cluster agrees: same depth)
    stage_tree_rows(token + row0, first_child + row0, next_sibling + row0, num_slots, tree);
    const Request q = request<S>(g, temperature, top_k, top_p, seed, position);
    d.inv_temperature = inverse_temperature(q.temperature);
    find_depths(num_slots, tree);  // warp 0 (the block reads them after the first exchange's barrier)
    const int x = draw(
        d, q.temperature, q.top_k, q.top_p, q.seed,
        [&] {
            const int depth = tree.depth[slot];
            return depth <= max_depth ? q.position + static_cast<uint64_t>(depth) : NO_POSITION;
        },
        vocab, s);
    const int depth = tree.depth[slot];
    const bool is_tree = tree.is_tree;
    if (is_tree) kdt::cluster_arrive_release();
    bool walks = false;
    if (q.rank == 0 && threadIdx.x < 32)
        walks = publish_and_count(drawn + row0, slot, num_slots, x, depth <= max_depth ? depth : -1, finished + g,
                                  tree);
    if (is_tree) {
        const size_t out = static_cast<size_t>(g) * static_cast<size_t>(max_depth + 1);
        if (walks) walk_tree(num_slots, max_depth, tree, accept_len + g, accept_index + out, accept_tokens + out);
        kdt::cluster_wait_acquire();
        return;
    }
    if (q.rank == 0 && threadIdx.x == 0)
        for (uint32_t r = 0; r < S::CLUSTER; ++r) kdt::store_to_block(&s.walks, r, walks ? 1u : 0u);
    kdt::cluster_sync();
    __syncthreads();
    if (!s.walks) return;  // the same in every block of the cluster
    if (q.rank != 0)       // the draws rank 0 staged
        for (int i = threadIdx.x; i < 2 * num_slots; i += THREADS)
            tree.drawn[i] =
                static_cast<int>(kdt::load_from_block(reinterpret_cast<const uint32_t*>(&tree.drawn[i]), 0));
    kdt::cluster_sync();  // before rank 0 may leave
    __syncthreads();
    walk<S>(logits, vocab, row0, tree.token, tree.first_child, tree.next_sibling, num_slots, max_depth, q,
            tree.drawn, accept_len, accept_index, accept_tokens, s);
}

}  // namespace ts

extern "C" __global__ void __cluster_dims__(ts::Eight::CLUSTER, 1, 1) __launch_bounds__(ts::THREADS, 1)
    kdt_tree_sample_walk(const void* __restrict__ target_logits, int bf16, int vocab, const int* __restrict__ token,
                         const int* __restrict__ first_child, const int* __restrict__ next_sibling, int num_slots,
                         int max_depth, const float* __restrict__ temperature, const int* __restrict__ top_k,
                         const float* __restrict__ top_p, const unsigned long long* __restrict__ seed,
                         const long long* __restrict__ position, int* __restrict__ accept_len,
                         int* __restrict__ accept_index, int* __restrict__ accept_tokens) {
    __shared__ ts::Smem s;
    kdt::after_previous_launch();
    const ts::Request q = ts::request<ts::Eight>(static_cast<int>(blockIdx.x / ts::Eight::CLUSTER), temperature,
                                                 top_k, top_p, seed, position);
    const size_t row0 = static_cast<size_t>(q.g) * static_cast<size_t>(num_slots);
    if (bf16)
        ts::walk<ts::Eight>(static_cast<const uint16_t*>(target_logits), vocab, row0, token + row0,
                            first_child + row0, next_sibling + row0, num_slots, max_depth, q, nullptr, accept_len,
                            accept_index, accept_tokens, s);
    else
        ts::walk<ts::Eight>(static_cast<const float*>(target_logits), vocab, row0, token + row0, first_child + row0,
                            next_sibling + row0, num_slots, max_depth, q, nullptr, accept_len, accept_index,
                            accept_tokens, s);
}

// The every-slot path's entry for clusters of SHAPE (ts::Eight or ts::Six) at MIN_BLOCKS blocks a multiprocessor.
#define KDT_TREE_SAMPLE_SLOTS_ENTRY(NAME, SHAPE, MIN_BLOCKS)                                                         \
    extern "C" __global__ void __cluster_dims__(SHAPE::CLUSTER, 1, 1) __launch_bounds__(ts::THREADS, MIN_BLOCKS)    \
        NAME(const void* __restrict__ target_logits, int bf16, int vocab, const int* __restrict__ token,            \
             const int* __restrict__ first_child, const int* __restrict__ next_sibling, int num_slots, int max_depth, \
             const float* __restrict__ temperature, const int* __restrict__ top_k, const float* __restrict__ top_p,  \
             const unsigned long long* __restrict__ seed, const long long* __restrict__ position,                   \
             unsigned long long* drawn, unsigned int* finished, int* __restrict__ accept_len,                       \
             int* __restrict__ accept_index, int* __restrict__ accept_tokens) {                                     \
        __shared__ ts::Smem s;                                                                                      \
        __shared__ ts::TreeSmem tree;                                                                               \
        kdt::after_previous_launch();                                                                               \
        if (bf16)                                                                                                   \
            ts::every_slot<SHAPE>(static_cast<const uint16_t*>(target_logits), vocab, token, first_child,           \
                                  next_sibling, num_slots, max_depth, temperature, top_k, top_p, seed, position,    \
                                  drawn, finished, accept_len, accept_index, accept_tokens, s, tree);               \
        else                                                                                                        \
            ts::every_slot<SHAPE>(static_cast<const float*>(target_logits), vocab, token, first_child,              \
                                  next_sibling, num_slots, max_depth, temperature, top_k, top_p, seed, position,    \
                                  drawn, finished, accept_len, accept_index, accept_tokens, s, tree);               \
    }

// Two blocks per multiprocessor (64 registers a thread): a GPC then holds twice the clusters, so that G * N draws
// of the every-slot path start in one wave (plans/kernels/tree-sample.md, "G1 N16: where the time goes"). The plan
// says so (KernelLaunch.blocks_per_sm), and kdt build holds two blocks' shared memory to each arch's multiprocessor.
KDT_TREE_SAMPLE_SLOTS_ENTRY(kdt_tree_sample_slots, ts::Eight, ts::SLOTS_BLOCKS_PER_SM)

// Six-block clusters, one block per multiprocessor (128 registers: seven loads in flight a thread): where G * N
// clusters of six take at most the plan's `six_block_waves` waves, each block has a multiprocessor to itself
// (plans/kernels/tree-sample.md, "Six-block clusters, kept").
KDT_TREE_SAMPLE_SLOTS_ENTRY(kdt_tree_sample_slots6, ts::Six, 1)
