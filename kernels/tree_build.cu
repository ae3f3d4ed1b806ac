// kernels/tree_build.cu -- `tree-build`: the best-first draft tree (contract: plans/contracts.md, `tree-build`).
//
// Launch shape
//   grid = G blocks, one request each; block = kdt_tree_build_threads (256). Each block builds its tree on one of
//   three paths, which give identical outputs, then writes the outputs (the finalize). No workspace; every
//   output element is written.
//     small path (warp 0 alone after the staging): kdt_tree_build_p1 (B <= 31) when the launcher offered no
//       select pool (cap == 0, the default below the select threshold): the best-first loop with one slot per
//       lane, software-pipelined, and a warp-only finalize (see "Small path").
//     select path (the whole block): when every log-prob of the request is <= 0, the launcher gave it a pool
//       (B >= the select threshold, Vs = min(V, B + 1) <= 32, the scratch fits), and the pool does not overflow.
//     serial path (warp 0): the best-first loop, for everything else (positive log-probs, wide V, and B <= 63
//       beyond the small path's 31).
//   Entry points kdt_tree_build_p{NPL}, kdt_tree_build_p{NPL}_select and kdt_tree_build_p{NPL}_g, NPL in
//   {1, 2, 4, 8, 16, 32}: NPL is the number of slots each lane of warp 0 owns, the smallest power of two >=
//   ceil(N / 32) (N = B + 1). The plain and _select variants have every log-prob and id the build can read
//   (ranks < min(V, B + 1)) staged in shared memory; only _select contains the select path (the launcher uses it
//   when it offers a pool, cap > 0); the _g variant (only when K * V is too big for the budget, e.g. K = 64,
//   V = 1024, B = 1023) reads ranks >= Vs from global memory and always takes the serial path. Arguments cap,
//   cap3: the select pool's capacities (0: serial path only); cap > cap3 is the one-pass layout, cap == cap3 the
//   two-pass one (see select_build).
//   Dynamic shared memory, computed the same way by the launcher (kdt/launch/tree_build.py) from the exported
//   constants:
//     smem_slot_bytes * P + smem_header_bytes + max(x_build, 4 * 8 warps * 32 * W),   P = 32 * NPL,
//     x_build = 2 * staged(K * Vs) + [select: smem_select_fixed_bytes + 12 * cap + 8 * cap3],
//     W = ceil(N / 32), Vs = min(V, B + 1, (smem_budget - smem_slot_bytes * P - smem_header_bytes - 32) / (8 K)),
//     staged(n) = 4 n rounded up to 16 bytes.
//   The budget (96 KiB) stays under sm_120's 99 KiB opt-in limit. No path reads global memory after the
//   prologue in the plain variant. The prologue (stage_logprobs) issues each thread's loads before its stores,
//   so the block waits for one memory round trip, not two.
//
// Memory traffic per request
//   reads  top_logp[g], top_ids[g]: the [K, Vs] prefixes once, coalesced (plus, _g only, single values gathered
//          on demand).
//   writes n_nodes (4 B); parent, depth, token, rank, logw, first_child, next_sibling (7 x 4 x N B, coalesced);
//          mask (4 x N x W B, coalesced through a per-warp staging tile).
//
// Limits: 1 <= B <= 1023, 1 <= K <= 64, 1 <= V <= 1024, any combination (V = B included).
//
// Algorithm, and why it is exact
//   The frontier holds at most ONE candidate per parent slot q: q's next untaken rank r ("entry q"), with score
//   fl32(logw[q] + top_logp[g, D(q), r]) (D = depth, root 0; logw[root] = +0.0), one __fadd_rn per add and never
//   a subtraction, as the contract says. The candidates of one parent come out in rank order because the rows are
//   non-increasing and rounding is monotone (x >= y implies fl(a + x) >= fl(a + y)); so "highest score, then
//   smaller parent slot, then smaller rank" over all candidates is "highest score, then smaller parent slot" over
//   the entries. A step takes the best entry q at rank r; it becomes slot s = step; entry q moves to rank r + 1
//   (none at r + 1 == V) and entry s is born at rank 0 (only if D(s) < K). This holds for any float input,
//   positive log-probs included: nothing assumes scores fall along a path.
//   -inf: once an entry's score is -inf it stays -inf at every later rank (monotone again), and a -inf candidate
//   is never taken, so such an entry is dead. The build stops when no live entry is left (every remaining
//   candidate is -inf, or none remains) or after B steps: exactly the contract's stopping rule.
//
//   Keys. Scores are compared as score_key(x): the float's bits mapped to an order-preserving uint32 (negative:
//   ~bits, else bits | 0x80000000), -inf (and NaN) mapped to 0, which also means "no entry". Non-NaN floats get
//   distinct keys except -0.0 / +0.0, and a score is never -0.0 (logw[root] is +0.0, and in round-to-nearest
//   a + b is -0.0 only when both are), so key order is score order, equal keys are equal scores, and key_score()
//   recovers the winner's score bit for bit.
//
//   Ownership. Slot q belongs to lane q % 32 of warp 0 (its entry index q / 32). Entry q lives in shared memory
//   at index q as (key, pay), pay = q << 16 | rank << 6 | D(q). Every per-slot array the loop uses is read and
//   written only by the owning lane (links into next_sibling excepted: written, read only after the loop), so
//   the loop needs no __syncwarp; lanes exchange data only through warp collectives. In registers each lane
//   keeps its best entry (bkey, bpay: largest key, then smallest slot), the key of the child entry its best
//   would create if taken (bchild), and for NPL >= 8 the best of each group of GS entries (gk, gp), so that a
//   rescan reads one group (GS = NPL up to 4, then 4, and 8 for NPL = 32).
//
//   One step:
//     m  = __reduce_max_sync(bkey): the best score; 0 stops the build.
//     the winner lane: the one lane with bkey == m (ballot, find-first-set) or, on tied scores,
//        __reduce_min_sync(bkey == m ? bpay : ~0) (slots are unique and sit in pay's top bits: smallest slot).
//     w = shfl(bpay), ck = shfl(bchild) from the winner: parent p, rank r, depth of s, and entry s's key.
//     every lane also computes its "spec": its best if its best entry were the one taken (that entry advanced,
//        then the max over its group and the other groups), from shared-memory values loaded at the end of the
//        previous step, so the work overlaps the collectives' latency.
//     winner lane: best := spec; stores the advanced entry p; links s as first_child[p] or after p's previous
//        child (next_sibling); owner lane of s: records parent/rank/depth/logw of s, stores entry s and folds it
//        into its best (s is its largest slot, so it wins only with a strictly larger key).
//     both then load what their next spec needs (their best's group, logw, next log-prob) and compute bchild.
//   Ties: inside a lane every max keeps the smaller slot on equal keys; across lanes the winner is the smallest
//   slot. So the taken order is exactly the contract's.
//
//   Select path: if every log-prob is <= 0, a child never outscores its parent and rank r + 1 never outscores
//   rank r (a + b <= a for b <= 0, and rounding is monotone). Then the best-first order is the sort of all paths
//   by (score descending; equal scores: the parent's position, compared the same way up the two ancestor chains;
//   then the rank), and the tree is its first B paths (plans/design.md has the argument). The select path finds
//   them without a step per node:
//     bins   a score <= 0 falls in one of kBins bins by bits 30..16 of its float (exponent and 7 mantissa bits);
//            bins are non-decreasing in the score.
//     phase 1, level by level (depth 1, 2, ...): every child of a node of the previous level whose bin is at
//            least the threshold bin bstar is counted in a histogram; then bstar rises to the highest bin with at
//            least B counted paths in it or above. Counted paths are real paths, so the B-th best path has a bin
//            >= bstar, and a path below bstar, with its descendants and later siblings, is not among the B best.
//            The work follows the nodes that can still have a counted child: each warp lists those of its share of
//            the level (a node has one iff its rank-0 child counts: the others score no higher), then passes over
//            its own list with 1..kSelectItems1 nodes per lane, as many as the list needs, so dead nodes and small
//            levels cost (nearly) nothing; every warp then moves bstar itself from the same histogram, with two
//            barriers per level. Listing and the split among warps only decide where in the pool a counted child
//            lands, not what is counted; phase 3 reads the pool's contents, not its order (beyond each node's
//            children being adjacent in rank order), and the order already depended on the warps' atomics.
//            One-pass layout: the counted paths are appended to the pool (score key, parent entry, rank, depth),
//            a node's children contiguous and in rank order. Two-pass layout (when the pool would not fit next
//            to 1024 slots): phase 1 keeps only each level's scores, and phase 2 walks the levels again to
//            materialise just the paths with bin >= the final bstar, in the same order.
//     phase 3: the paths with bin >= bstar (at least B unless fewer finite paths exist; about B + 5% on drafter
//            inputs) are grouped by bin; a path's position is the count in higher bins plus the paths of its own
//            bin with a larger key (equal keys: the ancestor-chain comparison). Positions < B are the slots; the
//            records the finalize reads (parent slot, rank, depth, score, first_child, next_sibling: the previous
//            sibling is the entry just before) are written exactly as the serial loop leaves them.
//   Scores are the same __fadd_rn sums along the same paths, so logw is bit-identical; a capacity overflow
//   falls back (one pass -> two passes -> serial loop) before any record is written.
//
//   Small path (B <= 31, kdt_tree_build_p1 without a select pool): the same algorithm with slot q on lane q, so
//   each lane holds at most one entry and "smallest slot" is "lowest lane". The serial loop spends ~385 cycles
//   a step (perf-notes): its chain runs REDUX -> ballot -> ffs -> shuffle of the winner's data -> fold ->
//   branches with stores -> loads for the next spec -> REDUX. Here one step's chain is
//     R = REDUX.max(key) -> m = max(R, c) -> key == m -> ballot -> (ballot & lanes below) -> select -> REDUX
//   and everything else is off it:
//     - the newborn's entry key c (slot s - 1, lane s - 1) comes from last step's shuffle; lane s - 1 still
//       holds 0 in this step's REDUX and c joins through the max (ties: the existing, smaller slot wins, as the
//       lowest-lane rule gives), so that shuffle overlaps the REDUX instead of preceding it;
//     - every lane precomputes what a take of its entry hands out: its next-rank key (adv, from a prefetched
//       log-prob), and for the child it would create the keys at ranks 0 and 1 (ck, ca) and that child's
//       lp0 / lp1 values (gl0, gl1), so the newborn needs no shared-memory load before it can win;
//     - the bookkeeping of step s - 1 (apply: the winner's next adv, the newborn's fields, ck / ca / nxt / gl
//       recomputed branch-free on every lane) is issued after step s's REDUX, inside its latency;
//     - no per-step stores: parent, depth, logw and ancestor mask live in the lanes' registers; rank, first
//       child and next sibling come from __match_any_sync over the parents in the finalize (siblings are taken
//       in rank order); steps run in groups of kSmallUnroll in one basic block (steps past B, and steps after
//       one that found no live entry, are no-ops), with one exit test per group.
//   Warps 1..7 leave after the staging barrier; warp 0 writes every output (N <= 32, one mask word per row).
//
//   Finalize (whole block): the per-slot outputs from the loop's records; mask rows from, for each slot j, the
//   bits of j's ancestors-or-self inside j's 32-slot word (pointer jumping with shuffles) and j's first ancestor
//   below that word: a row follows these exits (one step per nonzero word) into a zeroed per-warp tile, which the
//   warp then copies out coalesced.

#include <cstdint>

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

// Select path (see "Select path" above). Score bins: bits 30..16 of a non-positive score (its exponent and 7
// mantissa bits, relative width 1/128) for |score| in [2^-4, 2^12); smaller magnitudes share the top bin, larger
// ones bin 0. Bins are non-decreasing in the score, which is all the pruning needs.
constexpr int kBins = 2048;
constexpr uint32_t kBinLow = 123u << 7;     // bits 30..16 of 2^-4
constexpr int kSelectMinBudget = 64;        // default: serial faster at B = 32, select at B = 64 (perf-notes)
constexpr int kSelectItems1 = 8;           // phase 1: at most this many nodes per lane in one pass of a warp
constexpr int kSelectItems = 4;            // phase 2: nodes per thread per pass (one (item, warp) count per lane)
constexpr int kSelectListChunks = 4;       // phase 1: 32-node chunks a warp tests per step when it lists a level
constexpr int kSelectRows = 4;             // rows of 32 bins a warp sums at once when it moves the threshold
constexpr int kSelectVars = 8;             // scalars of the select scratch (the last one: the root's key)
constexpr int kSelectInts = 2 * kBins + 2 * kWarps * kSelectItems + kSelectVars;   // hist, offs, pass counts, scalars
constexpr int kSelectFixedBytes = 4 * kSelectInts;
constexpr int kSelectBytesPerCap = 12;      // per pool entry: key, link, slot
constexpr int kSelectBytesPerRanked = 8;    // per ranked entry: sorted index and key (two passes: cap == cap3)
constexpr int kSelectMaxFanout = 32;        // candidate children of a node: lanes of one warp
static_assert(kBins % kThreads == 0 && kBins % 32 == 0, "bin layout");
static_assert(kWarps * kSelectItems == 32, "phase 2 scans one (item, warp) count per lane");

}  // namespace

// Read once by the launcher (module.get_global); the numbers live here only.
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
__constant__ int kdt_tree_build_smem_select_fixed_bytes = kSelectFixedBytes;  // select scratch: fixed part
__constant__ int kdt_tree_build_smem_select_bytes_per_cap = kSelectBytesPerCap;  // and per pool entry
__constant__ int kdt_tree_build_smem_select_bytes_per_ranked = kSelectBytesPerRanked;  // and per ranked entry
// Requests built by the select path since the module loaded (one atomic per such block): lets the tests prove
// which path ran, since both give the same outputs.
__device__ unsigned long long kdt_tree_build_select_runs = 0ull;
}

namespace {

// Shared-memory layout (bytes), P = 32 * NPL slots per array. All offsets are multiples of 16.
//   ent   uint2[P]   loop: (key, pay) of entry q          finalize: (in-block ancestor bits, block exit)
//   logw  float[P]   score of slot q (root 0.0)
//   last  int[P]     last child slot taken under q
//   rec   int[P]     parent << 16 | rank << 6 | depth - 1 of slot q (the winner's pay)
//   fc    int[P]     first child (-1)
//   ns    int[P]     next sibling (-1); directly after fc, so fc_s[P + i] is ns_s[i]
//   lp0   float[72]  top_logp[g, d, 0] (-inf for d >= K)          misc int[8]: misc[0] = n_nodes
//   x     region:    loop: lp float[K][Vs]     finalize: mask tiles uint32[kWarps][32 * W]
__host__ __device__ constexpr int off_logw(int P) { return 8 * P; }
__host__ __device__ constexpr int off_last(int P) { return 12 * P; }
__host__ __device__ constexpr int off_rec(int P) { return 16 * P; }
__host__ __device__ constexpr int off_fc(int P) { return 20 * P; }
__host__ __device__ constexpr int off_ns(int P) { return 24 * P; }   // right after fc: fc_s[P + i] == ns_s[i]
__host__ __device__ constexpr int off_lp0(int P) { return 28 * P; }
__host__ __device__ constexpr int off_misc(int P) { return 28 * P + 4 * kLp0Len; }
__host__ __device__ constexpr int off_x(int P) { return kSlotBytes * P + kHeaderBytes; }
static_assert(off_lp0(1) == kSlotBytes && off_misc(1) + 4 * kMiscInts == off_x(1), "layout");
static_assert(kHeaderBytes % 16 == 0, "region x must stay 16-byte aligned");
// Region x, build phase: lp float[K][Vs], ids int[K][Vs], each padded to 16 bytes, then the select scratch.
__host__ __device__ constexpr int staged_bytes(int K, int Vs) { return (4 * K * Vs + 15) / 16 * 16; }

// Order-preserving key of a score; -inf and NaN -> 0 ("dead / no entry"). Every other float maps above 0.
__device__ __forceinline__ uint32_t score_key(float x) {
    const uint32_t k = kdt::ordered_key(x);
    return (x > -INFINITY) ? k : 0u;
}

// Inverse of score_key for keys > 0.
__device__ __forceinline__ float key_score(uint32_t k) { return kdt::ordered_float(k); }

// In-register tournament over n (key, pay) pairs listed in increasing slot order: the result (index 0) has the
// largest key; equal keys keep the earlier (smaller-slot) pair.
template <int n>
__device__ __forceinline__ void argmax_pairs(uint32_t (&k)[n], uint32_t (&p)[n]) {
#pragma unroll
    for (int stride = 1; stride < n; stride *= 2) {
#pragma unroll
        for (int j = 0; j + stride < n; j += 2 * stride) {
            const bool take = k[j + stride] > k[j];
            k[j] = take ? k[j + stride] : k[j];
            p[j] = take ? p[j + stride] : p[j];
        }
    }
}

// ---- select path ------------------------------------------------------------------------------------------------

// Bin of a score <= 0 (see kBins); non-decreasing in the score.
__device__ __forceinline__ int score_bin(float s) {
    uint32_t u = (__float_as_uint(s) >> 16) & 0x7fffu;
    u = min(max(u, kBinLow), kBinLow + (uint32_t)(kBins - 1));
    return kBins - 1 - (int)(u - kBinLow);
}

// Phase 1 counts a path of score c <= 0 when c > -inf and score_bin(c) >= bstar: iff c > counted_floor(bstar),
// one float compare. For bstar >= 1, with u = bits 30..16 of c and T = kBinLow + kBins - 1 - bstar (>= kBinLow):
// score_bin(c) >= bstar iff clamp(u) <= T iff u <= T (a u below kBinLow clamps up to kBinLow <= T; a u above
// the top bin clamps down to it, which is > T) iff c's magnitude bits are < M = (T + 1) << 16 iff |c| < the
// float of bits M (finite, and positive floats order as their bits) iff c > -that float; -inf and NaN compare
// false. For bstar == 0 every bin counts and the floor is -inf, the test of the original c > -inf.
__device__ __forceinline__ float counted_floor(int bstar) {
    return bstar == 0 ? -INFINITY : -__uint_as_float((kBinLow + (uint32_t)(kBins - bstar)) << 16);
}

// score_bin(c) of a counted c (<= 0, finite) without masking the sign: score_bin(c) == kBinOfCode -
// counted_bin_code(c). The sign bit of a negative c (-0.0 included) sits in bit 15 of bits >> 16, so those are
// 0x8000 | u, and the clamp to [0x8000 | kBinLow, 0x8000 | (kBinLow + kBins - 1)] is 0x8000 | clamp(u); +0.0 (bits
// 0) clamps to 0x8000 | kBinLow like u = 0 does. Larger codes are lower bins. (The upper clamp matters only for
// bstar == 0, which counts every finite score, |c| >= 2^12 included.)
constexpr uint32_t kSignedBinLow = 0x8000u | kBinLow;
constexpr int kBinOfCode = kBins - 1 + (int)kSignedBinLow;
__device__ __forceinline__ uint32_t counted_bin_code(float c) {
    return min(max(__float_as_uint(c) >> 16, kSignedBinLow), kSignedBinLow + (uint32_t)(kBins - 1));
}

// *address += 1 when `add` (a shared-memory address): one predicated reduction, so a warp's items need no branch.
__device__ __forceinline__ void shared_add_if(uint32_t address, bool add) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %1, 0;\n\t@p red.shared.add.u32 [%0], 1;\n\t}"
                 :: "r"(address), "r"((uint32_t)add) : "memory");
}

// *p = value when `store` (p in shared memory), as one predicated store: the compiler branches around a plain
// `if`, which costs a branch and a convergence barrier per item.
__device__ __forceinline__ void shared_store_if(const void* p, uint32_t value, bool store) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %2, 0;\n\t@p st.shared.u32 [%0], %1;\n\t}"
                 :: "r"((uint32_t)__cvta_generic_to_shared(p)), "r"(value), "r"((uint32_t)store) : "memory");
}

// Exclusive prefix sum over the block in thread order; `total` gets the block's sum. Uses wsum[kWarps] and two
// barriers; the caller must pass a barrier before the next call rewrites wsum.
__device__ __forceinline__ int block_exclusive_scan(int v, int* wsum, int& total) {
    const int lane = (int)threadIdx.x & 31;
    const int warp = (int)threadIdx.x >> 5;
    const int incl = kdt::warp_inclusive_scan(v);
    if (lane == 31) wsum[warp] = incl;
    __syncthreads();
    int base = 0;
    total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
        const int t = wsum[w];
        base += (w < warp) ? t : 0;
        total += t;
    }
    return base + incl - v;
}

// Pool entry link: (parent pool index + 1, 0 for the root) << 16 | rank << 6 | depth - 1.
__device__ __forceinline__ int link_parent(uint32_t link) { return (int)(link >> 16) - 1; }
__device__ __forceinline__ int link_rank(uint32_t link) { return (int)((link >> 6) & 1023u); }

// Whether pool entry f comes before entry e in the best-first order: higher score, then (equal scores) the
// earlier parent, compared the same way up the two ancestor chains, then the smaller rank. Bounded by the depth.
__device__ __forceinline__ bool select_before(const uint32_t* key, const uint32_t* link, int f, int e) {
    if (key[f] != key[e]) return key[f] > key[e];
    for (;;) {
        const uint32_t lf = link[f], le = link[e];
        const int pf = link_parent(lf), pe = link_parent(le);
        if (pf == pe) return link_rank(lf) < link_rank(le);
        if (pf < 0) return true;      // the root precedes every slot
        if (pe < 0) return false;
        if (key[pf] != key[pe]) return key[pf] > key[pe];
        f = pf;
        e = pe;
    }
}

// Select scratch scalars (var[]). The pool's keys start right after them, so key[-1] is var[kVarRootKey].
enum SelectVar : int {
    kVarNext = 0,                       // phase 1: counter of the paths counted so far (keep: the pool's size)
    kVarOverflow = 1,                   // phase 1: a capacity was exceeded
    kVarLowBin = 2,                     // phase 1: the lowest bin any counted path has
    kVarRootKey = kSelectVars - 1,      // keep: score_key(0.0f), the root's key read as key[-1]
};

// What one warp's phase-1 passes over a level need (see select_build). Each lane handles one rank of `stride`
// nodes per item: list positions base + k * stride + lane_node, k < items.
struct SelectLevel {
    const int* list;        // keep: each listed node's pool entry + 1 (0: the root, its key at key[-1])
    const float* scores;    // !keep: each listed node's score
    uint32_t* key;          // keep: the pool's keys (the listed nodes' are read, the children's written)
    uint32_t* link;         // keep: the pool's links (the children's are written)
    float* child_scores;    // !keep: the next level's scores, at counter position - child_lo
    int* hist;
    int* var;
    int end;                // this warp's list ends before this position
    int stride;             // nodes per item of a warp: 32 / group
    int lane_node;          // this lane's node in an item: lane / group
    float lp;               // top_logp[g, d, rank] (-inf for rank >= V)
    float count_floor;      // counted_floor(bstar): a child counts iff its score is above
    uint32_t link_low;      // rank << 6 | d: a child's link without its parent
    int child_lo;           // var[kVarNext] before this level's passes
    int child_cap;          // the counter may reach this (keep: cap; !keep: child_lo + 2 * cap)
    uint32_t lanes_below;   // lanes below this lane
};

// lop3 truth table of a ^ (~b | c), from the operand tables a = 0xf0, b = 0xcc, c = 0xaa.
constexpr uint32_t kLop3KeyToBits = (0xf0u ^ (~0xccu | 0xaau)) & 0xffu;

// key_score(k) of a pool key in two instructions (kdt::ordered_float selects between two masks): a key with the
// top bit set is a score >= +0.0 (bits = k ^ 0x80000000), any other a negative score (bits = ~k); the mask is
// ~(k >> 31, arithmetic) | 0x80000000 in both cases. Same bits as key_score for every k.
__device__ __forceinline__ float pool_score(uint32_t k) {
    const uint32_t sign = (uint32_t)((int32_t)k >> 31);
    uint32_t bits;          // k ^ (~sign | 0x80000000), as one LOP3 (the compiler splits it in two)
    asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(bits) : "r"(k), "r"(sign), "n"(0x80000000u), "n"(kLop3KeyToBits));
    return __uint_as_float(bits);
}

// One phase-1 pass of a warp over kItems nodes per lane of its list, starting at position `base`. Branch-free
// inside, so all items' loads are in flight at once: positions past the list's end are clamped into it (the
// loads stay in the list) and their lanes masked. Every child whose path counts (bin >= bstar) goes into the
// histogram and, at the warp's place given by one atomic on the counter, into the pool (keep: key, link) or the
// next level's scores (!keep); a node's children land contiguous and in rank order (lanes of one group). The
// items go through the steps in separate loops (loads, votes, histogram, stores) so each step's instructions of
// all items issue back to back.
template <int kItems, bool kKeep>
__device__ __forceinline__ void select_count_pass(const SelectLevel& v, int base) {
    const int lane = (int)threadIdx.x & 31;
    const int first = base + v.lane_node;      // this lane's position at item 0
    float s[kItems];
    uint32_t parent[kItems];                   // keep: the node's pool entry + 1
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
        const int p = min(first + k * v.stride, v.end - 1);
        if constexpr (kKeep) {
            parent[k] = (uint32_t)v.list[p];
            s[k] = pool_score(v.key[(int)parent[k] - 1]);
        } else {
            parent[k] = 0u;
            s[k] = v.scores[p];
        }
    }
    float c[kItems];
    uint32_t votes[kItems];
    int count = 0;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
        c[k] = __fadd_rn(s[k], v.lp);
        votes[k] = __ballot_sync(kFull, first + k * v.stride < v.end && c[k] > v.count_floor);
        count += __popc(votes[k]);
    }
    // The warp's place on the counter first: its round trip overlaps the histogram's reductions.
    int at = 0;
    if (lane == 0 && count != 0) at = atomicAdd(&v.var[kVarNext], count);
    // hist[score_bin(c)] += 1 for each counted child; address = hist_top - 4 * counted_bin_code(c).
    const uint32_t hist_top = (uint32_t)__cvta_generic_to_shared(v.hist) + 4u * (uint32_t)kBinOfCode;
    uint32_t low_code = 0u;     // the largest bin code (the lowest bin) of this lane's counted children; 0: none
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
        const bool ok = (votes[k] >> lane) & 1u;
        const uint32_t code = counted_bin_code(c[k]);      // meaningful only when ok
        shared_add_if(hist_top - 4u * code, ok);
        low_code = (ok && code > low_code) ? code : low_code;
    }
    low_code = __reduce_max_sync(kFull, low_code);
    if (lane == 0 && count != 0) atomicMin(&v.var[kVarLowBin], kBinOfCode - (int)low_code);
    at = __shfl_sync(kFull, at, 0);
    // The warp's children take counter positions [at, at + count). Past the capacity the attempt is abandoned at
    // the end of the level (a fallback follows), so the warp stores nothing.
    if (at + count > v.child_cap) {
        if (lane == 0) v.var[kVarOverflow] = 1;
        return;
    }
    int e = kKeep ? at : at - v.child_lo;      // keep: pool index; !keep: index in the next level's scores
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
        const int mine = e + __popc(votes[k] & v.lanes_below);
        const bool ok = (votes[k] >> lane) & 1u;
        if constexpr (kKeep) {
            // == score_key(c[k]): a counted score is finite
            shared_store_if(&v.key[mine], kdt::ordered_key(c[k]), ok);
            shared_store_if(&v.link[mine], (parent[k] << 16) + v.link_low, ok);
        } else {
            shared_store_if(&v.child_scores[mine], __float_as_uint(c[k]), ok);
        }
        e += __popc(votes[k]);
    }
}

// Lists this warp's share [lo, hi) of a level's nodes (keep: pool entries node_lo + j, j the level position;
// !keep: scores cur[j]) that have a counted child, at list positions lo, lo + 1, ...; returns how many. A node
// has one iff its rank-0 child counts: ranks are non-increasing and rounding is monotone, so a rank-r child
// scores no higher than the rank-0 one, and both the bin and -inf tests are monotone (same computation as the
// pass). The dropped nodes would count nothing, so the passes over the list count exactly what passes over the
// whole level would. keep: list[q] = entry + 1. !keep: in place in cur (a node moves to a position <= its own,
// and a step reads all its positions before any lane writes).
template <bool kKeep>
__device__ __forceinline__ int select_list_level(const uint32_t* key, int node_lo, float* cur, int* list, int lo,
                                                 int hi, float lp_rank0, float count_floor, uint32_t lanes_below) {
    const int lane = (int)threadIdx.x & 31;
    int listed = 0;
    for (int j0 = lo; j0 < hi; j0 += 32 * kSelectListChunks) {
        float s[kSelectListChunks];
#pragma unroll
        for (int u = 0; u < kSelectListChunks; ++u) {
            const int j = min(j0 + 32 * u + lane, hi - 1);
            s[u] = kKeep ? pool_score(key[node_lo + j]) : cur[j];
        }
        __syncwarp();       // !keep: every lane has read this step's positions before any lane writes
#pragma unroll
        for (int u = 0; u < kSelectListChunks; ++u) {
            const int j = j0 + 32 * u + lane;
            const bool useful = j < hi && __fadd_rn(s[u], lp_rank0) > count_floor;
            const uint32_t ballot = __ballot_sync(kFull, useful);
            if (useful) {
                const int q = lo + listed + __popc(ballot & lanes_below);
                if constexpr (kKeep) list[q] = node_lo + j + 1;
                else cur[q] = s[u];
            }
            listed += __popc(ballot);
        }
    }
    __syncwarp();           // the list is visible to every lane of the warp
    return listed;
}

// The select path; all threads call it (see "Select path" above). V (the staged ranks) is at most 32: a node's
// candidate children are the lanes of one group of `group` lanes (the power of two >= V), so a node's children
// come out contiguous and in rank order. Two layouts of the scratch:
//   kKeep (one pass over the levels): phase 1 appends every path it counts to the pool (key, link), up to `cap`
//     entries, and phase 3 ranks those with bin >= bstar (at most `cap3`);
//   !kKeep (two passes): phase 1 only counts, with two level buffers of 2 * cap scores; phase 2 materialises the
//     paths with bin >= bstar (at most cap; cap3 == cap).
// Returns false, having written nothing the serial loop reads, when a capacity is exceeded.
// Not inlined: one copy per layout, called once per block (inlined, the select path measured ~1 us slower at
// B = 128..1023 on the H200).
template <bool kKeep>
__device__ __noinline__ bool select_build(const float* __restrict__ lp_s, int K, int V, int B, int cap, int cap3,
                                             int* __restrict__ scratch, int* __restrict__ rec_s,
                                             float* __restrict__ logw_s, int* __restrict__ fc_s,
                                             int* __restrict__ ns_s, int* __restrict__ misc) {
    int* const hist = scratch;                          // [kBins] paths per bin (phase 1), then a cursor
    int* const offs = hist + kBins;                     // [kBins] ranked entries in higher bins
    int* const wsum = offs + kBins;                     // [2][32] per-(item, warp) counts, double-buffered
    int* const var = wsum + 2 * kWarps * kSelectItems;  // [kSelectVars] scalars (SelectVar)
    uint32_t* const key = reinterpret_cast<uint32_t*>(var + kSelectVars);   // the pool: score keys
    uint32_t* const link = key + cap;                   //           (parent + 1) << 16 | rank << 6 | depth - 1
    int* const slot_of = reinterpret_cast<int*>(link + cap);      //   slot, or -1; keep, phase 1: the level lists
    int* const sorted = slot_of + cap;                  // phase 3: ranked entries grouped by bin
    uint32_t* const sorted_key = reinterpret_cast<uint32_t*>(sorted + cap3);   // and their keys
    float* const lvl0 = reinterpret_cast<float*>(var + kSelectVars);   // !keep, phase 1: two level buffers of 2 * cap
    float* const lvl1 = lvl0 + 2 * cap;

    const int tid = (int)threadIdx.x;
    const int lane = tid & 31;
    const uint32_t lanes_below = (1u << lane) - 1u;
    __syncthreads();    // a failed attempt's last reads of var come before this attempt's resets
    int group = 1;
    while (group < V) group *= 2;
    const int rank = tid & (group - 1);                 // this thread's candidate rank

    for (int i = tid; i < kBins; i += kThreads) hist[i] = 0;
    if (tid == 0) {
        var[kVarNext] = 0;
        var[kVarOverflow] = 0;
        var[kVarLowBin] = kBins;
        reinterpret_cast<uint32_t*>(var)[kVarRootKey] = score_key(0.0f);     // key[-1]
        if (!kKeep) lvl0[0] = 0.0f;     // level 0: the root
    }
    __syncthreads();

    // Phase 1: level by level, count every path whose bin is >= the running threshold bin bstar, the highest bin
    // with at least B counted paths in it or above (0 while fewer than B exist). Every counted path is a real
    // path, so the B-th best score has a bin >= bstar, and a path below bstar (with all its descendants and
    // later siblings, which score no higher) is not among the B best. bstar only rises. `above` is the number
    // of counted paths with bin >= bstar. Level d's n nodes: keep, pool entries [node_lo, node_lo + n) (-1: the
    // root); !keep, cur[0, n). Warp w takes the w-th share of them, lists those with a counted child
    // (select_list_level) and runs its own passes over that list with as many items per lane as it needs
    // (1..kSelectItems1, warp-uniform), so a small level or a level of mostly dead nodes costs few items. Then
    // every warp moves the threshold itself (the same walk over the same data gives the same result in every
    // thread): bstar and above live in registers, and the only shared scalars are the counters the passes
    // update. Two barriers per level: the passes' counts are complete before the walk reads them, and every walk
    // is done before the next level's passes change them.
    int bstar = 0;          // the threshold bin (phase 1: running; then final)
    int ranked = 0;         // paths with bin >= bstar: the entries phase 3 ranks
    int pool = 0;           // the pool entries phase 3 scans
    {
        const int group_shift = 31 - __clz(group);         // log2(group)
        const int stride_shift = 5 - group_shift;           // log2(nodes per item of a warp)
        int* const list = slot_of;                          // keep: the warps' lists, inside [0, n) (n <= cap)
        SelectLevel level;                                  // the fields every level shares
        level.list = list;
        level.key = key;
        level.link = link;
        level.hist = hist;
        level.var = var;
        level.stride = 1 << stride_shift;
        level.lane_node = lane >> group_shift;
        level.lanes_below = lanes_below;
        int above = 0;
        int node_lo = -1, n = 1;
        int child_lo = 0;                                   // var[kVarNext] when level d's passes start
        for (int d = 0; d < K && n > 0; ++d) {
            float* const cur = (d & 1) ? lvl1 : lvl0;
            float* const nxt = (d & 1) ? lvl0 : lvl1;
            const float count_floor = counted_floor(bstar);
            const int share = (n + kWarps - 1) / kWarps;
            const int lo = min((tid >> 5) * share, n);
            const int hi = min(lo + share, n);
            const int listed = select_list_level<kKeep>(key, node_lo, cur, list, lo, hi, lp_s[d * V], count_floor,
                                                        lanes_below);
            level.scores = cur;
            level.child_scores = nxt;
            level.end = lo + listed;
            level.lp = (rank < V) ? lp_s[d * V + rank] : -INFINITY;
            level.count_floor = count_floor;
            level.link_low = ((uint32_t)rank << 6) | (uint32_t)d;
            level.child_lo = child_lo;
            level.child_cap = kKeep ? cap : child_lo + 2 * cap;
            static_assert(kSelectItems1 == 8, "one case per item count below");
            for (int base = lo; base < level.end;) {
                const int items = min(((level.end - base - 1) >> stride_shift) + 1, kSelectItems1);
                switch (items) {
                    case 1: select_count_pass<1, kKeep>(level, base); break;
                    case 2: select_count_pass<2, kKeep>(level, base); break;
                    case 3: select_count_pass<3, kKeep>(level, base); break;
                    case 4: select_count_pass<4, kKeep>(level, base); break;
                    case 5: select_count_pass<5, kKeep>(level, base); break;
                    case 6: select_count_pass<6, kKeep>(level, base); break;
                    case 7: select_count_pass<7, kKeep>(level, base); break;
                    default: select_count_pass<8, kKeep>(level, base); break;
                }
                base += items << stride_shift;
            }
            __syncthreads();
            if (var[kVarOverflow] != 0) return false;
            // The new bstar: from the lowest bin any counted path has (or the old bstar) up, kSelectRows rows of
            // 32 bins (one per lane) at a time, to the last bin with B counted paths at or above it.
            const int next = var[kVarNext];
            above += next - child_lo;       // every new path has bin >= the old bstar
            int nb = bstar;
            if (above >= B) {
                for (int row = max(bstar, var[kVarLowBin]) & ~31;; row += 32 * kSelectRows) {
                    int h[kSelectRows], in_row[kSelectRows];
#pragma unroll
                    for (int j = 0; j < kSelectRows; ++j) {
                        const int b = row + 32 * j + lane;
                        h[j] = (b >= bstar && b < kBins) ? hist[b] : 0;
                    }
#pragma unroll
                    for (int j = 0; j < kSelectRows; ++j) in_row[j] = __reduce_add_sync(kFull, h[j]);
                    int j = 0;      // the first row past which fewer than B paths remain
                    int hj = h[0];
#pragma unroll
                    for (int t = 0; t < kSelectRows; ++t) {
                        if (j == t && above - in_row[t] >= B) {
                            above -= in_row[t];
                            j = t + 1;
                        }
                    }
#pragma unroll
                    for (int t = 1; t < kSelectRows; ++t) hj = (j == t) ? h[t] : hj;
                    if (j == kSelectRows) continue;
                    const int incl = kdt::warp_inclusive_scan(hj);
                    const int from_here = above - (incl - hj);     // paths with bin >= this lane's bin
                    const uint32_t reach = __ballot_sync(kFull, from_here >= B);
                    const int l = 31 - __clz((int)reach);
                    nb = row + 32 * j + l;
                    above = __shfl_sync(kFull, from_here, l);
                    break;
                }
            }
            bstar = nb;
            node_lo = child_lo;
            n = next - child_lo;
            child_lo = next;
            __syncthreads();    // every walk has read hist and var before the next level's passes change them
        }
        ranked = above;
        pool = kKeep ? child_lo : above;
    }
    // The loop's last barrier also orders phase 1's last reads before the writes below.
    if (ranked > cap3) return false;

    if constexpr (!kKeep) {
        // Phase 2: materialise the paths with bin >= bstar level by level, in a stable order: each level is
        // contiguous, each node's children are contiguous in rank order. Node-major over the block: a pass
        // looks at kSelectItems * kThreads / group nodes.
        const int warp = tid >> 5;
        const int nodes_per_item = kThreads / group;
        const int node_in_pass = tid / group;
        const int nodes_per_pass = kSelectItems * nodes_per_item;
        int pass = 0;
        int lo = -1, hi = 0;
        for (int d = 0; d < K && hi > lo; ++d) {
            const float lp = (rank < V) ? lp_s[d * V + rank] : -INFINITY;
            int at = hi;
            for (int base = lo; base < hi; base += nodes_per_pass, ++pass) {
                float x[kSelectItems];
                uint32_t votes[kSelectItems];
                int* const counts = wsum + (pass & 1) * kWarps * kSelectItems;
                uint32_t raw[kSelectItems];
#pragma unroll
                for (int k = 0; k < kSelectItems; ++k) {   // clamped into this level, as in phase 1
                    const int i = min(max(base + k * nodes_per_item + node_in_pass, lo), hi - 1);
                    raw[k] = (i < 0) ? 0u : key[i];
                }
#pragma unroll
                for (int k = 0; k < kSelectItems; ++k) {
                    const int i = base + k * nodes_per_item + node_in_pass;
                    const float c = __fadd_rn(i < 0 ? 0.0f : key_score(raw[k]), lp);
                    const bool ok = i < hi && c > -INFINITY && score_bin(c) >= bstar;
                    x[k] = ok ? c : -INFINITY;
                    votes[k] = __ballot_sync(kFull, ok);
                }
                int item_count = 0;     // lane k < kSelectItems: this warp's count of item k
#pragma unroll
                for (int k = 0; k < kSelectItems; ++k) item_count = (lane == k) ? __popc(votes[k]) : item_count;
                if (lane < kSelectItems) counts[lane * kWarps + warp] = item_count;
                __syncthreads();
                // Entries in node order: item k of every warp (warps in order) before item k + 1. counts holds
                // one (item, warp) count per lane in that order, so one warp scan gives every offset.
                const int c = counts[lane];
                const int incl = kdt::warp_inclusive_scan(c);
                const int total = __shfl_sync(kFull, incl, 31);
#pragma unroll
                for (int k = 0; k < kSelectItems; ++k) {
                    const int e = at + __shfl_sync(kFull, incl - c, k * kWarps + warp) +
                                  __popc(votes[k] & lanes_below);
                    if ((votes[k] & (1u << lane)) && e < cap) {
                        const int i = base + k * nodes_per_item + node_in_pass;
                        key[e] = score_key(x[k]);
                        link[e] = ((uint32_t)(i + 1) << 16) | ((uint32_t)rank << 6) | (uint32_t)d;
                    }
                }
                at += total;
            }
            __syncthreads();
            lo = hi;
            hi = min(at, cap);
        }
    }

    // Phase 3: the position of every entry with bin >= bstar in the best-first order: the ranked entries in
    // higher bins, plus those of its own bin that come before it (higher key; equal keys: select_before). Bins
    // hold few entries; hist counts exactly the pool's entries in every bin >= bstar.
    {
        const int c0 = (kThreads - 1 - tid) * (kBins / kThreads);    // thread order = bins from the top
        int mine = 0;
        for (int b = c0; b < c0 + kBins / kThreads; ++b) mine += (b >= bstar) ? hist[b] : 0;
        int total;
        int above = block_exclusive_scan(mine, wsum, total);
        for (int b = c0 + kBins / kThreads - 1; b >= c0; --b) {
            offs[b] = above;
            above += (b >= bstar) ? hist[b] : 0;
        }
    }
    __syncthreads();
    for (int e = tid; e < pool; e += kThreads) {
        const uint32_t k = key[e];
        const int b = score_bin(key_score(k));
        if (b < bstar) continue;
        const int j = offs[b] + atomicSub(&hist[b], 1) - 1;
        sorted[j] = e;
        sorted_key[j] = k;
    }
    __syncthreads();
    // Positions, over the ranked entries only (sorted[0, ranked)). offs[b] is the start of bin b's group.
    for (int j = tid; j < ranked; j += kThreads) {
        const int e = sorted[j];
        const uint32_t k = sorted_key[j];
        const int b = score_bin(key_score(k));
        int pos = offs[b];
        if (pos < B) {
            const int end = (b == 0) ? ranked : offs[b - 1];
            int ahead = 0;
            int same = 0;
            for (int t = pos; t < end; ++t) {
                const uint32_t kt = sorted_key[t];
                ahead += (kt > k) ? 1 : 0;
                same += (kt == k) ? 1 : 0;
            }
            if (same > 1) {     // equal scores besides its own: the contract's tie-break (rare)
                for (int t = pos; t < end; ++t) {
                    const int f = sorted[t];
                    ahead += (sorted_key[t] == k && f != e && select_before(key, link, f, e)) ? 1 : 0;
                }
            }
            pos += ahead;
        }
        slot_of[e] = (pos < B) ? pos + 1 : -1;
    }
    __syncthreads();

    // The records the finalize reads, as the serial loop leaves them. A taken entry's parent and previous
    // sibling (the entry just before it) are taken too, and earlier.
    for (int j = tid; j < ranked; j += kThreads) {
        const int e = sorted[j];
        const int s = slot_of[e];
        if (s < 0) continue;
        const uint32_t l = link[e];
        const int p = link_parent(l);
        const int ps = (p < 0) ? 0 : slot_of[p];
        const int r = link_rank(l);
        rec_s[s] = (ps << 16) | (int)(l & 0xffffu);      // parent slot << 16 | rank << 6 | depth - 1
        logw_s[s] = key_score(sorted_key[j]);
        if (r == 0) fc_s[ps] = s;
        else ns_s[slot_of[e - 1]] = s;
    }
    if (tid == 0) misc[0] = min(B, ranked);
    return true;
}

// Stages top_logp[g, :, :Vs] and top_ids[g, :, :Vs] into lp_s / ids_s ([K][Vs]), lp0[d] = top_logp[g, d, 0] and,
// with kLp1, lp1[d] = top_logp[g, d, 1] (-inf for d >= K; lp1 also for V == 1), d < kLp0Len. Each thread issues
// its first element's loads and its lp0 / lp1 loads before any store: a store right behind its load stalls the
// thread (in-order issue) until the data arrives, so a store between two loads would cost a second memory round
// trip before the barrier. Returns whether this thread staged a log-prob > 0.
template <bool kLp1>
__device__ __forceinline__ int stage_logprobs(const float* __restrict__ glp, const int* __restrict__ gid, int K,
                                              int V, int Vs, float* lp_s, int* ids_s, float* lp0, float* lp1) {
    static_assert(kThreads >= kLp0Len, "one lp0 entry per thread");
    const int tid = (int)threadIdx.x;
    const int count = K * Vs;
    float x = 0.0f, l0 = -INFINITY, l1 = -INFINITY;
    int id = 0;
    if (tid < count) {
        const int d = tid / Vs;
        const int r = tid - d * Vs;
        x = glp[(size_t)d * V + r];
        id = gid[(size_t)d * V + r];
    }
    if (tid < K) {
        l0 = glp[(size_t)tid * V];
        if (kLp1 && V > 1) l1 = glp[(size_t)tid * V + 1];
    }
    int positive = 0;
    for (int i = tid + kThreads; i < count; i += kThreads) {    // K * Vs > kThreads only
        const int d = i / Vs;
        const int r = i - d * Vs;
        const float y = glp[(size_t)d * V + r];
        lp_s[i] = y;
        ids_s[i] = gid[(size_t)d * V + r];
        positive |= (y > 0.0f);
    }
    if (tid < count) {
        lp_s[tid] = x;
        ids_s[tid] = id;
        positive |= (x > 0.0f);
    }
    if (tid < kLp0Len) {
        lp0[tid] = l0;
        if (kLp1) lp1[tid] = l1;
    }
    return positive;
}

// ---- small path: B <= 31, serial loop only --------------------------------------------------------------------

// The small path builds N = B + 1 <= 32 slots, one per lane of warp 0 (slot q on lane q, so lane order is slot
// order), with one mask word per row; warp 0 runs the loop and the finalize alone, with no block barrier after
// the staging. See "Small path" in the header for the algorithm and the chain it shortens.
constexpr int kSmallMaxSlots = 32;
// Its shared memory, inside the p1 layout (P = 32): lp1[d] = top_logp[g, d, 1] (-inf for d >= K or V == 1) in
// the bytes of ent and logw, which it does not use; fc where the serial loop keeps it; lp0 in the header; lp and
// ids in region x.
static_assert(4 * kLp0Len <= off_last(kSmallMaxSlots), "small path: lp1 must fit in ent and logw of P = 32");
constexpr int kSmallUnroll = 4;     // steps per basic block of the loop

__device__ __forceinline__ void small_build(const float* __restrict__ glp, const int* __restrict__ gid, int K,
                                            int V, int B, int Vs, unsigned char* smem_raw,
                                            int* __restrict__ n_nodes, int* __restrict__ out_parent,
                                            int* __restrict__ out_depth, int* __restrict__ out_token,
                                            int* __restrict__ out_rank, float* __restrict__ out_logw,
                                            int* __restrict__ out_first_child, int* __restrict__ out_next_sibling,
                                            uint32_t* __restrict__ out_mask) {
    constexpr int P = kSmallMaxSlots;
    float* const lp1 = reinterpret_cast<float*>(smem_raw);
    int* const fc_s = reinterpret_cast<int*>(smem_raw + off_fc(P));
    float* const lp0 = reinterpret_cast<float*>(smem_raw + off_lp0(P));
    float* const lp_s = reinterpret_cast<float*>(smem_raw + off_x(P));
    int* const ids_s = reinterpret_cast<int*>(smem_raw + off_x(P) + staged_bytes(K, Vs));

    const int tid = (int)threadIdx.x;
    const int lane = tid & 31;
    const int g = (int)blockIdx.x;
    const int N = B + 1;

    // ---- prologue (whole block): one round of global loads, one barrier ----
    if (tid < P) fc_s[tid] = -1;
    stage_logprobs<true>(glp, gid, K, V, Vs, lp_s, ids_s, lp0, lp1);
    __syncthreads();
    if (tid >= 32) return;      // warp 0 alone from here: no barrier follows

    // ---- the loop (warp 0) ----
    // Per-lane state: slot `lane` once taken (the root on lane 0) and its entry at rank rho.
    //   L, D, par, mask  logw, depth, parent slot and ancestor bits of the slot
    //   key          the entry's key (0: none or dead); a newborn's joins one step late (see the header)
    //   adv          the key at rank rho + 1 (0 when rho + 1 == V): the entry after a take
    //   nxt          top_logp[g, D, rho + 2], indices clamped into the staged range: for the adv after that
    //   rc0, rc1     lp0[D + 1], lp1[D + 1]: ranks 0 and 1 under the node this entry would become
    //   ck, ca       that node's entry keys at ranks 0 and 1, had this entry been taken
    //   gl0, gl1     lp0[D + 2], lp1[D + 2]: that node's rc0, rc1
    // Every lane starts with the root's values; key 0 keeps unborn lanes out of the argmax, and a lane's birth
    // overwrites every field that differs. Rank, first child and next sibling are derived in the finalize.
    const uint32_t lanes_below = (1u << lane) - 1u;
    int D = 0, rho = 0, par = -1;
    float L = 0.0f;
    const float sc0 = __fadd_rn(0.0f, lp0[0]);
    uint32_t adv = score_key(__fadd_rn(0.0f, lp1[0]));
    float nxt = lp_s[min(2, Vs - 1)];
    float rc0 = lp0[1], rc1 = lp1[1], gl0 = lp0[2], gl1 = lp1[2];
    uint32_t ck = score_key(__fadd_rn(sc0, rc0));
    uint32_t ca = score_key(__fadd_rn(sc0, rc1));
    uint32_t mask = 1u;
    uint32_t key = 0u;                      // lane 0's entry (the root's) joins through c at step 1

    // The previous step's outcome, applied one step late (software pipelining, see the header): the winner
    // flag, the newborn flag, the best key, the winner's lane and what it shuffled out.
    bool is_w = false, is_n = true;         // step 0 "bore" the root on lane 0: its key c joins at step 1
    uint32_t bal = 1u, m = 0u, c = score_key(sc0), a = adv, wmask = 1u;
    int wl = -1, wD = -1, sp = 0;
    float g0 = rc0, g1 = rc1;
    if (lane != 0) is_n = false;

    // Applies the outcome of step t to this lane's registers, branch-free (unchanged inputs recompute
    // unchanged values). Step 0 is the root's birth on lane 0, already in the registers.
    auto apply = [&](int t) {
        // The winner: its entry moves to rank rho + 1 (its key already did) and its adv to rank rho + 2.
        const uint32_t w_adv = (rho + 2 < V) ? score_key(__fadd_rn(L, nxt)) : 0u;
        adv = is_w ? w_adv : adv;
        rho = is_w ? rho + 1 : rho;
        // The newborn: slot t under the winner (lane wl), depth D_w + 1, score key_score(m), entry keys c at
        // rank 0 (it joins `key` at the next step) and a at rank 1.
        const bool born = is_n && t > 0;
        adv = born ? a : adv;
        rho = born ? 0 : rho;
        L = born ? key_score(m) : L;
        D = born ? wD + 1 : D;
        rc0 = born ? g0 : rc0;
        rc1 = born ? g1 : rc1;
        par = born ? wl : par;
        mask = born ? (wmask | (1u << (t & 31))) : mask;
        // What a take of the entry would hand out. key_score(0) is NaN: a dead entry's keys stay 0.
        const float sc = key_score(is_n ? c : key);
        ck = score_key(__fadd_rn(sc, rc0));
        ca = score_key(__fadd_rn(sc, rc1));
        nxt = lp_s[min(D, K - 1) * Vs + min(rho + 2, Vs - 1)];
        gl0 = lp0[D + 2];                   // D <= K <= 64: inside lp0 / lp1's 72 entries
        gl1 = lp1[D + 2];
    };

    // Step s: the chain REDUX -> max -> compare -> ballot -> lowest lane -> select -> the next REDUX, with the
    // previous step's bookkeeping issued inside the REDUX's latency. The newborn of step s - 1 (lane s - 1)
    // still holds key 0 in this REDUX: its entry c joins through the max, so the shuffle that brought c
    // overlaps the REDUX. Steps past B are no-ops (no candidate), and so is every step after one that found
    // no live entry (every key stays 0, and the newborn flag guards the merge).
    auto step = [&](int s) {
        const uint32_t R = __reduce_max_sync(kFull, key);
        apply(s - 1);
        key = is_n ? c : key;
        const bool live = key != 0u && s <= B;
        m = max(R, c);
        // The winner: the smallest slot (= lane) holding the best key.
        const bool cand = live && key == m;
        bal = __ballot_sync(kFull, cand);
        const uint32_t taken = cand ? adv : key;     // entry (w, rho) -> (w, rho + 1), if I am the winner
        const bool lower = (bal & lanes_below) != 0u;
        key = lower ? key : taken;                   // the next REDUX's operand
        is_w = cand && !lower;
        // The winner hands the newborn (slot s, lane s) what it precomputed; applied at the next step.
        wl = __ffs((int)bal) - 1;
        c = __shfl_sync(kFull, ck, wl);
        a = __shfl_sync(kFull, ca, wl);
        g0 = __shfl_sync(kFull, gl0, wl);
        g1 = __shfl_sync(kFull, gl1, wl);
        wD = __shfl_sync(kFull, D, wl);
        wmask = __shfl_sync(kFull, mask, wl);
        is_n = lane == s && bal != 0u;
        sp = s;
    };

    // Groups of kSmallUnroll steps in one basic block, so the scheduler can start each REDUX right after the
    // select it depends on; the build stops after a group whose last step took nothing.
    for (int s = 1; s <= B; s += kSmallUnroll) {
#pragma unroll
        for (int u = 0; u < kSmallUnroll; ++u) step(s + u);
        if (bal == 0u) break;
    }
    apply(sp);      // the last step's outcome (a no-op if it took nothing)

    // ---- finalize (warp 0): one slot per lane ----
    // Taken slots are 1..n, lanes born with a depth >= 1. Siblings (same parent) are taken in rank order, so
    // among them: rank = the number of smaller slots, the first child is the smallest slot, the next sibling
    // the next larger slot. Unborn lanes get distinct non-parent values so that they match nobody.
    const bool born = D > 0;
    const int n = __popc(__ballot_sync(kFull, born));
    const bool valid = lane <= n;
    const uint32_t sib = __match_any_sync(kFull, born ? par : -2 - lane);
    const uint32_t later = sib & ~(lanes_below | (1u << lane));
    const int rnk = __popc(sib & lanes_below);
    if (born && rnk == 0) fc_s[par] = lane;
    __syncwarp();
    if (lane < N) {
        const size_t i = (size_t)g * N + lane;
        out_parent[i] = born ? par : -1;
        out_depth[i] = valid ? D : -1;
        out_token[i] = born ? ids_s[(D - 1) * Vs + rnk] : -1;
        out_rank[i] = born ? rnk : -1;
        out_logw[i] = valid ? L : -INFINITY;
        out_first_child[i] = fc_s[lane];
        out_next_sibling[i] = (born && later != 0u) ? __ffs((int)later) - 1 : -1;
        out_mask[i] = valid ? mask : 0u;    // W == 1
    }
    if (lane == 0) n_nodes[g] = n;
}

template <int NPL, bool kPartialLp, bool kSelect>
__device__ __forceinline__ void tree_build_body(const float* __restrict__ top_logp, const int* __restrict__ top_ids,
                                                int K, int V, int B, int Vs, int cap, int cap3, int* __restrict__ n_nodes,
                                                int* __restrict__ out_parent, int* __restrict__ out_depth,
                                                int* __restrict__ out_token, int* __restrict__ out_rank,
                                                float* __restrict__ out_logw, int* __restrict__ out_first_child,
                                                int* __restrict__ out_next_sibling, uint32_t* __restrict__ out_mask) {
    constexpr int P = 32 * NPL;                 // slots per per-slot array (>= N)
    constexpr int GS = NPL < 4 ? NPL : (NPL >= 32 ? 8 : 4);   // entries per group (a rescan reads one group)
    constexpr int NG = NPL / GS;                // groups per lane

    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint2* const ent = reinterpret_cast<uint2*>(smem_raw);
    float* const logw_s = reinterpret_cast<float*>(smem_raw + off_logw(P));
    int* const last_s = reinterpret_cast<int*>(smem_raw + off_last(P));
    int* const rec_s = reinterpret_cast<int*>(smem_raw + off_rec(P));
    int* const fc_s = reinterpret_cast<int*>(smem_raw + off_fc(P));    // fc_s[P + i] is ns_s[i]
    int* const ns_s = reinterpret_cast<int*>(smem_raw + off_ns(P));
    float* const lp0 = reinterpret_cast<float*>(smem_raw + off_lp0(P));
    int* const misc = reinterpret_cast<int*>(smem_raw + off_misc(P));
    float* const lp_s = reinterpret_cast<float*>(smem_raw + off_x(P));
    int* const ids_s = reinterpret_cast<int*>(smem_raw + off_x(P) + staged_bytes(K, Vs));
    int* const scratch = reinterpret_cast<int*>(smem_raw + off_x(P) + 2 * staged_bytes(K, Vs));
    uint32_t* const tiles = reinterpret_cast<uint32_t*>(smem_raw + off_x(P));

    const int tid = (int)threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = (int)blockIdx.x;
    const int N = B + 1;
    const int W = (N + 31) >> 5;
    const float* const glp = top_logp + (size_t)g * K * V;
    const int* const gid = top_ids + (size_t)g * K * V;

    // ---- small path: N <= 32 and the serial loop (no select pool offered) ----
    if constexpr (NPL == 1 && !kPartialLp) {
        if (cap == 0) {
            small_build(glp, gid, K, V, B, Vs, smem_raw, n_nodes, out_parent, out_depth, out_token, out_rank,
                        out_logw, out_first_child, out_next_sibling, out_mask);
            return;
        }
    }

    // ---- prologue: clear per-slot state, stage the log-probs ----
    for (int i = tid; i < P; i += kThreads) {
        ent[i] = make_uint2(0u, (uint32_t)i << 16);     // no entry; pay names its own slot
        fc_s[i] = -1;
        ns_s[i] = -1;
    }
    const int positive = stage_logprobs<false>(glp, gid, K, V, Vs, lp_s, ids_s, lp0, nullptr);
    const bool any_positive = __syncthreads_or(positive) != 0;

    // ---- select path (every log-prob <= 0, all staged, B large enough: cap > 0) ----
    bool selected = false;
    if constexpr (kSelect) {
        if (cap > 0 && !any_positive) {
            // One pass over the levels when the pool has room for every counted path (cap > cap3); if it
            // overflows, two passes in the same scratch (20 * cap3 <= 12 * cap + 8 * cap3 bytes).
            if (cap > cap3)
                selected = select_build<true>(lp_s, K, Vs, B, cap, cap3, scratch, rec_s, logw_s, fc_s, ns_s, misc);
            if (!selected)
                selected = select_build<false>(lp_s, K, Vs, B, cap3, cap3, scratch, rec_s, logw_s, fc_s, ns_s, misc);
            if (selected && tid == 0) atomicAdd(&kdt_tree_build_select_runs, 1ull);
        }
    }

    // ---- best-first loop: warp 0 ----
    if (!selected && warp == 0) {
        // top_logp[g, d, r]: shared memory, or (kPartialLp only, K * V over the budget) global for r >= Vs.
        auto LP = [&](int d, int r) -> float {
            if constexpr (kPartialLp) return (r < Vs) ? lp_s[d * Vs + r] : __ldg(glp + (size_t)d * V + r);
            else return lp_s[d * Vs + r];
        };

        // Every pay this lane ever holds names a slot it owns (slot % 32 == lane), with depth < 64 and
        // rank <= 1023 (ranks stay below B <= 1023), so loads addressed by it stay in range even for key 0.
        uint32_t gk[NG], gp[NG];                            // per group of GS entries: best (key, pay)
#pragma unroll
        for (int gi = 0; gi < NG; ++gi) {
            gk[gi] = 0u;
            gp[gi] = (uint32_t)lane << 16;
        }
        uint32_t bkey = 0u, bpay = (uint32_t)lane << 16;   // this lane's best entry (key 0: none)
        if (lane == 0) {                                     // the root (slot 0, depth 0) and its entry at rank 0
            const uint32_t k0 = score_key(__fadd_rn(0.0f, lp0[0]));
            ent[0] = make_uint2(k0, 0u);
            logw_s[0] = 0.0f;
            gk[0] = k0;
            bkey = k0;
        }
        // Loaded for my best q at the end of each step (and before the first), consumed after the next step's
        // collectives so their latency hides behind them.
        uint32_t pk[GS], pp[GS];        // q's group
        float q_lw, q_a;                // logw[q], top_logp[g, D(q), rank + 1] (unused when rank + 1 == V)
        int q_last;                     // last child taken under q
        auto load_best = [&]() {
            const uint32_t q = bpay >> 16;
            const uint32_t gq = (q >> 5) / GS;
#pragma unroll
            for (int j = 0; j < GS; ++j) {
                const uint2 e = ent[((gq * GS + (uint32_t)j) << 5) | (uint32_t)lane];
                pk[j] = e.x;
                pp[j] = e.y;
            }
            q_lw = logw_s[q];
            q_last = last_s[q];
            // rank + 1, clamped into the staged range: beyond it the value is never used (rank + 1 == V, or the
            // root after its B-th child, at the last step).
            q_a = LP((int)(bpay & 63u), min((int)((bpay >> 6) & 1023u) + 1, (kPartialLp ? V : Vs) - 1));
        };
        load_best();
        // top_logp[g, D(q) + 1, 0] (-inf when D(q) + 1 == K: no child) and the key of the child entry my best
        // would create if taken: 0 when depth K is reached or the score is -inf (and when I hold no entry:
        // key 0 decodes to NaN).
        float b_nlp = lp0[(bpay & 63u) + 1];
        uint32_t bchild = score_key(__fadd_rn(key_score(bkey), b_nlp));

        int n = 0;
        for (int s = 1; s <= B; ++s) {
            const uint32_t m = __reduce_max_sync(kFull, bkey);
            // m == 0: no live entry, every remaining candidate is -inf (or none is left): the build stops. The
            // step still runs to its end with every store and update switched off (no branch here).
            const bool alive = m != 0u;

            // The winner: the lane holding m, or with tied scores the one whose best has the smallest slot
            // (pay's slot field is on top and slots are unique across lanes). It hands out its best's pay
            // and child key.
            const bool cand = (bkey == m);
            const uint32_t bal = __ballot_sync(kFull, cand);
            int wl = __ffs((int)bal) - 1;
            if (__popc(bal) > 1) wl = (int)(__reduce_min_sync(kFull, cand ? bpay : 0xffffffffu) >> 16) & 31;
            const uint32_t w = __shfl_sync(kFull, bpay, wl);
            const uint32_t ck = __shfl_sync(kFull, bchild, wl);

            // Spec: my state if my best entry q is the one taken (it advances to rank + 1).
            const uint32_t q = bpay >> 16;
            const uint32_t iq = q >> 5;                     // q's entry index in this lane
            const uint32_t gq = iq / GS;                    // q's group
            const int rq = (int)((bpay >> 6) & 1023u);
            const uint32_t badv = (rq + 1 < V) ? score_key(__fadd_rn(q_lw, q_a)) : 0u;
            const uint32_t apay = bpay + 64u;   // rank + 1 <= 1023: q had rank + 1 children by then
            uint32_t tk[GS], tp[GS];
#pragma unroll
            for (int j = 0; j < GS; ++j) {
                const bool me = (gq * GS + (uint32_t)j) == iq;
                tk[j] = me ? badv : pk[j];
                tp[j] = me ? apay : pp[j];
            }
            argmax_pairs<GS>(tk, tp);           // q's group after the advance
            uint32_t uk[NG], up[NG];
#pragma unroll
            for (int gi = 0; gi < NG; ++gi) {
                const bool mine = (uint32_t)gi == gq;
                uk[gi] = mine ? tk[0] : gk[gi];
                up[gi] = mine ? tp[0] : gp[gi];
            }
            argmax_pairs<NG>(uk, up);           // my best after the advance: (uk[0], up[0])
            const float nlp_spec = lp0[(up[0] & 63u) + 1];

            // The taken candidate: entry p at rank r becomes slot s at depth ds with score sc.
            const uint32_t p = w >> 16;
            const int r = (int)((w >> 6) & 1023u);
            const int ds = (int)(w & 63u) + 1;
            const float sc = key_score(m);
            const float nlp_s = lp0[ds + 1];
            const bool is_w = alive && lane == wl;                      // my best was taken (p == q, r == rq)
            const bool is_o = alive && lane == (s & 31);                // slot s is mine
            const uint32_t pay_s = ((uint32_t)s << 16) | (uint32_t)(ds < K ? ds : 0);
            const uint32_t gs = ((uint32_t)s >> 5) / GS;

            if (is_w) {     // entry p advances; link s after p's previous child
                ent[p] = make_uint2(badv, apay);
                fc_s[r == 0 ? (int)p : P + q_last] = s;     // first_child[p] or next_sibling[last child of p]
                last_s[p] = s;
            }
            if (is_o) {     // record slot s and add its entry (key ck; 0 when ds == K or the score is -inf)
                ent[s] = make_uint2(ck, pay_s);
                logw_s[s] = sc;
                rec_s[s] = (int)w;   // parent << 16 | rank << 6 | depth - 1
            }
            // Registers, branch-free: the winner takes its spec, then the owner folds entry s in (s is the
            // largest slot it owns, so it needs a strictly larger key).
#pragma unroll
            for (int gi = 0; gi < NG; ++gi) {
                const bool wg = is_w && (uint32_t)gi == gq;
                const uint32_t k1 = wg ? tk[0] : gk[gi];
                const uint32_t p1 = wg ? tp[0] : gp[gi];
                const bool og = is_o && (uint32_t)gi == gs && ck > k1;
                gk[gi] = og ? ck : k1;
                gp[gi] = og ? pay_s : p1;
            }
            const uint32_t k1 = is_w ? uk[0] : bkey;
            const uint32_t p1 = is_w ? up[0] : bpay;
            const float n1 = is_w ? nlp_spec : b_nlp;
            const bool fold = is_o && ck > k1;
            bkey = fold ? ck : k1;
            bpay = fold ? pay_s : p1;
            b_nlp = fold ? nlp_s : n1;
            load_best();
            bchild = score_key(__fadd_rn(key_score(bkey), b_nlp));
            if (!alive) break;
            n = s;
        }
        if (lane == 0) misc[0] = n;
    }
    __syncthreads();

    // ---- finalize: per-slot outputs ----
    const int n = misc[0];
    const size_t row = (size_t)g * N;
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

    // Per 32-slot block b: for slot j in it, ent[j] = (bits of j's ancestors-or-self inside block b,
    // first ancestor below block b or -1). Pointer jumping over the in-block parent chain (< 32 links).
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

    // Mask rows, 32 rows per warp pass: zero a tile, each lane writes its row's nonzero words (one per ancestor
    // word block, found by following block exits), then the warp copies the tile out coalesced.
    uint32_t* const tile = tiles + warp * 32 * W;
    for (int c = warp; c < W; c += kWarps) {
        const int row0 = c << 5;
        const int rows = min(32, N - row0);
        const int cnt = rows * W;
        for (int k = lane; k < cnt; k += 32) tile[k] = 0u;
        __syncwarp();
        const int i = row0 + lane;
        if (lane < rows && i <= n) {
            int j = i;
            while (j >= 0) {
                const uint2 e = ent[j];
                tile[lane * W + (j >> 5)] = e.x;
                j = (int)e.y;
            }
        }
        __syncwarp();
        uint32_t* const dst = out_mask + (row + row0) * W;
        for (int k = lane; k < cnt; k += 32) dst[k] = tile[k];
        __syncwarp();
    }
}

}  // namespace

#define KDT_TREE_BUILD_ENTRY(NPL, SUFFIX, PARTIAL, SELECT)                                                     \
    extern "C" __global__ void __launch_bounds__(kThreads, 1) kdt_tree_build_p##NPL##SUFFIX(                  \
        const float* __restrict__ top_logp, const int* __restrict__ top_ids, int K, int V, int B, int Vs, int cap, int cap3, \
        int* __restrict__ n_nodes, int* __restrict__ parent, int* __restrict__ depth, int* __restrict__ token, \
        int* __restrict__ rank, float* __restrict__ logw, int* __restrict__ first_child,                       \
        int* __restrict__ next_sibling, uint32_t* __restrict__ mask) {                                          \
        tree_build_body<NPL, PARTIAL, SELECT>(top_logp, top_ids, K, V, B, Vs, cap, cap3, n_nodes, parent, depth, token, rank, logw,         \
                             first_child, next_sibling, mask);                                                   \
    }

// kdt_tree_build_p{NPL}: the needed [K, Vs = min(V, B + 1)] log-probs fit in shared memory; small path and serial
//   loop only (the launcher offered no select pool).
// kdt_tree_build_p{NPL}_select: the same with the select path (a pool offered: cap > 0). A separate entry because
//   the select path in the same function changes how ptxas compiles the serial loop (divergence checks around
//   its shuffles: 10-17% slower serial builds on the H200).
// kdt_tree_build_p{NPL}_g: they do not fit (Vs < min(V, B + 1)); ranks >= Vs are read from global memory.
#define KDT_TREE_BUILD_ENTRIES(NPL)                 \
    KDT_TREE_BUILD_ENTRY(NPL, , false, false)       \
    KDT_TREE_BUILD_ENTRY(NPL, _select, false, true) \
    KDT_TREE_BUILD_ENTRY(NPL, _g, true, false)
KDT_TREE_BUILD_ENTRIES(1)
KDT_TREE_BUILD_ENTRIES(2)
KDT_TREE_BUILD_ENTRIES(4)
KDT_TREE_BUILD_ENTRIES(8)
KDT_TREE_BUILD_ENTRIES(16)
KDT_TREE_BUILD_ENTRIES(32)
