// kernels/tree_build/select.cuh -- the select path, only in the kdt_tree_build_p{NPL}_*select_* entries: when
// every log-prob is <= 0, best-first order is a sort of the paths, and the whole block selects the B best (score
// bins, a rising threshold bin level by level, then a rank within the bins) instead of taking one node per step.
// select_build writes the same records the serial loop leaves for the finalize. See plans/kernels/tree-build.md,
// "Select path".
#pragma once

#include <stdint.h>

#include "common/bits.cuh"
#include "common/ptx.cuh"
#include "tree_build/layout.cuh"

namespace {

// Score bins: bits 30..16 of a non-positive score (its exponent and 7 mantissa bits, relative width 1/128) for
// |score| in [2^-4, 2^12); smaller magnitudes share the top bin (kBins - 1), larger ones bin 0. Bins are
// non-decreasing in the score, which is all the pruning needs.
constexpr uint32_t kBinLow = 123u << 7;     // bits 30..16 of 2^-4
constexpr int kSelectItems1 = 8;            // phase 1: at most this many nodes per lane in one pass of a warp
constexpr int kSelectListChunks = 4;        // phase 1: 32-node chunks a warp tests per step when it lists a level
constexpr int kSelectRows = 4;              // rows of 32 bins a warp sums at once when it moves the threshold

// Bin of a score <= 0 (see kBinLow); non-decreasing in the score.
__device__ __forceinline__ int score_bin(float s) {
    uint32_t u = (__float_as_uint(s) >> 16) & 0x7fffu;
    u = min(max(u, kBinLow), kBinLow + (uint32_t)(kBins - 1));
    return kBins - 1 - (int)(u - kBinLow);
}

// Phase 1 counts a path of score c <= 0 when c > -inf and score_bin(c) >= bstar: iff c > counted_floor(bstar),
// one float compare (proof: the note, "Select path", counted_floor).
__device__ __forceinline__ float counted_floor(int bstar) {
    return bstar == 0 ? -INFINITY : -__uint_as_float((kBinLow + (uint32_t)(kBins - bstar)) << 16);
}

// score_bin(c) of a counted c (<= 0, finite) without masking the sign: score_bin(c) == kBinOfCode -
// counted_bin_code(c); larger codes are lower bins (why the sign bit may stay: the note, "counted_bin_code").
constexpr uint32_t kSignedBinLow = 0x8000u | kBinLow;
constexpr int kBinOfCode = kBins - 1 + (int)kSignedBinLow;
__device__ __forceinline__ uint32_t counted_bin_code(float c) {
    return min(max(__float_as_uint(c) >> 16, kSignedBinLow), kSignedBinLow + (uint32_t)(kBins - 1));
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

// The request's log-probs as the select path reads them: ranks below staged_cols from shared memory
// ([K][staged_cols]), the rest (the _g_select_wide entries, K * V over the budget) from global memory (row stride
// cols); fanout = min(V, B + 1), the ranks a build can read.
struct SelectLogProbs {
    const float* staged;
    const float* global;
    int staged_cols;
    int cols;
    int fanout;
    __device__ __forceinline__ float at(int d, int r) const {
        return (r < staged_cols) ? staged[d * staged_cols + r] : __ldg(global + (size_t)d * cols + r);
    }
    // The narrow kind's read: its rows are all staged (the _select_narrow entries).
    __device__ __forceinline__ float staged_at(int d, int r) const { return staged[d * staged_cols + r]; }
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
    // k ^ (~sign | 0x80000000), as one LOP3 (the compiler splits it in two)
    const uint32_t bits = kdt::lop3<kLop3KeyToBits>(k, sign, 0x80000000u);
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
        kdt::shared_add_if(hist_top - 4u * code, ok);
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
            kdt::shared_store_if(&v.key[mine], kdt::ordered_key(c[k]), ok);
            kdt::shared_store_if(&v.link[mine], (parent[k] << 16) + v.link_low, ok);
        } else {
            kdt::shared_store_if(&v.child_scores[mine], __float_as_uint(c[k]), ok);
        }
        e += __popc(votes[k]);
    }
}

// The counted ranks of a node of score s at depth d: the r with fadd(s, lp(d, r)) > floor. They are a prefix of the
// row (a row is non-increasing and rounding is monotone): galloping over ranks 0, 1, 3, 7, ... then a binary search,
// so a node with few children (most) reads a few staged ranks, never the unstaged ones (_g_select_wide: global memory).
__device__ __forceinline__ int counted_prefix(const SelectLogProbs& lps, int d, float s, float floor) {
    int lo = 0, probe = 0;          // ranks below lo are counted
    while (probe < lps.fanout && __fadd_rn(s, lps.at(d, probe)) > floor) {
        lo = probe + 1;
        probe = 2 * probe + 1;
    }
    int hi = min(probe, lps.fanout);    // ranks from hi on are not
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (__fadd_rn(s, lps.at(d, mid)) > floor) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// A wide level's node j: its score from pool keys (kPoolKeys; nodes[-1] is the root's key) or score bits.
template <bool kPoolKeys>
__device__ __forceinline__ float wide_node_score(const uint32_t* nodes, int j) {
    return kPoolKeys ? pool_score(nodes[j]) : __uint_as_float(nodes[j]);
}

// The block's share of a wide level: thread t takes nodes [t * per, (t + 1) * per), contiguous, so one block scan
// orders every node's children (the note, "Wide V").
__device__ __forceinline__ void wide_share(int n, int& first, int& last) {
    const int per = (n + kThreads - 1) / kThreads;
    first = min((int)threadIdx.x * per, n);
    last = min(first + per, n);
}

// The paths with bin >= b if a wide level's nodes (nodes[0, n)) were counted at counted_floor(b): the earlier
// levels' (hist) plus the level's. Block-wide, the same value in every thread; wsum is free again on return.
template <bool kPoolKeys>
__device__ __forceinline__ int wide_paths_from_bin(int b, const int* hist, const uint32_t* nodes, int n,
                                                   const SelectLogProbs& lps, int d, int* wsum) {
    int mine = 0;
    for (int i = (int)threadIdx.x; i < kBins; i += kThreads) mine += (i >= b) ? hist[i] : 0;
    const float floor = counted_floor(b);
    int first, last;
    wide_share(n, first, last);
    for (int j = first; j < last; ++j) mine += counted_prefix(lps, d, wide_node_score<kPoolKeys>(nodes, j), floor);
    int total;
    block_exclusive_scan(mine, wsum, total);
    __syncthreads();
    return total;
}

// A wide level's layout: off[j] = the position of node j's first counted child (children counted at `floor`: a
// prefix of the row, counted_prefix), node by node, each node's children in rank order (so the previous sibling
// of an entry is the entry before it). Returns the level's count, the same in every thread; off and wsum are
// complete on return.
template <bool kPoolKeys>
__device__ __forceinline__ int wide_level_layout(const uint32_t* nodes, int n, const SelectLogProbs& lps, int d,
                                                 float floor, int* off, int* wsum) {
    int first, last;
    wide_share(n, first, last);
    int mine = 0;
    for (int j = first; j < last; ++j) {
        const int r = counted_prefix(lps, d, wide_node_score<kPoolKeys>(nodes, j), floor);
        off[j] = r;
        mine += r;
    }
    int total;
    int at = block_exclusive_scan(mine, wsum, total);
    for (int j = first; j < last; ++j) {
        const int r = off[j];
        off[j] = at;
        at += r;
    }
    __syncthreads();
    return total;
}

// Every child of a wide level laid out by wide_level_layout, the block's threads strided over the positions:
// store(j, node, rank, score) for position j (its node: the last with off[node] <= j, by binary search).
template <bool kPoolKeys, typename Store>
__device__ __forceinline__ void wide_level_expand(const uint32_t* nodes, int n, const int* off, int total,
                                                  const SelectLogProbs& lps, int d, Store&& store) {
    for (int j = (int)threadIdx.x; j < total; j += kThreads) {
        int lo = 0, hi = n;
        while (hi - lo > 1) {
            const int mid = (lo + hi) >> 1;
            if (off[mid] <= j) lo = mid;
            else hi = mid;
        }
        const int rank = j - off[lo];
        store(j, lo, rank, __fadd_rn(wide_node_score<kPoolKeys>(nodes, lo), lps.at(d, rank)));
    }
}

// The wide kind's first threshold, from the rows alone, before any level is counted (the note, "The threshold
// estimated first"): a bin b0 with at least B paths at or above it, so phase 1 may start at bstar = b0. Each
// log-prob x falls in cell u = floor(-x / w) + 1 of a grid of kEstimateCells cells (so -u w <= x: a pessimistic
// score); a convolution over the depths counts the paths by the sum of their cells, capped at B (a capped count
// never exceeds the true one). B counted paths of cell sum <= k are B real paths of score >= -k w; one bin lower
// covers every rounding (each < 1e-5 relative, a bin is >= 1/256). The grid reaches past the lowest score T of the
// paths of depth <= D, D the first depth at which they number B, so the B-th best path lies inside it. Returns 0
// (no threshold) where it does not. All threads call it; cells (the first kEstimateDepths depths' histograms)
// and paths take kBins ints each, free before phase 1; wsum is free again on return.
constexpr int kEstimateCells = 128;
constexpr int kEstimateDepths = kBins / kEstimateCells;    // depths past these are not counted: a lower count
constexpr int kEstimateTerms = kEstimateCells / kWarps;     // convolution terms a warp sums
constexpr int kEstimateGroup = 4;                           // depths whose values a thread loads at once
static_assert(kEstimateCells == 4 * 32 && kEstimateTerms * kWarps == kEstimateCells, "4 cells a lane");
static_assert(kSelectMaxFanout <= 4 * kThreads, "a row is 4 values a thread");
static_assert(kEstimateCells * (2 + kWarps) <= kBins, "paths: zeros, counts and the warps' partial sums");
__device__ __forceinline__ int wide_estimated_bin(const SelectLogProbs& lps, int K, int B, int* cells, int* paths,
                                                  int* wsum) {
    const int V = lps.fanout;
    const int tid = (int)threadIdx.x;
    float T = 0.0f;
    int n = 0;
    for (int d = 0, layer = 1; n < B && d < K; ++d) {
        T = __fadd_rn(T, lps.at(d, V - 1));
        layer = min(layer * V, B);
        n += layer;
    }
    if (n < B || !(T < 0.0f) || T == -INFINITY) return 0;
    const float inv_w = (float)(kEstimateCells - 2) / -T;  // T's own cell is kEstimateCells - 1 at most
    const int depths = min(K, kEstimateDepths);
    int* const counts = paths + kEstimateCells;     // counts[k], k < 0: zeros (paths[0, kEstimateCells))
    int* const partial = counts + kEstimateCells;   // [kWarps][kEstimateCells]
    for (int i = tid; i < depths * kEstimateCells; i += kThreads) cells[i] = 0;
    if (tid < 2 * kEstimateCells) paths[tid] = (tid == kEstimateCells) ? 1 : 0;    // depth 0: the root, sum 0
    __syncthreads();
    // The cells: each thread loads kEstimateGroup depths' values (rows may be in global memory), then counts them.
    for (int d0 = 0; d0 < depths; d0 += kEstimateGroup) {
        float x[kEstimateGroup][4];
#pragma unroll
        for (int e = 0; e < kEstimateGroup; ++e)
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int r = tid + u * kThreads;
                x[e][u] = (d0 + e < depths && r < V) ? lps.at(d0 + e, r) : -INFINITY;
            }
#pragma unroll
        for (int e = 0; e < kEstimateGroup; ++e)
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const float q = -x[e][u] * inv_w;       // +inf for -inf: in no cell
                if (q < (float)(kEstimateCells - 1)) atomicAdd(&cells[(d0 + e) * kEstimateCells + (int)q + 1], 1);
            }
    }
    __syncthreads();
    // counts[k]: depth d's paths of cell sum k, capped, from depth d - 1's. Warp w sums the terms of cells [16 w,
    // 16 w + 16) for the lane's outputs 4 l .. 4 l + 3, sliding a window over counts (one load a term besides the
    // cell's broadcast); one thread a cell then adds the warps' partial sums.
    const int warp = tid >> 5;
    const int k0 = 4 * (tid & 31);
    const int j0 = kEstimateTerms * warp;
    int counted = 0;        // threads < kEstimateCells: paths of depth 1..d with cell sum tid
    for (int d = 0; d < depths; ++d) {
        const int* const h = cells + d * kEstimateCells;
        int w0 = counts[k0 - j0], w1 = counts[k0 + 1 - j0], w2 = counts[k0 + 2 - j0], w3 = counts[k0 + 3 - j0];
        int s0 = 0, s1 = 0, s2 = 0, s3 = 0;     // <= B * V: no overflow
#pragma unroll
        for (int t = 0; t < kEstimateTerms; ++t) {
            const int j = j0 + t;
            const int c = h[j];
            s0 += w0 * c;
            s1 += w1 * c;
            s2 += w2 * c;
            s3 += w3 * c;
            w3 = w2;
            w2 = w1;
            w1 = w0;
            w0 = counts[k0 - j - 1];    // >= -kEstimateCells: a zero
        }
        *reinterpret_cast<int4*>(partial + warp * kEstimateCells + k0) = make_int4(s0, s1, s2, s3);
        __syncthreads();    // the partial sums are complete, and every read of depth d - 1's counts is done
        if (tid < kEstimateCells) {
            int sum = 0;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) sum += partial[w * kEstimateCells + tid];
            sum = min(sum, B);
            counts[tid] = sum;
            counted += sum;
        }
        __syncthreads();
    }
    int total;
    const int below = block_exclusive_scan(counted, wsum, total) + counted;    // paths of cell sum <= tid
    if (total < B) return 0;        // uniform: total is the block's
    // The first cell sum with B paths at or below it is the number of cell sums with fewer (the sums only grow),
    // counted by the barrier itself: no value to pass through shared memory.
    const int first = __syncthreads_count(tid < kEstimateCells && below < B);
    return max(score_bin(-(float)first / inv_w) - 1, 0);
}

// Lists this warp's share [lo, hi) of a level's nodes (keep: pool entries node_lo + j, j the level position;
// !keep: scores cur[j]) that have a counted child, at list positions lo, lo + 1, ...; returns how many. A node
// has one iff its rank-0 child counts, so the list loses nothing the passes would count (the note, "Listing").
// keep: list[q] = entry + 1. !keep: in place in cur (a node moves to a position <= its own, and a step reads all
// its positions before any lane writes).
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

// One pass of phase 2 up to kSelectNarrowFanout over kItems * kThreads / group nodes from `base` (this thread's
// candidate `rank` of each): the paths with bin >= bstar written from `at` on, node-major (item k of every warp,
// warps in order, before item k + 1); returns how many. counts: this pass's kItems * kWarps ints (double-buffered by
// the caller); one barrier.
template <int kItems>
__device__ __forceinline__ int select_materialise_pass(int base, int lo, int hi, int at, int cap, int bstar, int d,
                                                       float lp, int nodes_per_item, int node_in_pass, int rank,
                                                       uint32_t lanes_below, uint32_t* key, uint32_t* link,
                                                       int* counts) {
    constexpr int kPerLane = kItems * kWarps / 32;      // (item, warp) counts a lane scans
    static_assert(kPerLane * 32 == kItems * kWarps && (kPerLane == 1 || kPerLane == 2), "one or two counts a lane");
    const int tid = (int)threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    float x[kItems];
    uint32_t votes[kItems];
    uint32_t raw[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {   // clamped into this level, as in phase 1
        const int i = min(max(base + k * nodes_per_item + node_in_pass, lo), hi - 1);
        raw[k] = (i < 0) ? 0u : key[i];
    }
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
        const int i = base + k * nodes_per_item + node_in_pass;
        const float c = __fadd_rn(i < 0 ? 0.0f : key_score(raw[k]), lp);
        const bool ok = i < hi && c > -INFINITY && score_bin(c) >= bstar;
        x[k] = ok ? c : -INFINITY;
        votes[k] = __ballot_sync(kFull, ok);
    }
    int item_count = 0;     // lane k < kItems: this warp's count of item k
#pragma unroll
    for (int k = 0; k < kItems; ++k) item_count = (lane == k) ? __popc(votes[k]) : item_count;
    if (lane < kItems) counts[lane * kWarps + warp] = item_count;
    __syncthreads();
    // counts holds the (item, warp) counts in node order, kPerLane a lane, so one warp scan gives every offset. A
    // warp's entries all sit at the same place in their lane's pair (kWarps is even): `mine` is that one's offset.
    const int c0 = counts[kPerLane * lane];
    int sum = c0;
    if constexpr (kPerLane == 2) sum += counts[2 * lane + 1];
    const int incl = kdt::warp_inclusive_scan(sum);
    const int total = __shfl_sync(kFull, incl, 31);
    const int mine = incl - sum + ((kPerLane == 2 && (warp & 1)) ? c0 : 0);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
        const int e = at + __shfl_sync(kFull, mine, (k * kWarps + warp) / kPerLane) + __popc(votes[k] & lanes_below);
        if ((votes[k] & (1u << lane)) && e < cap) {
            const int i = base + k * nodes_per_item + node_in_pass;
            key[e] = score_key(x[k]);
            link[e] = ((uint32_t)(i + 1) << 16) | ((uint32_t)rank << 6) | (uint32_t)d;
        }
    }
    return total;
}

// Phase 2 up to kSelectNarrowFanout (two-pass layout): the paths with bin >= bstar, level by level, each level
// contiguous, each node's children contiguous in rank order. Node-major over the block: a pass looks at up to
// kSelectItems * kThreads / group nodes (half as many where the level has no more), this thread's candidate `rank`
// of each.
__device__ __forceinline__ void select_materialise_narrow(const SelectLogProbs& lps, int K, int cap, int bstar,
                                                          int group, int rank, uint32_t lanes_below, uint32_t* key,
                                                          uint32_t* link, int* wsum) {
    const int tid = (int)threadIdx.x;
    const int V = lps.fanout;
    const int nodes_per_item = kThreads / group;
    const int node_in_pass = tid / group;
    int pass = 0;
    int lo = -1, hi = 0;
    for (int d = 0; d < K && hi > lo; ++d) {
        const float lp = (rank < V) ? lps.staged_at(d, rank) : -INFINITY;
        int at = hi;
        for (int base = lo; base < hi; ++pass) {
            int* const counts = wsum + (pass & 1) * kWarps * kSelectItems;
            if (hi - base > (kSelectItems / 2) * nodes_per_item) {
                at += select_materialise_pass<kSelectItems>(base, lo, hi, at, cap, bstar, d, lp, nodes_per_item,
                                                            node_in_pass, rank, lanes_below, key, link, counts);
                base += kSelectItems * nodes_per_item;
            } else {
                at += select_materialise_pass<kSelectItems / 2>(base, lo, hi, at, cap, bstar, d, lp, nodes_per_item,
                                                                node_in_pass, rank, lanes_below, key, link, counts);
                base += (kSelectItems / 2) * nodes_per_item;
            }
        }
        __syncthreads();
        lo = hi;
        hi = min(at, cap);
    }
}

// Phase 2 above kSelectNarrowFanout (two-pass layout): the paths with bin >= bstar, level by level, each level
// contiguous after the one before, laid out as phase 1 lays them (off: a level's node offsets, cap ints).
__device__ __forceinline__ void select_materialise_wide(const SelectLogProbs& lps, int K, int cap, int bstar,
                                                        uint32_t* key, uint32_t* link, int* off, int* wsum) {
    const float floor = counted_floor(bstar);
    int lo = -1, hi = 0;            // level d's nodes: pool entries [lo, hi); -1 is the root (key[-1])
    for (int d = 0; d < K && hi > lo; ++d) {
        const int total = wide_level_layout<true>(key + lo, hi - lo, lps, d, floor, off, wsum);
        wide_level_expand<true>(key + lo, hi - lo, off, total, lps, d, [&](int j, int node, int rank, float c) {
            if (hi + j < cap) {
                key[hi + j] = score_key(c);
                link[hi + j] = ((uint32_t)(lo + node + 1) << 16) | ((uint32_t)rank << 6) | (uint32_t)d;
            }
        });
        __syncthreads();
        lo = hi;
        hi = min(hi + total, cap);
    }
}

// The select path; all threads call it (see the note, "Select path"). V = lps.fanout. Up to 32, a node's
// candidate children are the lanes of one group of `group` lanes (the power of two >= V); above (kWide), the block
// lays each level out by one scan over its nodes (wide_level_layout, wide_level_expand), and a level that would
// overflow raises the threshold first; with `estimate`, phase 1 starts at a threshold estimated from the rows
// (wide_estimated_bin). Either way a node's children come out contiguous and in rank order. Two layouts of the
// scratch:
//   kKeep (one pass over the levels): phase 1 appends every path it counts to the pool (key, link), up to `cap`
//     entries, and phase 3 ranks those with bin >= bstar (at most `cap3`);
//   !kKeep (two passes): phase 1 only counts, with two level buffers of 2 * cap scores; phase 2 materialises the
//     paths with bin >= bstar (at most cap; cap3 == cap).
// Returns false, having written nothing the serial loop reads, when a capacity is exceeded. Called once per block
// through select_build, below. scratch is not __restrict__: its words pass between threads across barriers, and
// a restrict pointer that never escapes lets the compiler move its loads across a barrier (seen: the note, "The
// threshold estimated first").
template <bool kKeep, bool kWide>
__device__ __forceinline__ bool select_build_body(const SelectLogProbs lps, int K, int B, int cap, int cap3,
                                                  bool estimate, int* scratch, int* __restrict__ rec_s,
                                                  float* __restrict__ logw_s, int* __restrict__ fc_s,
                                                  int* __restrict__ ns_s, int* __restrict__ misc) {
    int* const hist = scratch;                          // [kBins] paths per bin (phase 1), then a cursor
    int* const offs = hist + kBins;                     // [kBins] ranked entries in higher bins
    int* const wsum = offs + kBins;                     // [2][64] per-(item, warp) counts, double-buffered
    int* const var = wsum + 2 * kWarps * kSelectItems;  // [kSelectVars] scalars (SelectVar)
    uint32_t* const key = reinterpret_cast<uint32_t*>(var + kSelectVars);   // the pool: score keys
    uint32_t* const link = key + cap;                   //           (parent + 1) << 16 | rank << 6 | depth - 1
    int* const slot_of = reinterpret_cast<int*>(link + cap);      //   slot, or -1; keep, phase 1: the level lists
    int* const sorted = slot_of + cap;                  // phase 3: ranked entries grouped by bin
    uint32_t* const sorted_key = reinterpret_cast<uint32_t*>(sorted + cap3);   // and their keys
    float* const lvl0 = reinterpret_cast<float*>(var + kSelectVars);   // !keep, phase 1: two level buffers of 2 * cap
    float* const lvl1 = lvl0 + 2 * cap;
    const int V = lps.fanout;                           // the ranks a build can read

    const int tid = (int)threadIdx.x;
    const int lane = tid & 31;
    const uint32_t lanes_below = (1u << lane) - 1u;
    __syncthreads();    // a failed attempt's last reads of var come before this attempt's resets
    int group = 1;
    while (group < min(V, kSelectNarrowFanout)) group *= 2;
    const int rank = tid & (group - 1);                 // this thread's candidate rank (narrow fan-out)

    // The wide kind may start from a threshold estimated from the rows (in hist and offs, before they are used).
    int first_bin = 0;
    if constexpr (kWide)
        if (estimate) first_bin = wide_estimated_bin(lps, K, B, offs, hist, wsum);
    for (int i = tid; i < kBins; i += kThreads) hist[i] = 0;
    if (tid == 0) {
        var[kVarNext] = 0;
        var[kVarOverflow] = 0;
        var[kVarLowBin] = kBins;
        reinterpret_cast<uint32_t*>(var)[kVarRootKey] = score_key(0.0f);     // key[-1]
        if (!kKeep) lvl0[0] = 0.0f;     // level 0: the root
    }
    __syncthreads();

    // Phase 1 (the note, "Phase 1"): level by level, count every path whose bin is >= the running threshold bin
    // bstar, then raise bstar to the highest bin with at least B counted paths in it or above. `above` counts the
    // paths with bin >= bstar. Level d's n nodes: keep, pool entries [node_lo, node_lo + n) (-1: the root);
    // !keep, cur[0, n). Narrow: warp w lists its share's nodes with a counted child and passes over its list with
    // 1..kSelectItems1 items per lane; then every warp moves the threshold itself from the same histogram (bstar
    // and above stay in registers). Two barriers per level: the counts are complete before the walks read them,
    // and every walk is done before the next level's passes change them.
    int bstar = first_bin;  // the threshold bin (phase 1: running; then final)
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
            if constexpr (kWide) {
                // A lane per node is too coarse here (a node may have hundreds of children): the block lays the
                // level out by one scan over its nodes and writes the children strided (the note, "Wide V").
                const uint32_t* const nodes = kKeep ? key + node_lo : reinterpret_cast<const uint32_t*>(cur);
                int* const off = kKeep ? slot_of : reinterpret_cast<int*>(lvl0 + 4 * cap);
                const int room = kKeep ? cap - child_lo : cap;      // !keep: a level, so its offsets fit off
                int total = wide_level_layout<kKeep>(nodes, n, lps, d, counted_floor(bstar), off, wsum);
                if (total > room) {
                    // Too many paths at this threshold (a wide level multiplies them by up to V): raise it first,
                    // to the highest bin with B paths at or above it, the earlier levels' (hist) and this level's.
                    int lo_bin = bstar, hi_bin = kBins;
                    while (hi_bin - lo_bin > 1) {
                        const int mid = (lo_bin + hi_bin) >> 1;
                        if (wide_paths_from_bin<kKeep>(mid, hist, nodes, n, lps, d, wsum) >= B) lo_bin = mid;
                        else hi_bin = mid;
                    }
                    if (lo_bin > bstar) {
                        above = wide_paths_from_bin<kKeep>(lo_bin, hist, nodes, 0, lps, d, wsum);
                        bstar = lo_bin;
                        total = wide_level_layout<kKeep>(nodes, n, lps, d, counted_floor(bstar), off, wsum);
                    }
                    if (total > room) return false;
                }
                uint32_t low_code = 0u;     // the largest bin code (the lowest bin) of this thread's children
                wide_level_expand<kKeep>(nodes, n, off, total, lps, d, [&](int j, int node, int r, float c) {
                    const uint32_t code = counted_bin_code(c);
                    atomicAdd(&hist[kBinOfCode - (int)code], 1);
                    low_code = max(low_code, code);
                    if constexpr (kKeep) {
                        key[child_lo + j] = kdt::ordered_key(c);    // == score_key(c): a counted score is finite
                        link[child_lo + j] = ((uint32_t)(node_lo + node + 1) << 16) | ((uint32_t)r << 6) | (uint32_t)d;
                    } else {
                        nxt[j] = c;
                    }
                });
                low_code = __reduce_max_sync(kFull, low_code);
                if (lane == 0 && low_code != 0u) atomicMin(&var[kVarLowBin], kBinOfCode - (int)low_code);
                if (tid == 0) var[kVarNext] = child_lo + total;
            } else {
                const float count_floor = counted_floor(bstar);
                const int share = (n + kWarps - 1) / kWarps;
                const int lo = min((tid >> 5) * share, n);
                const int hi = min(lo + share, n);
                const int listed = select_list_level<kKeep>(key, node_lo, cur, list, lo, hi, lps.staged_at(d, 0),
                                                            count_floor, lanes_below);
                level.scores = cur;
                level.child_scores = nxt;
                level.end = lo + listed;
                level.lp = (rank < V) ? lps.staged_at(d, rank) : -INFINITY;
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
        // Phase 2: materialise the paths with bin >= bstar level by level, in a stable order.
        if constexpr (kWide) select_materialise_wide(lps, K, cap, bstar, key, link, slot_of, wsum);
        else select_materialise_narrow(lps, K, cap, bstar, group, rank, lanes_below, key, link, wsum);
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

// The called copy takes the log-probs' fields one by one: a pointer inside a by-value struct hides from the
// compiler that every call passes shared memory, and the staged reads became generic loads (the note, "Inlined
// or called").
template <bool kKeep, bool kWide>
__device__ __noinline__ bool select_build_called(const float* staged, const float* global, int staged_cols, int cols,
                                                 int fanout, int K, int B, int cap, int cap3,
                                                 bool estimate, int* scratch, int* __restrict__ rec_s,
                                                 float* __restrict__ logw_s, int* __restrict__ fc_s,
                                                 int* __restrict__ ns_s, int* __restrict__ misc) {
    const SelectLogProbs lps{staged, global, staged_cols, cols, fanout};
    return select_build_body<kKeep, kWide>(lps, K, B, cap, cap3, estimate, scratch, rec_s, logw_s, fc_s, ns_s, misc);
}

// The select path, one layout (kKeep) of one kind (kWide). The wide kind's two-pass layout is inlined into its
// kernel, every other layout is a call (one copy each): inlined, the narrow kind and the wide one-pass layout
// measured 2-5% slower on the H200, the wide two-pass layout 6-9% faster (the note, "Inlined or called").
template <bool kKeep, bool kWide>
__device__ __forceinline__ bool select_build(const SelectLogProbs lps, int K, int B, int cap, int cap3, bool estimate,
                                             int* scratch, int* __restrict__ rec_s, float* __restrict__ logw_s,
                                             int* __restrict__ fc_s, int* __restrict__ ns_s, int* __restrict__ misc) {
    if constexpr (kWide && !kKeep)
        return select_build_body<kKeep, kWide>(lps, K, B, cap, cap3, estimate, scratch, rec_s, logw_s, fc_s, ns_s,
                                               misc);
    else
        return select_build_called<kKeep, kWide>(lps.staged, lps.global, lps.staged_cols, lps.cols, lps.fanout, K, B,
                                                 cap, cap3, estimate, scratch, rec_s, logw_s, fc_s, ns_s, misc);
}

}  // namespace
