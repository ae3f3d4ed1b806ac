// kernels/topk.cu -- `topk` stage: drafter logits [G, K, vocab] -> per-row top-V ids and log-probabilities.
//
// Contract (plans/contracts.md, `topk`)
//   logits   float32 or bf16 (uint16 raw bits) [R = G*K rows, vocab], vocab <= 262144
//   top_ids  int32   [R, V]  the V largest logits of the row, descending; equal logits -> smaller id first
//   top_logp float32 [R, V]  logit - logsumexp(row)
//   1 <= V <= min(vocab, 1024). -inf logits are legal (rank last, ties by id, logp = -inf). The validator rejects
//   NaN and rows without a finite logit before launch; +inf is assumed rejected too (the float64 reference would
//   give NaN). -0.0 and +0.0 compare equal (the id decides).
//
// Entry points (kdt/launch/topk.py picks one per batch; VT = the template bound 1/2/4/8/16/32, runtime V <= VT)
//   kdt_topk_small_{f32,bf16}_v{VT}    small path, V <= 32 (topk/small.cuh): S blocks per row, each scans its
//                                      chunk once; S > 1: the last block merges the splits through the workspace.
//   kdt_topk_cluster_{f32,bf16}_v{VT}  the same with S = kdt_topk_cluster_size blocks of one cluster per row,
//                                      merged over distributed shared memory into block 0 (no workspace).
//   kdt_topk_resident_{wide,narrow}_{f32,bf16}  resident path, V <= 8, few 16-byte aligned rows
//                                      (topk/resident.cuh): a block's whole chunk in shared memory by bulk copies.
//   kdt_topk_gate_{f32,bf16}           gate path, 32 < V <= 1024, 16-byte aligned rows (topk/gate.cuh): one read
//                                      of the row by free-running warps, the candidates above a gate kept in
//                                      shared memory and pruned by radix select when full (bf16 on sm_90 /
//                                      sm_100: the gate from the whole row's vector maxima, topk/gate_maxima.cuh).
//   kdt_topk_gate_split_{f32,bf16}     the same with S blocks per row where the rows leave SMs idle; the row's
//                                      last block to finish merges the splits' V best through the workspace.
//   kdt_topk_general_{f32,bf16}        general path, any V <= 1024 (topk/radix.cuh): exact radix select.
//
// Launch shape and limits
//   small:    grid R*S (block b -> row b / S, split b % S), 256 threads, static smem (sm_90 ~41 KB, sm_120 ~30 KB)
//             + dynamic kdt_topk_small_stage_bytes (sm_90: 32 KB cp.async ring; sm_120: 0, register loads);
//             S <= 128, S*VT <= kdt_topk_merge_cap (sm_90 2048, sm_120 1024).
//             Workspace (S > 1): u32 counter[R] | float2 stats[R][S] | uint2 cand[R][S][VT], each part padded to
//             256 bytes; the counters are left zero (graph-replayable).
//   cluster:  as small with __cluster_dims__(kdt_topk_cluster_size) (16 on sm_90, non-portable; 8 on sm_120).
//   resident: grid R*S, one cluster of S = 16 (wide; 8 on sm_120) or 8 (narrow) blocks per row, 256 threads,
//             dynamic smem max(chunk bytes, kdt_topk_resident_*_min_smem); a chunk <= 16 (wide) / 20 (narrow)
//             16-byte vectors per thread, vocab a multiple of 16 bytes; wide up to 7 rows, narrow beyond.
//   gate:     grid R, 1024 threads, 8.7 KB static smem + dynamic 8 * capacity bytes, capacity =
//             max(kdt_topk_gate_room_per_v * V, kdt_topk_gate_min_room) (V = 1024: 32 KB), + for f32 the
//             cp.async ring, kdt_topk_gate_f32_ring_bytes (128 KB on sm_90 / sm_100, 0 on sm_120), for bf16 the
//             vector maxima, kdt_topk_gate_bf16_maxima_bytes (64 KB on sm_90 / sm_100, 0 on sm_120).
//   gate split: grid R*S (block b -> row b / S, split b % S), as gate with 8.9 KB static smem;
//             1 < S <= kdt_topk_gate_max_splits (32), S * V <= capacity. Workspace: u32 counter[R] |
//             uint4 record[R][S][2] | u64 entries[R][S][V], each part from a 256-byte boundary; counters left 0.
//   general:  grid R, 1024 threads, ~16 KB static smem.
//
// Memory traffic: the logits once (small, cluster, resident) + R*V*8 bytes of outputs (+ the small path's
// partials, S*R*(8 + 8*VT)*2 bytes); the gate path reads a row once (+ split rows' partials, R*S*(32 + 8*V)*2
// bytes; + the one-block bf16 kernel's second read of the vectors that reach its gate, ~5% at V = 1024 of vocab
// 163840, mostly from L2); the general path 2 + (refining passes) times, mostly from L2.
//
// Design, proofs (ordering, bounds, error budget), SASS figures and timings: plans/kernels/topk.md.

#include "common/ptx.cuh"
#include "topk/config.cuh"
#include "topk/gate.cuh"
#include "topk/radix.cuh"
#include "topk/resident.cuh"
#include "topk/small.cuh"

// ---- launch constants (kdt build reads them from the cubin; kdt/launch/topk.py plans with them)
extern "C" __constant__ int kdt_topk_small_threads = topk::SMALL_THREADS;
extern "C" __constant__ int kdt_topk_small_max_v = topk::SMALL_MAX_V;
extern "C" __constant__ int kdt_topk_max_splits = topk::MAX_SPLITS;
extern "C" __constant__ int kdt_topk_merge_cap = topk::MERGE_CAP;
extern "C" __constant__ int kdt_topk_general_threads = topk::GEN_THREADS;
extern "C" __constant__ int kdt_topk_gate_threads = topk::GATE_THREADS;
extern "C" __constant__ int kdt_topk_gate_room_per_v = topk::GATE_ROOM_PER_V;
extern "C" __constant__ int kdt_topk_gate_min_room = topk::GATE_MIN_ROOM;
extern "C" __constant__ int kdt_topk_gate_f32_ring_bytes = topk::GATE_F32_RING_BYTES;
extern "C" __constant__ int kdt_topk_gate_bf16_maxima_bytes = topk::GATE_BF16_MAXIMA_BYTES;
extern "C" __constant__ int kdt_topk_gate_max_splits = topk::GATE_MAX_SPLITS;
extern "C" __constant__ int kdt_topk_max_v = topk::MAX_V;
extern "C" __constant__ int kdt_topk_max_vocab = topk::MAX_VOCAB;
extern "C" __constant__ int kdt_topk_small_stage_bytes = topk::SMALL_STAGE_BYTES;
extern "C" __constant__ int kdt_topk_cluster_size = topk::ROW_CLUSTER;
extern "C" __constant__ int kdt_topk_resident_max_v = topk::RES_VT;
extern "C" __constant__ int kdt_topk_resident_threads = topk::RES_THREADS;
extern "C" __constant__ int kdt_topk_resident_wide_cluster = topk::ResWide::cluster;
extern "C" __constant__ int kdt_topk_resident_wide_max_vectors = topk::ResWide::max_vectors;
extern "C" __constant__ int kdt_topk_resident_wide_min_smem = topk::ResWide::min_smem;
extern "C" __constant__ int kdt_topk_resident_narrow_cluster = topk::ResNarrow::cluster;
extern "C" __constant__ int kdt_topk_resident_narrow_max_vectors = topk::ResNarrow::max_vectors;
extern "C" __constant__ int kdt_topk_resident_narrow_min_smem = topk::ResNarrow::min_smem;

// ---- entry points
// kdt_topk_small_<dtype>_v<VT>: S blocks per row (merged through the workspace when S > 1);
// kdt_topk_cluster_<dtype>_v<VT>: S = ROW_CLUSTER blocks per row in one cluster (no workspace).
#define KDT_TOPK_SMALL_ENTRY(NAME, TIN, VT, CLUSTER)                                                          \
    extern "C" __global__ void __launch_bounds__(topk::SMALL_THREADS, topk::SMALL_MIN_BLOCKS) NAME(            \
        const TIN* __restrict__ logits, int* __restrict__ top_ids, float* __restrict__ top_logp,              \
        unsigned char* __restrict__ ws, int vocab, int V, int chunk, int S) {                                 \
        kdt::after_previous_launch();                                                                         \
        topk::small_impl<TIN, VT, CLUSTER>(logits, top_ids, top_logp, ws, vocab, V, chunk, S);                \
    }
#define KDT_TOPK_SMALL(DT, TIN, VT)                                                                           \
    KDT_TOPK_SMALL_ENTRY(kdt_topk_small_##DT##_v##VT, TIN, VT, 1)                                             \
    KDT_TOPK_SMALL_ENTRY(__cluster_dims__(topk::ROW_CLUSTER, 1, 1) kdt_topk_cluster_##DT##_v##VT, TIN, VT,    \
                         topk::ROW_CLUSTER)
// every VT of one dtype
#define KDT_TOPK_SMALL_ALL_VT(DT, TIN)                                                                        \
    KDT_TOPK_SMALL(DT, TIN, 1) KDT_TOPK_SMALL(DT, TIN, 2) KDT_TOPK_SMALL(DT, TIN, 4)                          \
    KDT_TOPK_SMALL(DT, TIN, 8) KDT_TOPK_SMALL(DT, TIN, 16) KDT_TOPK_SMALL(DT, TIN, 32)
KDT_TOPK_SMALL_ALL_VT(f32, float)
KDT_TOPK_SMALL_ALL_VT(bf16, uint16_t)

// kdt_topk_resident_<shape>_<dtype>: one cluster of SHAPE::cluster blocks per row, the chunk in dynamic shared
// memory.
#define KDT_TOPK_RESIDENT(NAME, TIN, SHAPE)                                                                   \
    extern "C" __global__ void __cluster_dims__(SHAPE::cluster, 1, 1)                                         \
        __launch_bounds__(topk::RES_THREADS, SHAPE::min_blocks)                                               \
        NAME(const TIN* __restrict__ logits, int* __restrict__ top_ids, float* __restrict__ top_logp,         \
             int vocab, int V, int chunk) {                                                                   \
        kdt::after_previous_launch();                                                                         \
        topk::resident_impl<TIN, SHAPE>(logits, top_ids, top_logp, vocab, V, chunk);                          \
    }
KDT_TOPK_RESIDENT(kdt_topk_resident_wide_f32, float, topk::ResWide)
KDT_TOPK_RESIDENT(kdt_topk_resident_wide_bf16, uint16_t, topk::ResWide)
KDT_TOPK_RESIDENT(kdt_topk_resident_narrow_f32, float, topk::ResNarrow)
KDT_TOPK_RESIDENT(kdt_topk_resident_narrow_bf16, uint16_t, topk::ResNarrow)

// kdt_topk_general_<dtype>: one block per row.
#define KDT_TOPK_GENERAL(NAME, TIN)                                                                           \
    extern "C" __global__ void __launch_bounds__(topk::GEN_THREADS, 1)                                        \
        NAME(const TIN* __restrict__ logits, int* __restrict__ top_ids, float* __restrict__ top_logp,         \
             int vocab, int V) {                                                                              \
        kdt::after_previous_launch();                                                                         \
        topk::general_impl<TIN>(logits, top_ids, top_logp, vocab, V);                                         \
    }
KDT_TOPK_GENERAL(kdt_topk_general_f32, float)
KDT_TOPK_GENERAL(kdt_topk_general_bf16, uint16_t)

// kdt_topk_gate_<dtype>: one block per row; kdt_topk_gate_split_<dtype>: S blocks per row (columns
// [split * chunk, + chunk) each), the last merging through `ws`. `capacity` buffer entries of dynamic shared memory.
#define KDT_TOPK_GATE(NAME, SPLIT_NAME, TIN)                                                                  \
    extern "C" __global__ void __launch_bounds__(topk::GATE_THREADS, 1)                                       \
        NAME(const TIN* __restrict__ logits, int* __restrict__ top_ids, float* __restrict__ top_logp,         \
             int vocab, int V, int capacity) {                                                                \
        kdt::after_previous_launch();                                                                         \
        topk::gate_impl<TIN, false>(logits, top_ids, top_logp, nullptr, vocab, V, capacity, vocab, 1);        \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(topk::GATE_THREADS, 1)                                       \
        SPLIT_NAME(const TIN* __restrict__ logits, int* __restrict__ top_ids, float* __restrict__ top_logp,   \
                   unsigned char* __restrict__ ws, int vocab, int V, int capacity, int chunk, int S) {        \
        kdt::after_previous_launch();                                                                         \
        topk::gate_impl<TIN, true>(logits, top_ids, top_logp, ws, vocab, V, capacity, chunk, S);               \
    }
KDT_TOPK_GATE(kdt_topk_gate_f32, kdt_topk_gate_split_f32, float)
KDT_TOPK_GATE(kdt_topk_gate_bf16, kdt_topk_gate_split_bf16, uint16_t)
