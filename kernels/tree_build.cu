// kernels/tree_build.cu -- `tree-build`: the best-first draft tree (contract: plans/contracts.md, `tree-build`).
// Design note: plans/kernels/tree-build.md (the algorithm and why it is exact, the select path's proofs, layout).
//
// Contract in brief
//   inputs  top_logp float32 [G, K, V] (rows non-increasing), top_ids int32 [G, K, V]; budget B.
//   outputs n_nodes int32 [G]; parent, depth, token, rank, first_child, next_sibling int32 [G, N]; logw float32
//           [G, N]; mask uint32 [G, N, W] (ancestor-or-self bits), N = B + 1, W = ceil(N / 32). Every element is
//           written. Nodes are taken best-first (score = fl32 sum of log-probs along the path; ties: the smaller
//           parent slot, then the smaller rank) until B are taken or every candidate is -inf.
//
// Entry points: kdt_tree_build_p{NPL}{,_select_narrow,_select_wide,_g,_g_select_wide}, NPL in {1, 2, 4, 8, 16,
//   32} = slots per lane of warp 0, the smallest power of two >= ceil(N / 32). Three paths, same outputs:
//   small   (tree_build/small.cuh)  p1 / p2 without a select pool (cap == 0): B <= 63, warp 0 alone, one or two
//           slots per lane;
//   select  (tree_build/select.cuh) the _select entries only, when every log-prob is <= 0 and the pool does not
//           overflow: the whole block selects the B best paths (best-first is a sort then); _select_narrow up to
//           Vs = 32 (a lane a candidate child), the _select_wide entries past it (the block lays each level out);
//   serial  (tree_build/serial.cuh) everything else: warp 0's best-first loop, one node per step.
//   The plain and _select entries stage every log-prob the build can read (ranks < Vs = min(V, B + 1)); _g (K * V
//   over the budget) reads ranks >= Vs from global memory, serial only; _g_select_wide the same with the select path
//   (the plan stages fewer ranks to leave room for its two-pass scratch). Args cap, cap3: the select pool's
//   capacities (0: no select path; cap > cap3: one-pass layout, cap == cap3: two passes); estimate: whether the
//   wide kind estimates its threshold from the rows before counting (1 from B = kdt_tree_build_select_estimate_
//   min_budget by default).
//
// Launch shape: grid = G blocks (one request each), block = kdt_tree_build_threads (256), no cluster, no
//   workspace. Dynamic shared memory (the launcher computes it from the exported constants, see the note,
//   "Layout"): smem_slot_bytes * 32 NPL + smem_header_bytes + max(2 * staged(K * Vs) [+ select scratch],
//   4 * 8 * 32 * W), at most kdt_tree_build_smem_budget (96 KiB, under sm_120's 99 KiB opt-in limit).
//
// Memory traffic per request: reads the [K, Vs] prefixes of top_logp[g] and top_ids[g] once, coalesced, in one
//   round trip (_g, _g_select_wide: plus single values on demand, from L2); writes 4 + 7 * 4 N + 4 N W bytes, coalesced
//   (the mask through per-warp tiles). Nothing else touches global memory after the prologue (plain and _select
//   entries).
//
// Limits: 1 <= B <= 1023, 1 <= K <= 64, 1 <= V <= 1024, any combination (kdt_tree_build_max_*).

#include "common/ptx.cuh"
#include "tree_build/layout.cuh"
#include "tree_build/serial.cuh"

// Launch constants: kdt build reads them from the cubin, kdt/launch/tree_build.py plans with them; the numbers
// live in tree_build/layout.cuh only.
extern "C" {
__constant__ int kdt_tree_build_threads = kThreads;            // threads per block
__constant__ int kdt_tree_build_smem_budget = kSmemBudget;     // dynamic shared memory target per block (bytes)
__constant__ int kdt_tree_build_smem_slot_bytes = kSlotBytes;  // shared bytes per slot of P = 32 * NPL
__constant__ int kdt_tree_build_smem_header_bytes = kHeaderBytes;  // shared bytes besides slots and region x
__constant__ int kdt_tree_build_max_budget = 1023;             // B limit
__constant__ int kdt_tree_build_max_depth = 64;                // K limit
__constant__ int kdt_tree_build_max_fanout = 1024;             // V limit
__constant__ int kdt_tree_build_select_min_budget = kSelectMinBudget;   // default: select path from this B
__constant__ int kdt_tree_build_select_max_fanout = kSelectMaxFanout;   // select path only for Vs up to this
__constant__ int kdt_tree_build_select_narrow_fanout = kSelectNarrowFanout;   // past this Vs: the wide kind
__constant__ int kdt_tree_build_select_estimate_min_budget = kSelectEstimateMinBudget;  // default: estimate from B
__constant__ int kdt_tree_build_smem_select_fixed_bytes = kSelectFixedBytes;  // select scratch: fixed part
__constant__ int kdt_tree_build_smem_select_bytes_per_cap = kSelectBytesPerCap;  // and per pool entry
__constant__ int kdt_tree_build_smem_select_bytes_per_ranked = kSelectBytesPerRanked;  // and per ranked entry
// Requests built by the select path since the module loaded (one atomic per such block): lets the tests prove
// which path ran, since both give the same outputs.
__device__ unsigned long long kdt_tree_build_select_runs = 0ull;
}

#define KDT_TREE_BUILD_ENTRY(NPL, SUFFIX, PARTIAL, SELECT_KIND)                                                 \
    extern "C" __global__ void __launch_bounds__(kThreads, 1) kdt_tree_build_p##NPL##SUFFIX(                   \
        const float* __restrict__ top_logp, const int* __restrict__ top_ids, int K, int V, int B, int Vs,      \
        int cap, int cap3, int estimate, int* __restrict__ n_nodes, int* __restrict__ parent,                  \
        int* __restrict__ depth,                                                                                \
        int* __restrict__ token, int* __restrict__ rank, float* __restrict__ logw,                              \
        int* __restrict__ first_child, int* __restrict__ next_sibling, uint32_t* __restrict__ mask) {           \
        kdt::after_previous_launch();                                                                           \
        tree_build_body<NPL, PARTIAL, SelectKind::SELECT_KIND>(top_logp, top_ids, K, V, B, Vs, cap, cap3,       \
                                                               estimate != 0, n_nodes, parent, depth, token, rank, \
                                                               logw, first_child, next_sibling, mask);            \
    }

// kdt_tree_build_p{NPL}: the needed [K, Vs = min(V, B + 1)] log-probs fit in shared memory; small path and serial
//   loop only (the launcher offered no select pool).
// kdt_tree_build_p{NPL}_select_narrow, _select_wide: the same with the select path's narrow or wide kind (a pool
//   offered: cap > 0). Separate entries because the select path in the same function makes ptxas compile the
//   serial loop 10-17% slower, and the wide kind beside the narrow one the narrow select up to 5% slower (the
//   note, "Paths and entry points").
// kdt_tree_build_p{NPL}_g: they do not fit (Vs < min(V, B + 1)); ranks >= Vs are read from global memory.
// kdt_tree_build_p{NPL}_g_select_wide: the same with the select path's wide kind (wide fan-out at large B: the
//   staged rows leave room for the two-pass scratch only when part of them stays in global memory).
#define KDT_TREE_BUILD_ENTRIES(NPL)                          \
    KDT_TREE_BUILD_ENTRY(NPL, , false, none)                 \
    KDT_TREE_BUILD_ENTRY(NPL, _select_narrow, false, narrow) \
    KDT_TREE_BUILD_ENTRY(NPL, _select_wide, false, wide)     \
    KDT_TREE_BUILD_ENTRY(NPL, _g, true, none)                \
    KDT_TREE_BUILD_ENTRY(NPL, _g_select_wide, true, wide)
KDT_TREE_BUILD_ENTRIES(1)
KDT_TREE_BUILD_ENTRIES(2)
KDT_TREE_BUILD_ENTRIES(4)
KDT_TREE_BUILD_ENTRIES(8)
KDT_TREE_BUILD_ENTRIES(16)
KDT_TREE_BUILD_ENTRIES(32)
