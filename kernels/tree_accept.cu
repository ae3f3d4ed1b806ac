// tree_accept.cu: greedy acceptance of a DDTree draft tree (contract section `tree-accept`).
//
// Two entry points; each serves the whole batch in ONE launch (graph-capturable, no host sync):
//
//   tree_accept_from_predict  inputs token, first_child, next_sibling, target_predict   int32 [G, N]
//   tree_accept_from_logits   inputs token, first_child, next_sibling int32 [G, N] and target_logits
//                             [G, N, vocab] float32 or bf16 (uint16 raw bits); the argmax per slot is fused.
//
//   outputs (both): accept_len int32 [G]; accept_index, accept_tokens int32 [G, K+1]. Every element is written.
//   n_nodes is not read: the walk is defined by the pointers alone (slots past n_nodes are unreachable in a
//   well-formed tree, and a pointer into them is still a pointer inside [0, N)).
//
// ALGORITHM (the walk, identical in both entry points; run by lane 0 of one warp from shared memory)
//   Staging: the request's rows are loaded with coalesced loads into shared memory as one 16-byte record per
//   slot {token, next_sibling link, predict, first_child link}. A link is the shared-memory address of the
//   target record; -1 and any pointer outside [0, N) link to a sentinel record rec[N], so no later access can
//   leave the staged rows.
//   Walk: cur = 0; while fewer than K nodes are accepted: scan the children of cur (first_child, then
//   next_sibling); the first whose token equals predict[cur] is accepted and becomes cur. Stop when the scan
//   ends without a match. Bonus = predict[cur] (slot 0's if nothing was accepted). Before each scan the
//   sentinel's token is set to predict[cur], so the scan loop is: r = ld.shared.v4 [link]; exit if
//   r.token == want (or the step bound); link = r.next. One dependent shared load + one compare per step;
//   an accepted record already holds its predict and first-child link, so descending costs nothing extra.
//   Robustness (bad trees; the reference raises for every one of these, the kernel stops the walk there and
//   treats it as "no match": outputs fully written, bonus = predict at the current node):
//     - a pointer outside [0, N) other than -1: links to the sentinel -> the scan ends, no match;
//     - a sibling scan longer than N steps (a cycle in a sibling list): the scan is cut after N + 1 loads;
//     - a match on a slot already on the accepted path (root included: a cycle through first_child): stop.
//   Every loop is bounded: a scan by N + 1 loads, the walk by min(K, N-1) accepted nodes (a path bitmap keeps
//   accepted slots distinct), so the worst adversarial walk is (min(K, N-1) + 1) * (N + 1) shared loads;
//   a well-formed tree scans each non-root slot at most once (<= N-1 steps in all).
//   Equal to refs/tree_accept.py on every input it does not reject: its per-scan `seen` check can only fire
//   on a repeat, and a scan without repeats visits at most N slots; its `child in path` check is the bitmap.
//
// tree_accept_from_predict: LAUNCH grid = ceil(G / kdt_tree_accept_walk_warps) blocks of 32 * walk_warps
//   threads (walk_warps = 1: one warp, one request per block; G = 256 -> 256 blocks, ~2 per SM), static
//   shared memory 16.5 KB per warp (sized for kMaxNodes), no workspace.
//   TRAFFIC: reads 16 B per slot (4 int32 rows), writes 4 + 8 (K+1) B per request: G=256, N=256 -> 1 MiB.
//   LATENCY: one DRAM round trip for the staging (up to 8 x 4 independent 4-byte loads per lane in flight,
//   each warp instruction a coalesced 128 B), then ~30-40 cycles per scan step (shared-load latency), then
//   the stores. Worst well-formed tree at N = 256: 255 steps ~ 5 us; typical DDTree trees: tens of steps.
//
// tree_accept_from_logits: LAUNCH grid = G * N * S blocks of kdt_tree_accept_argmax_threads (256) threads,
//   S = vocab splits per row (launcher picks S so that small batches still fill the GPU; S = 1 for
//   G = N = 64 on an H200: 4096 rows already fill 132 SMs x 4 blocks ~8 times). Block b handles row r = b / S (= request g = r / N, slot r % N), split s = b % S.
//   Phase 1 (all blocks): argmax of its part of the row. 16-byte loads (ld.global.cs, streamed once),
//   kArgmaxUnroll = 8 per thread in flight, consecutive threads on consecutive 16 B, in ascending order per
//   thread. bf16: the 8 values of a vector are reduced with 3 max.bf16x2 and one fmax, and the vector is kept only
//   when its max beats the thread's best strictly (so the first vector holding the maximum wins); the position
//   inside the winning vector is resolved once at the end. float32 the same with 4 values per vector.
//   The row head before the first 16-byte boundary and the tail after the last whole vector (rows not 16-byte
//   aligned, vocab not a multiple of the vector width) are read with scalar loads by split 0.
//   Ties: (value, index) compared lexicographically, larger value, then smaller index, with -0.0 == +0.0
//   (float comparison; the packed key maps -0.0 to +0.0). NaN is rejected before launch; -inf is legal (a
//   row of -inf gives index 0).
//   Phase 2: the block's (value, index) is packed into a 64-bit key (order-preserving float bits << 32 |
//   ~index) and merged into workspace key[r] with atomicMax: key[g, slot] is the per-slot argmax in the
//   workspace. __threadfence, then atomicAdd on the per-request counter count[g]; the block that brings it to
//   N * S is the last of request g: it reads and zeroes the request's keys (atomicExch), zeroes count[g],
//   stages the tree rows plus the argmax in shared memory and runs the walk (warp 0). The workspace is back
//   to all-zero when the launch ends.
//   WORKSPACE: G * N * 8 B (keys, at offset 0, 8-byte aligned) + G * 4 B (counters); zero on entry.
//   TRAFFIC: G * N * vocab * elem_size read once (G = N = 64, vocab = 163840, bf16: 1.34 GB ~ 0.33 ms at
//   4 TB/s); everything else < 0.1%. Static shared memory 16.5 KB per block; registers capped at 64
//   (__launch_bounds__(256, 4)) so >= 4 blocks = 128 KB of loads in flight per SM.
//
// LIMITS (the launcher raises a clear error beyond): 1 <= N <= kdt_tree_accept_max_nodes (1024);
//   K >= 0 (contract: K >= 1); 1 <= vocab < 2^31; G * N * S < 2^31 blocks. Token / predict values are any
//   int32 (compared for equality only).

#include <cstdint>

#include "common/bits.cuh"

namespace {

constexpr int kMaxNodes = 1024;        // slots per request (static shared staging: 16 B per slot)
constexpr int kWalkWarps = 1;          // requests (warps) per block in tree_accept_from_predict
constexpr int kArgmaxThreads = 256;    // threads per block in tree_accept_from_logits
constexpr int kArgmaxMinBlocks = 4;    // -> <= 64 registers per thread
constexpr int kArgmaxUnroll = 8;       // 16-byte loads in flight per thread
constexpr int kSplitMinVectors = kArgmaxThreads * 4;  // a vocab split is at least this many 16-byte vectors
constexpr int kIntMax = 0x7FFFFFFF;

static_assert(kMaxNodes % 32 == 0, "path bitmap words");
static_assert(kArgmaxThreads % 32 == 0 && kArgmaxThreads <= 1024, "whole warps");

}  // namespace

extern "C" {
__constant__ int kdt_tree_accept_max_nodes = kMaxNodes;
__constant__ int kdt_tree_accept_walk_warps = kWalkWarps;
__constant__ int kdt_tree_accept_argmax_threads = kArgmaxThreads;
__constant__ int kdt_tree_accept_argmax_min_blocks = kArgmaxMinBlocks;
__constant__ int kdt_tree_accept_split_min_vectors = kSplitMinVectors;
}

namespace {

// ------------------------------------------------------------------------------------------------ helpers

using kdt::bits_to_float;
using kdt::float_to_bits;

// Element-wise max of two bf16 pairs (NaN never reaches the kernel; which zero max(-0, +0) returns does not
// matter: all later comparisons are float comparisons, where -0.0 == +0.0).
__host__ __device__ __forceinline__ uint32_t bf16x2_max(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    uint32_t d;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
#else
    const uint32_t lo = bits_to_float(a << 16) >= bits_to_float(b << 16) ? (a & 0xFFFFu) : (b & 0xFFFFu);
    const uint32_t hi = bits_to_float(a & 0xFFFF0000u) >= bits_to_float(b & 0xFFFF0000u) ? (a & 0xFFFF0000u)
                                                                                        : (b & 0xFFFF0000u);
    return hi | lo;
#endif
}

__host__ __device__ __forceinline__ uint4 load_stream(const uint4* p) {
#ifdef __CUDA_ARCH__
    return __ldcs(p);  // read once: evict-first
#else
    return *p;
#endif
}

// Element e of a 16-byte vector as float.
template <bool kBf16>
__host__ __device__ __forceinline__ float vec_elem(const uint4& q, int e) {
    const uint32_t w = (e >> (kBf16 ? 1 : 0)) == 0 ? q.x : (e >> (kBf16 ? 1 : 0)) == 1 ? q.y
                     : (e >> (kBf16 ? 1 : 0)) == 2 ? q.z : q.w;
    if constexpr (kBf16) {
        return bits_to_float((e & 1) ? (w & 0xFFFF0000u) : (w << 16));
    } else {
        return bits_to_float(w);
    }
}

template <bool kBf16>
__host__ __device__ __forceinline__ float vec_max(const uint4& q) {
    if constexpr (kBf16) {
        const uint32_t m = bf16x2_max(bf16x2_max(q.x, q.y), bf16x2_max(q.z, q.w));
        return fmaxf(bits_to_float(m << 16), bits_to_float(m & 0xFFFF0000u));
    } else {
        return fmaxf(fmaxf(bits_to_float(q.x), bits_to_float(q.y)), fmaxf(bits_to_float(q.z), bits_to_float(q.w)));
    }
}

// (av, ai) beats (bv, bi): larger value, then smaller index; -0.0 == +0.0 (float comparison).
__host__ __device__ __forceinline__ bool beats(float av, int ai, float bv, int bi) {
    return av > bv || (av == bv && ai < bi);
}

// 64-bit key whose unsigned order is the `beats` order: order-preserving float bits, then ~index.
__host__ __device__ __forceinline__ unsigned long long pack_key(float v, int idx) {
    uint32_t u = (v == 0.0f) ? 0u : float_to_bits(v);  // -0.0 -> +0.0
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);      // kdt::ordered_key's map, in the form kept verified
    return (static_cast<unsigned long long>(u) << 32) | static_cast<unsigned long long>(~static_cast<uint32_t>(idx));
}

__host__ __device__ __forceinline__ int key_index(unsigned long long key) {
    return static_cast<int>(~static_cast<uint32_t>(key));
}

// The argmax (value, index) that thread `tid` of `nthreads` sees in split `split` of `splits` of one row.
// `row` is the row's first element (any element-size alignment). Indices are row-relative.
// Vectors handled by a thread are visited in ascending order and a vector replaces the thread's best only
// when its max is strictly larger, so the thread keeps the first occurrence of its maximum.
template <bool kBf16>
__host__ __device__ __forceinline__ void scan_row_part(const void* row, int vocab, int split, int splits, int tid,
                                                       int nthreads, float& best, int& best_idx) {
    constexpr int kElem = kBf16 ? 2 : 4;
    constexpr int kVec = 16 / kElem;
    constexpr uint32_t kNegInf = kBf16 ? 0xFF80FF80u : 0xFF800000u;  // -inf in every lane of a word
    const unsigned char* bytes = static_cast<const unsigned char*>(row);
    const uintptr_t addr = reinterpret_cast<uintptr_t>(bytes);
    int head = static_cast<int>(((16u - static_cast<uint32_t>(addr & 15u)) & 15u) / kElem);
    head = head < vocab ? head : vocab;
    const int nvec = (vocab - head) / kVec;
    const int tail = head + nvec * kVec;
    const int chunk = (nvec + splits - 1) / splits;
    const int v0 = split * chunk < nvec ? split * chunk : nvec;
    const int v1 = v0 + chunk < nvec ? v0 + chunk : nvec;
    const uint4* vp = reinterpret_cast<const uint4*>(bytes + static_cast<size_t>(head) * kElem);

    float bv = bits_to_float(0xFF800000u);  // -inf
    int bvi = v0 + tid;                     // first vector of this thread (>= v1: none)
    uint4 bq = make_uint4(kNegInf, kNegInf, kNegInf, kNegInf);
    int v = v0 + tid;
#pragma unroll 1
    for (; v + (kArgmaxUnroll - 1) * nthreads < v1; v += kArgmaxUnroll * nthreads) {
        uint4 q[kArgmaxUnroll];
#pragma unroll
        for (int u = 0; u < kArgmaxUnroll; ++u) q[u] = load_stream(vp + v + u * nthreads);
#pragma unroll
        for (int u = 0; u < kArgmaxUnroll; ++u) {
            const float m = vec_max<kBf16>(q[u]);
            if (m > bv) {
                bv = m;
                bvi = v + u * nthreads;
                bq = q[u];
            }
        }
    }
#pragma unroll 1
    for (; v < v1; v += nthreads) {
        const uint4 q = load_stream(vp + v);
        const float m = vec_max<kBf16>(q);
        if (m > bv) {
            bv = m;
            bvi = v;
            bq = q;
        }
    }
    // Resolve the position inside the winning vector (the first element equal to its max; the initial
    // all -inf vector stands for "every value of this thread is -inf": its first element then).
    int bi = kIntMax;
    if (bvi < v1) {
        int k = kVec - 1;
#pragma unroll
        for (int e = kVec - 1; e >= 0; --e)
            if (vec_elem<kBf16>(bq, e) == bv) k = e;
        bi = head + bvi * kVec + k;
    } else {
        bv = bits_to_float(0xFF800000u);
    }
    // Scalar head and tail (fewer than 2 * kVec elements per row), by split 0.
    if (split == 0) {
        for (int e = tid; e < head; e += nthreads) {
            const float x = kBf16 ? bits_to_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(bytes)[e]) << 16)
                                  : reinterpret_cast<const float*>(bytes)[e];
            if (beats(x, e, bv, bi)) { bv = x; bi = e; }
        }
        for (int e = tail + tid; e < vocab; e += nthreads) {
            const float x = kBf16 ? bits_to_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(bytes)[e]) << 16)
                                  : reinterpret_cast<const float*>(bytes)[e];
            if (beats(x, e, bv, bi)) { bv = x; bi = e; }
        }
    }
    best = bv;
    best_idx = bi;
}

// ------------------------------------------------------------------------------------------------ the walk

// One 16-byte record per slot. Links are shared-memory addresses of records (on the host, for tests: byte
// offsets into rec[]), so a scan step is one shared load whose result is the next load's address: nothing
// but the load and one compare on the dependent chain. "None" (and any pointer outside [0, N)) links to the
// sentinel record rec[n], whose token is set to the scanned-for prediction before each scan, so the scan
// loop has a single exit test.
struct WalkSmem {
    uint4 rec[kMaxNodes + 1];        // {token, next_sibling link, predict, first_child link}; rec[n]: sentinel
    uint32_t path[kMaxNodes / 32];   // bit j: slot j is on the accepted path
};

// Links are byte offsets into rec[] (slot * 16), so one step of a sibling scan is one 16-byte shared load at
// rec + link. Plain C++ indexing rather than a cvta'd shared address in inline PTX: the compiler still emits
// LDS.128 (it infers the shared window from `smem`), and tools that relocate shared memory (compute-sanitizer
// racecheck) see an ordinary access.
__host__ __device__ __forceinline__ uint32_t link_base(const WalkSmem& s) {
    (void)s;
    return 0u;
}

__host__ __device__ __forceinline__ uint4 load_rec(const WalkSmem& s, uint32_t link) {
    return *reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned char*>(s.rec) + link);
}

__host__ __device__ __forceinline__ uint32_t link_of(int p, int n, uint32_t base) {
    return base + (static_cast<uint32_t>(p) < static_cast<uint32_t>(n) ? static_cast<uint32_t>(p)
                                                                       : static_cast<uint32_t>(n)) * 16u;
}

__host__ __device__ __forceinline__ uint4 make_rec(int tok, int fc, int ns, int pred, int n, uint32_t base) {
    return make_uint4(static_cast<uint32_t>(tok), link_of(ns, n, base), static_cast<uint32_t>(pred),
                      link_of(fc, n, base));
}

// The sequential walk over staged rows (rec[0..n) filled, path[] zeroed). Stores accept_index[1..len] and
// accept_tokens[0..len-1] of the request's output rows as it goes; returns len, the bonus in `bonus`.
__host__ __device__ __forceinline__ int walk_core(WalkSmem& s, int n, int k, int* __restrict__ index_row,
                                                  int* __restrict__ tokens_row, int& bonus) {
    const uint32_t base = link_base(s);
    const uint32_t sentinel = base + static_cast<uint32_t>(n) * 16u;
    int len = 0;
    uint4 cur = s.rec[0];
    s.path[0] = 1u;
    s.rec[n] = make_uint4(0u, sentinel, 0u, sentinel);
    while (len < k) {                               // <= min(K, N-1) rounds (path slots are distinct)
        const uint32_t want = cur.z;
        s.rec[n].x = want;                          // the sentinel ends the scan as a "match"
        uint32_t link = cur.w;
        uint4 r;
        int step = 0;
        for (;;) {                                  // <= N + 1 loads: N distinct slots, then a repeat
            r = load_rec(s, link);
            ++step;
            if ((r.x == want) | (step > n)) break;  // one exit test on the dependent chain
            link = r.y;
        }
        if (r.x != want) break;                     // a sibling scan longer than N steps: a cycle, stop
        if (link == sentinel) break;                // no match (or a pointer outside [0, N)): stop
        const uint32_t found = (link - base) >> 4;
        const uint32_t bit = 1u << (found & 31u);
        if (s.path[found >> 5] & bit) break;        // already on the path (a cycle through first_child)
        s.path[found >> 5] |= bit;
        ++len;
        index_row[len] = static_cast<int>(found);
        tokens_row[len - 1] = static_cast<int>(r.x);
        cur = r;
    }
    bonus = static_cast<int>(cur.z);
    return len;
}

// The walk of request g, called by one whole warp once `s` is staged and visible to it.
// Lane 0 walks and stores accepted entries as it goes; then the warp writes slot 0, the bonus and the padding.
__device__ __forceinline__ void walk_and_write(WalkSmem& s, int g, int n, int k, int lane, int* __restrict__ accept_len,
                                               int* __restrict__ accept_index, int* __restrict__ accept_tokens) {
    int* index_row = accept_index + static_cast<size_t>(g) * static_cast<size_t>(k + 1);
    int* tokens_row = accept_tokens + static_cast<size_t>(g) * static_cast<size_t>(k + 1);
    int len = 0;
    int bonus = 0;
    if (lane == 0) len = walk_core(s, n, k, index_row, tokens_row, bonus);
    len = __shfl_sync(0xFFFFFFFFu, len, 0);
    bonus = __shfl_sync(0xFFFFFFFFu, bonus, 0);
    for (int j = lane; j <= k; j += 32) {
        if (j == 0) index_row[0] = 0;
        else if (j > len) index_row[j] = -1;
        if (j == len) tokens_row[j] = bonus;
        else if (j > len) tokens_row[j] = -1;
    }
    if (lane == 0) accept_len[g] = len;
}

}  // namespace

// ------------------------------------------------------------------------------------------------ entry 1

extern "C" __global__ void __launch_bounds__(kWalkWarps * 32)
tree_accept_from_predict(const int* __restrict__ token, const int* __restrict__ first_child,
                         const int* __restrict__ next_sibling, const int* __restrict__ target_predict, int num_groups,
                         int num_slots, int max_depth, int* __restrict__ accept_len, int* __restrict__ accept_index,
                         int* __restrict__ accept_tokens) {
    __shared__ WalkSmem smem[kWalkWarps];
    const int warp = kWalkWarps == 1 ? 0 : static_cast<int>(threadIdx.x) >> 5;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int g = static_cast<int>(blockIdx.x) * kWalkWarps + warp;
    if (g >= num_groups) return;  // whole warp; no block-wide barrier below
    WalkSmem& s = smem[warp];
    const int n = num_slots;
    const size_t base = static_cast<size_t>(g) * static_cast<size_t>(n);
    const uint32_t lbase = link_base(s);
    constexpr int kStageUnroll = 8;  // 4 x 8 independent 4-byte loads per lane in flight
    for (int j0 = 0; j0 < n; j0 += 32 * kStageUnroll) {  // <= kMaxNodes / 256 rounds
        int t[kStageUnroll], f[kStageUnroll], x[kStageUnroll], p[kStageUnroll];
#pragma unroll
        for (int u = 0; u < kStageUnroll; ++u) {
            const int j = j0 + u * 32 + lane;
            if (j < n) {
                t[u] = __ldg(token + base + j);
                f[u] = __ldg(first_child + base + j);
                x[u] = __ldg(next_sibling + base + j);
                p[u] = __ldg(target_predict + base + j);
            }
        }
#pragma unroll
        for (int u = 0; u < kStageUnroll; ++u) {
            const int j = j0 + u * 32 + lane;
            if (j < n) s.rec[j] = make_rec(t[u], f[u], x[u], p[u], n, lbase);
        }
    }
    for (int w = lane; w < (n + 31) / 32; w += 32) s.path[w] = 0u;
    __syncwarp();
    walk_and_write(s, g, n, max_depth, lane, accept_len, accept_index, accept_tokens);
}

// ------------------------------------------------------------------------------------------------ entry 2

extern "C" __global__ void __launch_bounds__(kArgmaxThreads, kArgmaxMinBlocks)
tree_accept_from_logits(const void* __restrict__ target_logits, int logits_bf16, int vocab, int splits,
                        const int* __restrict__ token, const int* __restrict__ first_child,
                        const int* __restrict__ next_sibling, int num_groups, int num_slots, int max_depth,
                        unsigned char* __restrict__ workspace, int* __restrict__ accept_len,
                        int* __restrict__ accept_index, int* __restrict__ accept_tokens) {
    __shared__ WalkSmem s;
    __shared__ float red_v[kArgmaxThreads / 32];
    __shared__ int red_i[kArgmaxThreads / 32];
    __shared__ int is_last;

    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int n = num_slots;
    const int split = static_cast<int>(blockIdx.x % static_cast<unsigned>(splits));
    const size_t row = blockIdx.x / static_cast<unsigned>(splits);  // g * N + slot
    const int g = static_cast<int>(row / static_cast<size_t>(n));
    unsigned long long* keys = reinterpret_cast<unsigned long long*>(workspace);
    unsigned int* counts =
        reinterpret_cast<unsigned int*>(workspace + static_cast<size_t>(num_groups) * static_cast<size_t>(n) * 8u);

    // Phase 1: this block's argmax over its part of the row.
    float bv;
    int bi;
    if (logits_bf16) {
        const void* r = static_cast<const unsigned char*>(target_logits) + row * static_cast<size_t>(vocab) * 2u;
        scan_row_part<true>(r, vocab, split, splits, tid, kArgmaxThreads, bv, bi);
    } else {
        const void* r = static_cast<const unsigned char*>(target_logits) + row * static_cast<size_t>(vocab) * 4u;
        scan_row_part<false>(r, vocab, split, splits, tid, kArgmaxThreads, bv, bi);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_down_sync(0xFFFFFFFFu, bv, off);
        const int oi = __shfl_down_sync(0xFFFFFFFFu, bi, off);
        if (beats(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) { red_v[warp] = bv; red_i[warp] = bi; }
    __syncthreads();

    // Phase 2: merge into the workspace; the last block of the request runs its walk.
    if (tid == 0) {
        for (int w = 1; w < kArgmaxThreads / 32; ++w)
            if (beats(red_v[w], red_i[w], bv, bi)) { bv = red_v[w]; bi = red_i[w]; }
        atomicMax(keys + row, pack_key(bv, bi));
        __threadfence();  // the key before the count
        const unsigned int done = atomicAdd(counts + g, 1u);
        is_last = (done == static_cast<unsigned int>(n) * static_cast<unsigned int>(splits) - 1u) ? 1 : 0;
    }
    __syncthreads();
    if (!is_last) return;  // block-uniform
    __threadfence();       // every other block of request g has published its key
    const size_t base = static_cast<size_t>(g) * static_cast<size_t>(n);
    const uint32_t lbase = link_base(s);
    for (int j = tid; j < n; j += kArgmaxThreads) {  // <= kMaxNodes / 256 rounds
        const unsigned long long key = atomicExch(keys + base + j, 0ull);  // read and leave zero
        s.rec[j] = make_rec(__ldg(token + base + j), __ldg(first_child + base + j), __ldg(next_sibling + base + j),
                            key_index(key), n, lbase);
    }
    for (int w = tid; w < (n + 31) / 32; w += kArgmaxThreads) s.path[w] = 0u;
    if (tid == 0) atomicExch(counts + g, 0u);
    __syncthreads();
    if (warp == 0) walk_and_write(s, g, n, max_depth, lane, accept_len, accept_index, accept_tokens);
}
