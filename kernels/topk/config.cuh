// kernels/topk/config.cuh -- topk's compile-time constants: the block shapes of the three paths, the per-arch
// choices (the small path's cp.async ring and blocks per SM, the row cluster size), the limits the launcher checks
// (exported by topk.cu as kdt_topk_*) and the static_asserts that tie the shared-memory layouts to them. Used by
// every entry point. Why each value: plans/kernels/topk.md, "Configuration".
#pragma once

#include <stdint.h>

#include "common/arch.cuh"

namespace topk {

constexpr unsigned FULL = 0xffffffffu;        // every lane of a warp
constexpr float LOG2E = 1.4426950408889634f;
constexpr int VEC_BYTES = 16;                 // one vector: a 16-byte load or copy (float4 / 8 x bf16)

// ---- the contract's limits (every path)
constexpr int MAX_V = 1024;
constexpr int MAX_VOCAB = 1 << 18;
constexpr int ID_BITS = 18;                   // an id fits 18 bits (vocab <= MAX_VOCAB)

// ---- small and cluster paths (kdt_topk_small_*, kdt_topk_cluster_*)
constexpr int SMALL_THREADS = 256;
constexpr int SMALL_WARPS = SMALL_THREADS / 32;
constexpr int SMALL_U = 4;                    // 16-byte loads in flight per thread and step
constexpr int SMALL_USTRIDE = 32;             // vectors between a thread's U vectors of one step (a warp-wide row)
constexpr int SMALL_MAX_V = 32;
// Per arch (the small path's shared memory and loads, the row cluster size):
// SMALL_STAGES: steps in the cp.async ring of dynamic shared memory (0: loads go to registers).
// SMALL_L2_WARMUP: without a ring, steps 1 .. SMALL_L2_WARMUP are prefetched into L2 with step 0's loads (bulk
// prefetches: no registers, no shared memory).
// SMALL_CAPW: per-warp candidate buffer entries; MERGE_CAP: S * VT <= MERGE_CAP (the shared-memory merge buffer).
// ROW_CLUSTER: blocks per row of the cluster path and of the wide resident shape: 8 is the portable cluster size;
// sm_90 runs 16-block clusters (non-portable: the launcher opts the functions in).
#if defined(KDT_SM120_CONFIG) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000)   // sm_100 takes sm_120's
// ~100 KB of shared memory per SM: no room for a ring next to 3 blocks, and 3 blocks of register loads (24 warps
// per SM) beat 2 with a register prefetch. 3 x (<= 30 KB of static shared memory + the 1 KB the system reserves
// per block) fit with the smaller candidate and merge buffers below; <= 80 registers.
constexpr int SMALL_STAGES = 0;
constexpr int SMALL_MIN_BLOCKS = 3;
constexpr int SMALL_L2_WARMUP = 3;
constexpr int SMALL_CAPW = 320;
constexpr int MERGE_CAP = 1024;
constexpr int ROW_CLUSTER = 8;
#else
// 227 KB of shared memory per SM: 3 blocks of 74 KB (41.2 KB static + the 32 KB ring), <= 80 registers
constexpr int SMALL_STAGES = 2;
constexpr int SMALL_MIN_BLOCKS = 3;
constexpr int SMALL_L2_WARMUP = 0;
constexpr int SMALL_CAPW = 384;
constexpr int MERGE_CAP = 2048;
constexpr int ROW_CLUSTER = 16;
#endif
constexpr int SMALL_STAGE_BYTES = SMALL_STAGES * SMALL_U * SMALL_THREADS * VEC_BYTES;
constexpr int SMALL_RING = SMALL_STAGES > 0 ? SMALL_STAGES : 1;    // modulus of the slot index
constexpr int MAX_SPLITS = 128;
constexpr int MAX_CLUSTER = 16;
// Cluster path: block 0's receive slots for the lists lie at s_k/s_i[RECV_BASE ..] (past the block's own warp
// lists), those for the statistics at s_m/s_s[SMALL_WARPS ..].
constexpr int RECV_BASE = 8 * 32;             // SMALL_WARPS * SMALL_MAX_V
constexpr int PRUNED_CAP = SMALL_THREADS;     // survivors pruned_merge ranks by counting (in the candidate buffers)

static_assert((SMALL_RING & (SMALL_RING - 1)) == 0, "slot index = step & (SMALL_RING - 1)");
static_assert(SMALL_MAX_V <= 32, "warp-distributed list needs VT <= 32");
static_assert(RECV_BASE == SMALL_WARPS * SMALL_MAX_V && RECV_BASE + MAX_CLUSTER * SMALL_MAX_V <= MERGE_CAP,
              "cluster receive slots lie past the warp lists, inside s_k/s_i");
static_assert(SMALL_WARPS + MAX_CLUSTER <= MAX_SPLITS, "cluster statistics slots inside s_m/s_s");
static_assert(ROW_CLUSTER <= MAX_CLUSTER, "cluster receive slots");
static_assert(PRUNED_CAP <= SMALL_WARPS * SMALL_CAPW, "pruned_merge's survivors fit the candidate buffers");
static_assert(SMALL_MAX_V + 32 * 8 <= SMALL_CAPW, "a compacted buffer takes a full bf16 vector from every lane");

// ---- resident path (kdt_topk_resident_*)
constexpr int RES_VT = 8;                     // largest V: the block bound is the smallest of >= V warp maxima
constexpr int RES_GROUP = 2;                  // vectors per thread of one bulk copy (one mbarrier) and one
                                              // softmax group: what a block still computes after its last bytes
                                              // land (4: 0.4-0.9 us slower at G=1)
constexpr int RES_THREADS = 256;
constexpr int RES_WARPS = RES_THREADS / 32;
constexpr int RES_SEND_CAP = RES_THREADS / 4; // candidates a block sends as they are (~20 on normal rows, 65 seen)
constexpr int RES_LOCAL_CAP = RES_THREADS;    // more: the block ranks up to this many itself
constexpr int RES_NARROW_CLUSTER = 8;         // the portable cluster size
static_assert(RES_VT <= RES_WARPS, "bounds from RES_VT distinct warp maxima");
static_assert(RES_VT <= RES_SEND_CAP && RES_SEND_CAP <= RES_LOCAL_CAP, "a block sends its top V at most");

// ---- general path (kdt_topk_general_*)
constexpr int GEN_THREADS = 1024;
constexpr int GEN_WARPS = GEN_THREADS / 32;
constexpr int GEN_U = 4;                      // scalar loads in flight per thread
constexpr int GEN_BINS = 2048;                // 11-bit digits
constexpr int COMP_BITS = 32 + ID_BITS;       // the composite key << ID_BITS | reversed id
constexpr uint32_t ID_MASK = (1u << ID_BITS) - 1u;
static_assert(GEN_BINS % GEN_THREADS == 0, "bins per thread");

// ---- gate path (kdt_topk_gate_*): the general path's block, select and sort, one read of the row
constexpr int GATE_THREADS = GEN_THREADS;     // radix_select and sort_and_write run on GEN_THREADS
constexpr int GATE_WARPS = GATE_THREADS / 32;
constexpr int GATE_U = 4;                     // 16-byte vectors in flight per thread and step
// GATE_F32_STAGES: steps of the f32 gate kernel's cp.async ring (dynamic shared memory after the buffer,
// GATE_F32_RING_BYTES), issued that many steps ahead; 0: every step loads into registers (sm_120's 99 KB cannot
// hold a 64 KB step twice). bf16 loads into registers everywhere: at V = 1,024 every warp-vector holds a candidate,
// the kernel is bound by its instructions, and the ring's copies and reads cost 1-2% there (plans/kernels/topk.md).
#if defined(KDT_SMEM_99KB)
constexpr int GATE_F32_STAGES = 0;
#else
constexpr int GATE_F32_STAGES = 2;
#endif
constexpr int GATE_F32_RING_BYTES = GATE_F32_STAGES * GATE_U * GEN_THREADS * VEC_BYTES;
// GATE_BF16_MAXIMA_BYTES: the one-block bf16 gate kernel's vector maxima (dynamic shared memory after the buffer,
// one bf16 a vector, up to 32 a thread; topk/gate_maxima.cuh): the scan keeps every vector's maximum and the gate
// comes from the V-th best of them all, after the scan; then only the vectors that reach it are read again and
// tested. 0: the gate opens at the first step and rises by prunes as the row is read (sm_120's 99 KB cannot hold the
// 64 KB next to the buffer).
#if defined(KDT_SMEM_99KB)
constexpr int GATE_BF16_MAXIMA_BYTES = 0;
#else
constexpr int GATE_BF16_MAXIMA_BYTES = (MAX_VOCAB / 8 / GEN_THREADS) * GEN_THREADS * 2;
#endif
constexpr int GATE_ROOM_PER_V = 4;            // the buffer: GATE_ROOM_PER_V * V entries, at least GATE_MIN_ROOM
constexpr int GATE_MIN_ROOM = 2048;
constexpr int GATE_RANK_BIN = 64;             // the final rank within bins, up to this many a bin
constexpr int GATE_MAX_SPLITS = GATE_WARPS;   // blocks a row may be split over (the merge: one warp reads their records)
// The buffer's entries for V (the launcher sizes the dynamic shared memory by it, 8 bytes an entry, and computes
// the same from the exported constants).
__host__ __device__ constexpr int gate_capacity(int V) {
    return GATE_ROOM_PER_V * V > GATE_MIN_ROOM ? GATE_ROOM_PER_V * V : GATE_MIN_ROOM;
}
constexpr int GATE_MAX_CAPACITY = gate_capacity(MAX_V);
static_assert(MAX_V <= GEN_THREADS, "bitonic sort: one element a thread");
static_assert(GATE_ROOM_PER_V >= 2 && GATE_MIN_ROOM >= 32,
              "the crowded-bin fallback's bitonic sort pads V to a power of two >= 32 inside the buffer");
static_assert(GATE_MAX_CAPACITY % GATE_THREADS == 0, "a prune holds the buffer in registers, whole rows of it");
// the final rank's entries a thread: it ranks at most capacity / 2 (the rest of the buffer is its scratch)
constexpr int GATE_RANK_HELD = GATE_MAX_CAPACITY / (2 * GATE_THREADS);
static_assert(2 * GATE_RANK_HELD * GATE_THREADS >= GATE_MAX_CAPACITY && MAX_V < (1 << 16),
              "the rank holds up to capacity / 2 entries; a bin's start fits 16 bits");
static_assert(GATE_ROOM_PER_V >= 4 && GATE_MIN_ROOM / 2 >= 2 * GATE_RANK_BIN,
              "the rank's scratch after n <= capacity / 2 entries: V + GATE_RANK_BIN - 1 <= capacity / 2");
static_assert(GATE_MIN_ROOM >= 2 * 32 * 8 + 32 && GATE_ROOM_PER_V >= 4,
              "a prune keeps at most 1.5 V: below the mark (min(2 V + 128, capacity / 2)), with room for a warp's "
              "vector");
static_assert(MAX_VOCAB <= (1 << ID_BITS), "an id fits the composite's id field");

}  // namespace topk
