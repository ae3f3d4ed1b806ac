// kernels/tree_build/layout.cuh -- tree-build's constants (block shape, shared-memory budget, the select path's
// scratch sizes; tree_build.cu exports them as kdt_tree_build_* for the launcher), the dynamic shared-memory
// layout and its offsets, and the score keys every path compares. Used by every entry point. See
// plans/kernels/tree-build.md, "Layout" and "Keys".
#pragma once

#include <stdint.h>

#include "common/bits.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kLp0Len = 72;       // lp0[d] = top_logp[g, d, 0] for d < K, -inf for K <= d < 72 (d <= 65 is read)
constexpr int kMiscInts = 8;      // misc[0] = n_nodes
constexpr int kSlotBytes = 28;    // shared bytes per slot of P (see the layout below)
constexpr int kHeaderBytes = 4 * kLp0Len + 4 * kMiscInts;
constexpr int kSmemBudget = 98304;   // 96 KiB: under sm_120's 99 KiB opt-in limit

// Which select kind an entry holds (each its own entries: ptxas compiles each kind as if the other did not exist).
enum class SelectKind { none, narrow, wide };

// Select path (tree_build/select.cuh): the sizes of its scratch in region x, and when the launcher offers it.
constexpr int kBins = 2048;                 // score bins (see score_bin)
constexpr int kSelectMinBudget = 64;        // default: serial faster at B = 32, select at B = 64 (perf-notes)
constexpr int kSelectEstimateMinBudget = 512;   // default: the wide kind estimates its threshold from this B
constexpr int kSelectItems = 8;             // phase 2: nodes per thread per pass, at most (two (item, warp) counts a lane)
constexpr int kSelectVars = 8;              // scalars of the select scratch (the last one: the root's key)
constexpr int kSelectInts = 2 * kBins + 2 * kWarps * kSelectItems + kSelectVars;   // hist, offs, pass counts, scalars
constexpr int kSelectFixedBytes = 4 * kSelectInts;
constexpr int kSelectBytesPerCap = 12;      // per pool entry: key, link, slot
constexpr int kSelectBytesPerRanked = 8;    // per ranked entry: sorted index and key (two passes: cap == cap3)
constexpr int kSelectNarrowFanout = 32;     // up to this Vs a node's candidate children are lanes of one group;
                                            // above, the block lays out each level (select.cuh, wide)
constexpr int kSelectMaxFanout = 1024;      // the launcher offers the select path up to this Vs
static_assert(kBins % kThreads == 0 && kBins % 32 == 0, "bin layout");
static_assert(kWarps * kSelectItems == 64, "phase 2 scans at most two (item, warp) counts a lane");

// Shared-memory layout (bytes), P = 32 * NPL slots per array. All offsets are multiples of 16.
//   ent   uint2[P]   loop: (key, pay) of entry q          finalize: (in-block ancestor bits, block exit)
//   logw  float[P]   score of slot q (root 0.0)
//   last  int[P]     last child slot taken under q
//   rec   int[P]     parent << 16 | rank << 6 | depth - 1 of slot q (the winner's pay)
//   fc    int[P]     first child (-1)
//   ns    int[P]     next sibling (-1); directly after fc, so fc_s[P + i] is ns_s[i]
//   lp0   float[72]  top_logp[g, d, 0] (-inf for d >= K)          misc int[8]: misc[0] = n_nodes
//   x     region:    build: lp, ids, select scratch (below)     finalize: mask tiles uint32[kWarps][32 * W]
// The small path uses part of the p1 layout differently (tree_build/small.cuh).
__device__ constexpr int off_logw(int P) { return 8 * P; }
__device__ constexpr int off_last(int P) { return 12 * P; }
__device__ constexpr int off_rec(int P) { return 16 * P; }
__device__ constexpr int off_fc(int P) { return 20 * P; }
__device__ constexpr int off_ns(int P) { return 24 * P; }   // right after fc: fc_s[P + i] == ns_s[i]
__device__ constexpr int off_lp0(int P) { return 28 * P; }
__device__ constexpr int off_misc(int P) { return 28 * P + 4 * kLp0Len; }
__device__ constexpr int off_x(int P) { return kSlotBytes * P + kHeaderBytes; }
static_assert(off_lp0(1) == kSlotBytes && off_misc(1) + 4 * kMiscInts == off_x(1), "layout");
static_assert(kHeaderBytes % 16 == 0, "region x must stay 16-byte aligned");
// Region x, build phase: lp float[K][Vs], ids int[K][Vs], each padded to 16 bytes, then the select scratch.
__device__ constexpr int staged_bytes(int K, int Vs) { return (4 * K * Vs + 15) / 16 * 16; }

// Order-preserving key of a score; -inf and NaN -> 0 ("dead / no entry"). Every other float maps above 0, and
// only -0.0 / +0.0 share a key (a score is never -0.0): see the note, "Keys".
__device__ __forceinline__ uint32_t score_key(float x) {
    const uint32_t k = kdt::ordered_key(x);
    return (x > -INFINITY) ? k : 0u;
}

// Inverse of score_key for keys > 0.
__device__ __forceinline__ float key_score(uint32_t k) { return kdt::ordered_float(k); }

}  // namespace
