// kernels/topk.cu -- `topk` stage: drafter logits [G, K, vocab] -> per-row top-V ids and log-probabilities.
//
// Contract (plans/contracts.md, section `topk`):
//   logits   float32 or bf16 (uint16 raw bits) [R = G*K rows, vocab], vocab <= 262144
//   top_ids  int32   [R, V]  the V largest logits of the row, descending; equal logits -> smaller id first
//   top_logp float32 [R, V]  logit - logsumexp(row)
//   1 <= V <= min(vocab, 1024).  -inf logits are legal (rank last, ties by id, logp = -inf).  The validator
//   rejects NaN and rows without a finite logit before launch; +inf is assumed rejected too (the float64
//   reference would give NaN).  -0.0 and +0.0 compare equal (the id decides).
//
// Ordering key.  Every logit x maps to the order-preserving uint32 key  f2key(x)  (-0.0 first mapped to +0.0;
// -inf -> 0x007fffff, so key 0 is below every legal logit and marks an empty slot).  The total order used
// everywhere is (key desc, id asc); ids are unique, so it is strict.
//
// Softmax statistics.  One read of the logits.  Small path (struct Softmax): each thread keeps an online
// (m, b, s) with m the running max and s = sum exp(x - b) in a base b >= m, updated once per group (one step:
// 16 f32 / 32 bf16 elements): the group max first; if it exceeds b, b moves to fl(gm + BASE_MARGIN) (4) and s
// is rescaled (the margin absorbs the slow growth of a running max, so after the first groups this is rare
// and sits behind the warp vote of the gate test); then a pairwise tree of the group's exponentials.
// exp(x - b) = ex2.approx.ftz(a) with a = fl(x*log2e - bL), one FFMA, bL = fl(b*log2e), while |b| <= 65536
// (FUSED_MAX_B); every term then carries the factor 2^r of the residual r = b*log2e - bL (exact by an FMA), and
// the group sum is multiplied by c = ex2(-r).  Beyond that (rows of huge logits, where 2^r overflows) the
// exact mode a = fl(fl(x - b)*log2e).  When its scan ends a thread moves s to the base m (s *= ex2((b - m)*
// log2e), 0 <= b - m <= ~4), so the merges and the output see (m, sum exp(x - m)), as on the general path,
// where (m, s) is kept directly (s rescaled whenever m grows; exp(x - m) = ex2(fl(fl(x - m)*log2e))).
// Error budget (|logp - ref| <= 1e-5 for logits up to ~30), small path, d = x - m: a term's relative error
// is <= 7.3e-8*|d| + 2.4e-7 (the one rounding of a: 2^-24 of |x - b| <= |d| + 4, i.e. 6e-8*|d| + 2.4e-7;
// log2e's own relative error 1.3e-8*|d|) + 2.4e-7 (ex2.approx, 2 ulp) + 9.6e-7 common to all terms (c's ex2:
// 2.4e-7; the final move to the base m: its ex2 and the two roundings of (b - m)*log2e, 7.2e-7); the exact
// mode has ~1.5*2^-24 of |x - b| instead of 2^-24; each of the few rebases scales the older part of s by one
// more ex2 (2.4e-7).  The e^d-weighted mean of |d| stays < ~10 for any realistic row, so sum(exp) is off by
// < 2.5e-6 relative (general path: d = fl(x - m) and fl(d*log2e) carry ~1.5*2^-24 of |d|, a term
// 2.4e-7 + 9e-8*|d|, the sum < 1.2e-6).  The pairwise trees keep the serial accumulation chain
// <= vocab / (threads * 16) adds (<= 64 here).  The result is written as logp = (x - m) - logf(s) (x - m is
// exact for the top entries; logf is the accurate libm logf, then one rounding of the difference), so the
// total stays below ~4e-6.  m (and b) start at -FLT_MAX (not -inf) so that no inf - inf ever occurs.
//
// ---------------------------------------------------------------------------------------------------------
// Fast path, V <= 32: kdt_topk_small_{f32,bf16}_v{1,2,4,8,16,32} (VT = template bound, runtime V <= VT),
// and kdt_topk_cluster_{f32,bf16}_v{VT}: the same with S = kdt_topk_cluster_size blocks per row in one
// cluster (16 on sm_90, 8 on sm_120).
//   launch: grid = R * S blocks (block b -> row b / S, split b % S), 256 threads, 41.2 KB static smem plus
//   kdt_topk_small_stage_bytes of dynamic smem (sm_90: 32 KB, a 2-step cp.async ring; sm_120: 0).
//   __launch_bounds__(256, SMALL_MIN_BLOCKS): sm_90 3 blocks (<= 80 registers, 3 x 74 KB smem per SM);
//   sm_120 2 blocks (what its ~100 KB of shared memory per SM holds); no spills on either.
//   Each block owns the columns [split*chunk, min(vocab, (split+1)*chunk)) of its row (chunk from the
//   launcher, a multiple of 64).  The body of the range is read with 16-byte loads (float4 / 8 x bf16), U=4
//   per thread and step, coalesced (vector index = step*U*256 + warp*U*32 + u*32 + lane: each warp reads U
//   rows of 32 consecutive vectors, and a thread's U addresses lie within the +-2 KB immediate offset of
//   LDGSTS from one another, so a step's copies need one 64-bit address); the unaligned head and the tail
//   (< 16 bytes each, e.g. odd vocab) are read as scalars by lanes of warp 0.
//   Step 0 loads into registers; the later steps (the partial last one too, so that a short range has all
//   its loads in flight from the start) stream through the cp.async ring, issued 2 steps ahead, so every
//   warp keeps ~4 KB in flight while it computes (register prefetch instead would need ~16 more registers
//   than the 3-blocks-per-SM budget has).  sm_120: registers only.
//   Selection: candidates, not insertions.  After the first loads every thread takes the maximum of its
//   elements; the block bound is the VT-th largest of these 256 thread maxima (block_bound: two
//   __syncthreads, a warp bitonic sort of the lane maxima, then a rank test of the 8 sorted per-warp lists).
//   VT distinct elements are >= the bound, so an element with a smaller key cannot be in the block's top VT.
//   Before full steps 1, 3, 7, 15, ... (while at least as many steps remain) the bound is recomputed from
//   the threads' running maxima m, which only rises: on a normal row of 163840 logits this cuts the elements
//   that reach the candidate buffers from ~160 to ~35 per block (the hot path costs ~100 instructions per
//   warp-step it is taken in).
//   The hot loop is then, per step: the step maximum (bf16: HMNMX2 on the packed pairs, one unpack at the
//   end; f32: FMNMX), ONE float compare of it against the gate and one against the softmax base, one
//   vote.any over the warp (the rare work, candidates and rebase, sits behind it), and per element an
//   unpack (bf16), an FFMA, an ex2 and an add: ~5.5 (bf16) / 6.3 (f32) SASS instructions per element on
//   sm_90.  In a hot step each vector is tested against the gate again, and in a hot vector a bit mask of
//   the elements >= the gate's float picks the few that get a key; those that pass are appended as (key, id)
//   to a per-warp shared buffer (SMALL_CAPW = 384 entries, per-lane shared
//   atomics on the warp's counter; no ballots, no shuffles, no list maintenance).  Overflow guard (warp-
//   uniform, checked before each hot vector): if the buffer could not take a full vector from every lane,
//   the warp shrinks it to its exact top VT and tightens its gate to the (key, id) of entry VT-1 (strict:
//   later ties with larger ids are rejected).  On realistic rows the buffer holds a few dozen entries and
//   the guard never fires; adversarial orders (ascending rows, all-equal rows) stay correct, only slower.
//   At the end each warp selects its sorted top VT from its buffer by rank (entry rank = number of better
//   entries; ids are unique, so the ranks are a permutation).
//   Merge (pruned_merge): the 8 warp lists -> the block's top V, and the 8 (m, s) pairs folded.  With t the
//   best of the lists' V-th entries, only entries >= t can be in the top V (usually ~V to 2V of them): they
//   are appended to a small buffer and ranked by counting among themselves; more than 256 survivors
//   (interleaved lists) fall back to rank_merge (each entry's rank = its index + a binary search in each
//   other sorted list; equal keys only occur for empty slots, ordered by list index).
//   S == 1: the block writes the outputs.
//   Cluster (S = ROW_CLUSTER blocks of one row in a thread-block cluster): every block stores its top V and
//   (m, s) into block 0's shared memory (st.shared::cluster), one cluster barrier (release / acquire), and
//   block 0 merges the S lists the same way and writes the outputs.  No workspace, no global round trip.
//   Otherwise S > 1: the block writes its top-VT and (m, s) to the workspace, __threadfence, then one
//   atomicAdd on the row counter; the block that sees S-1 is the last: it reads the S partial lists (ld.cg),
//   merges them, writes the outputs and zeroes the row's counter (the partials are rewritten before they are
//   read in every launch; the counters are left zero: graph-replayable, one launch).
//   Workspace (S > 1, no cluster): u32 counter[R] | float2 stats[R][S] | uint2 (key,id) cand[R][S][VT], each
//   part padded to 256 bytes (kdt/launch/topk.py: workspace_nbytes).  Limits: S <= 128, S*VT <= 2048,
//   vocab <= 2^18.
//   Memory traffic: the logits once (R*vocab*4 or *2 bytes) + R*V*8 bytes of outputs + S*R*(8 + 8*VT)*2
//   bytes of partials (negligible).
//
// Resident path, few rows, V <= 8: kdt_topk_resident_{wide,narrow}_{f32,bf16}, where the launcher would run the
// cluster path and the rows are 16-byte aligned (vocab a multiple of 4 f32 / 8 bf16) and a block's chunk fits
// its shape's vectors per thread.  The G=1 drafter shapes.  Two shapes (ResShape), the same code:
//   wide:   S = ROW_CLUSTER blocks per row (16 on sm_90, 8 on sm_120), <= 16 vectors per thread (64 KB),
//           __launch_bounds__(256, 3) (40-46 registers, no spills): 28 16-block clusters fit on the H200.
//   narrow: S = 8 blocks per row, <= 20 vectors per thread (80 KB: f32 vocab 163840), __launch_bounds__(256, 2).
//   The launcher runs the wide shape up to 7 rows and the narrow one beyond (where only one fits, that one): the
//   H200 places 7 16-block clusters one block per SM, while 15 of them stack three blocks on 16 SMs, whose data
//   lands last; 15 8-block clusters fit one block per SM.
//   launch: grid = R * S blocks (one cluster per row), 256 threads, 10.6 KB (wide) / 6.5 KB (narrow) static
//   smem plus max(chunk bytes, S * 64 * 8) of dynamic smem (the chunk; block 0's survivors after it); no
//   workspace.
//   Per block: thread 0 issues the whole chunk at once as bulk copies (cp.async.bulk, the TMA engine) of 2
//   vectors per thread each (vector i*256 + tid of the chunk at s_data[i*256 + tid]), each completing on its
//   own mbarrier; the online softmax runs group by group as they land (the block's last group is all it still
//   computes after its last bytes), block barrier 1 for the warp maxima; the block bound is the smallest of
//   them (8 distinct elements are >= it), and every warp collects its elements >= the bound (each lane its next
//   group that reaches it, one atomic per lane; ~20 per block on normal rows).  Block barrier 2, then the
//   candidates (or, above 64, the block's exact top V by rank; above 256, by V rounds of a block-wide
//   arg-best), the block's two best warp maxima and its (max, sum) go to block 0's shared memory as remote
//   stores, and one cluster barrier (release / acquire) publishes them.  Block 0 takes its prune threshold
//   t = the V-th largest of the 32 sent warp maxima (V distinct elements are >= t), keeps the received
//   candidates >= t (8-10 on normal rows), ranks them by counting and writes the row.
//   The critical path is the last block's data (its SM's share of the DRAM bandwidth), ~1 us of block work,
//   the cluster barrier and ~1 us of block 0 (H200, K=15 f32).
//   Memory traffic: the logits once + R*V*8 bytes of outputs.
//
// General path, any V <= 1024: kdt_topk_general_{f32,bf16}
//   launch: grid = R blocks, 1024 threads, 16.4 KB static smem, no workspace.
//   Exact radix select on the 50-bit composite  c = key << 18 | (2^18 - 1 - id)  (larger c = better; unique)
//   with 11-bit digits over shared-memory histograms: pass 1 also computes (m, s); each later pass
//   histograms the next digit of the elements that share the prefix chosen so far and stops as soon as the
//   chosen bin holds exactly the number still needed (usually after 1-3 passes; at most 5).  Then one gather
//   pass collects the exactly V elements whose prefix is >= the selected prefix, a block bitonic sort by c
//   (desc) orders them, and the outputs are written.  Scalar, coalesced loads (no alignment requirement).
//   Memory traffic: (2 + number of refining passes) reads of the row, mostly from L2 for one row; it is a
//   correct path, not a fast one.
// ---------------------------------------------------------------------------------------------------------

#include <stdint.h>
#include <float.h>

#include "common/bits.cuh"
#include "common/mbarrier.cuh"

namespace {

constexpr unsigned FULL = 0xffffffffu;
constexpr int SMALL_THREADS = 256;
constexpr int SMALL_WARPS = SMALL_THREADS / 32;
constexpr int VEC_BYTES = 16;       // one vector: a 16-byte load or copy (float4 / 8 x bf16)
constexpr int SMALL_U = 4;          // 16-byte loads in flight per thread and step
constexpr int SMALL_USTRIDE = 32;   // vectors between a thread's U vectors of one step (a warp-wide row)
constexpr int SMALL_MAX_V = 32;
// Dynamic shared memory of the small path: a cp.async ring of SMALL_STAGES steps (0: loads go to registers).
// sm_90: 2 stages (32 KB; 3 blocks of 74 KB fit the 227 KB of an SM).  sm_120 has ~100 KB of shared memory
// per SM, where the ring would cost a resident block: it keeps the register loads.
// ROW_CLUSTER: blocks per row of the cluster path (kdt_topk_cluster_*): 8 is the portable cluster size;
// sm_90 runs 16-block clusters (non-portable: the launcher opts the function in).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr int SMALL_STAGES = 0;
constexpr int SMALL_MIN_BLOCKS = 2;   // what its shared memory holds: 128 registers per thread
constexpr int ROW_CLUSTER = 8;
#else
constexpr int SMALL_STAGES = 2;
constexpr int SMALL_MIN_BLOCKS = 3;   // 80 registers per thread
constexpr int ROW_CLUSTER = 16;
#endif
constexpr int SMALL_STAGE_BYTES = SMALL_STAGES * SMALL_U * SMALL_THREADS * VEC_BYTES;
constexpr int SMALL_RING = SMALL_STAGES > 0 ? SMALL_STAGES : 1;    // modulus of the slot index
static_assert((SMALL_RING & (SMALL_RING - 1)) == 0, "slot index = step & (SMALL_RING - 1)");
constexpr int MAX_SPLITS = 128;
// Cluster path: one cluster of ROW_CLUSTER blocks per row, merged over distributed shared memory into block 0's
// receive slots: lists at s_k/s_i[RECV_BASE ..], statistics at s_m/s_s[SMALL_WARPS ..].
constexpr int MAX_CLUSTER = 16;
constexpr int MERGE_CAP = 2048;     // S * VT <= MERGE_CAP (shared-memory merge buffer)
constexpr int RECV_BASE = 8 * 32;     // SMALL_WARPS * SMALL_MAX_V: past the block's own warp lists
constexpr int GEN_THREADS = 1024;
constexpr int GEN_WARPS = GEN_THREADS / 32;
constexpr int GEN_U = 4;
constexpr int GEN_BINS = 2048;
constexpr int MAX_V = 1024;
constexpr int MAX_VOCAB = 1 << 18;
constexpr int ID_BITS = 18;
constexpr int COMP_BITS = 32 + ID_BITS;
constexpr uint32_t ID_MASK = (1u << ID_BITS) - 1u;
constexpr float LOG2E = 1.4426950408889634f;

static_assert(SMALL_MAX_V <= 32, "warp-distributed list needs VT <= 32");
static_assert(RECV_BASE == SMALL_WARPS * SMALL_MAX_V && RECV_BASE + MAX_CLUSTER * SMALL_MAX_V <= MERGE_CAP,
              "cluster receive slots lie past the warp lists, inside s_k/s_i");
static_assert(SMALL_WARPS + MAX_CLUSTER <= MAX_SPLITS, "cluster statistics slots inside s_m/s_s");
static_assert(ROW_CLUSTER <= MAX_CLUSTER, "cluster receive slots");
static_assert(GEN_BINS % GEN_THREADS == 0, "bins per thread");
static_assert(MAX_V <= GEN_THREADS * 2, "bitonic sort: one pair per thread and pass loop");

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// 2^x, MUFU.EX2 (max rel. error 2 ulp; 2^-inf = +0).
__device__ __forceinline__ float ex2(float x) {
#if defined(__CUDA_ARCH__)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);   // the host pass of nvcc; never called there
#endif
}

// The shared-window address of a shared-memory object (what the PTX shared-state operands take).
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16-byte global -> shared copy that bypasses L1 (cp.async.cg) to the shared-window address dst, its group
// bookkeeping, and the 16-byte read back (volatile + memory: never moved across the wait_group).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
    uint4 r;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(addr) : "memory");
    return r;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory"); }

// Order-preserving float -> uint32 (larger float -> larger key), -0.0 mapped to +0.0 first.
__device__ __forceinline__ uint32_t f2key(float x) {
    return kdt::ordered_key(__fadd_rn(x, 0.0f));     // -0 + +0 = +0 (round to nearest)
}
__device__ __forceinline__ float key2f(uint32_t k) { return kdt::ordered_float(k); }
// (ka, ia) strictly before (kb, ib) in (key desc, id asc).
__device__ __forceinline__ bool better(uint32_t ka, uint32_t ia, uint32_t kb, uint32_t ib) {
    return ka > kb || (ka == kb && ia < ib);
}

// (key, id) of the best entry over a warp: the largest key, then the smallest id.
__device__ __forceinline__ uint2 warp_best(uint32_t k, uint32_t i) {
    const uint32_t best_k = __reduce_max_sync(FULL, k);
    return make_uint2(best_k, __reduce_min_sync(FULL, k == best_k ? i : ~0u));
}

// (m, s) <- (m, s) (+) (om, os), both meaning s * exp(. - m); m finite (>= -FLT_MAX) so no inf - inf.
__device__ __forceinline__ void stat_merge(float& m, float& s, float om, float os) {
    const float M = fmaxf(m, om);
    s = s * ex2((m - M) * LOG2E) + os * ex2((om - M) * LOG2E);
    m = M;
}

// Online softmax: a new group maximum gm above m rescales s = sum exp(. - m) to the new base.
__device__ __forceinline__ void raise_max(float& m, float& s, float gm) {
    if (gm > m) {
        s *= ex2((m - gm) * LOG2E);
        m = gm;
    }
}

// Every lane ends with the warp's (max, sum of exp) of the lanes' partials.
__device__ __forceinline__ void warp_fold_stats(float& m, float& s) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float om = __shfl_xor_sync(FULL, m, off);
        const float os = __shfl_xor_sync(FULL, s, off);
        stat_merge(m, s, om, os);
    }
}

// Warp 0 folds n (max, sum of exp) partials p_m/p_s[0 .. n) into s_stat[0..1].
__device__ __forceinline__ void fold_stats(const float* p_m, const float* p_s, int n, float* s_stat, int lane) {
    float bm = -FLT_MAX, bs = 0.0f;
    for (int e = lane; e < n; e += 32) stat_merge(bm, bs, p_m[e], p_s[e]);
    warp_fold_stats(bm, bs);
    if (lane == 0) { s_stat[0] = bm; s_stat[1] = bs; }
}

// Thread-block clusters (sm_90+): the cluster-wide barrier halves, the address in block `rank`'s shared memory
// of what `local` is in this block (cluster_addr), and a 32- or 64-bit store there.
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_arrive_release() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait_acquire() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }
__device__ __forceinline__ uint32_t cluster_addr(const void* local, uint32_t rank) {
    uint32_t there;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                 : "=r"(there) : "r"(smem_addr(local)), "r"(rank));
    return there;
}
__device__ __forceinline__ void store_to_block(const void* local, uint32_t rank, uint32_t value) {
    asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(cluster_addr(local, rank)), "r"(value) : "memory");
}
__device__ __forceinline__ void store_to_block(const void* local, uint32_t rank, uint2 value) {
    asm volatile("st.shared::cluster.v2.u32 [%0], {%1, %2};\n" ::"r"(cluster_addr(local, rank)), "r"(value.x),
                 "r"(value.y) : "memory");
}

// a[e] for a runtime e without local memory (a select chain over the registers).
template <int N>
__device__ __forceinline__ float pick(const float (&a)[N], int e) {
    float r = a[0];
#pragma unroll
    for (int i = 1; i < N; ++i) r = e == i ? a[i] : r;
    return r;
}

template <int N>
__device__ __forceinline__ float tree_sum(float (&a)[N]) {
#pragma unroll
    for (int w = 1; w < N; w <<= 1) {
#pragma unroll
        for (int i = 0; i + w < N; i += 2 * w) a[i] += a[i + w];
    }
    return a[0];
}

// ---- element types ------------------------------------------------------------------------------------
// Vec: one 16-byte load; unpack: its W elements as floats.  The hot loop takes a step's maximum before it
// unpacks anything: VMax is a vector's maximum in the form that is cheapest to combine (bf16: a packed pair,
// one HMNMX2 per pair of pairs), vmax/vmax2 combine, vmax_float turns the result into the float maximum.
// A maximum is always one of the elements (max never rounds), so its key is an element's key.
template <typename Tin> struct Elem;
template <> struct Elem<float> {
    using Vec = float4;
    using VMax = float;
    static constexpr int W = 4;
    __device__ static __forceinline__ Vec ninf_vec() {
        const float n = neg_inf();
        return make_float4(n, n, n, n);
    }
    __device__ static __forceinline__ void unpack(const Vec& v, float (&x)[W]) {
        x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
    }
    __device__ static __forceinline__ float load1(const float* p) { return __ldg(p); }
    __device__ static __forceinline__ Vec from_bits(const uint4& b) {
        return make_float4(__uint_as_float(b.x), __uint_as_float(b.y), __uint_as_float(b.z), __uint_as_float(b.w));
    }
    __device__ static __forceinline__ VMax vmax(const Vec& v) { return fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)); }
    // element e of vector `vector` of 16-byte vectors at `data` (shared memory)
    __device__ static __forceinline__ float element(const uint4* data, int vector, int e) {
        return reinterpret_cast<const float*>(data)[vector * W + e];
    }
    __device__ static __forceinline__ VMax vmax2(VMax a, VMax b) { return fmaxf(a, b); }
    __device__ static __forceinline__ float vmax_float(VMax a) { return a; }
};

// Elementwise maximum of two bf16 pairs (HMNMX2.BF16).  max.bf16x2 has no .ftz form: subnormals are kept; it
// returns one of its inputs (no rounding), -inf is the smallest value, and of -0.0 / +0.0 either may come
// back, which no user of a maximum can tell apart (f2key maps -0.0 to +0.0; compares treat them as equal;
// x - m and the exponentials are the same for both).  NaN never reaches the kernel.
__device__ __forceinline__ uint32_t bf16x2_max(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

template <> struct Elem<uint16_t> {
    using Vec = uint4;
    using VMax = uint32_t;              // a bf16 pair: the maxima of the vector's even and odd elements
    static constexpr int W = 8;
    __device__ static __forceinline__ Vec ninf_vec() { return make_uint4(0xff80ff80u, 0xff80ff80u, 0xff80ff80u, 0xff80ff80u); }
    // bf16 -> float is exact: the bf16 bits are the high half of the float's (one IMAD.U32 or LOP3 each)
    __device__ static __forceinline__ void unpack(const Vec& v, float (&x)[W]) {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {      // little endian: element 2i in the low half
            x[2 * i] = __uint_as_float(w[i] << 16);
            x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
    __device__ static __forceinline__ float load1(const uint16_t* p) {
        return __uint_as_float((uint32_t)__ldg(reinterpret_cast<const unsigned short*>(p)) << 16);
    }
    __device__ static __forceinline__ Vec from_bits(const uint4& b) { return b; }
    __device__ static __forceinline__ float element(const uint4* data, int vector, int e) {
        return __uint_as_float((uint32_t)reinterpret_cast<const uint16_t*>(data)[vector * W + e] << 16);
    }
    __device__ static __forceinline__ VMax vmax(const Vec& v) {
        return bf16x2_max(bf16x2_max(v.x, v.y), bf16x2_max(v.z, v.w));
    }
    __device__ static __forceinline__ VMax vmax2(VMax a, VMax b) { return bf16x2_max(a, b); }
    // the larger half as a float: the max of the pair and its swap holds it in both halves
    __device__ static __forceinline__ float vmax_float(VMax p) {
        return __uint_as_float(bf16x2_max(p, __byte_perm(p, 0u, 0x1032)) & 0xffff0000u);
    }
};

// The scalar head and tail elements of the small path (already floats, one per lane).
struct Elem1 {
    using Vec = float;
    using VMax = float;
    static constexpr int W = 1;
    __device__ static __forceinline__ void unpack(const Vec& v, float (&x)[W]) { x[0] = v; }
    __device__ static __forceinline__ VMax vmax(const Vec& v) { return v; }
    __device__ static __forceinline__ VMax vmax2(VMax a, VMax b) { return fmaxf(a, b); }
    __device__ static __forceinline__ float vmax_float(VMax a) { return a; }
};

// ---- per-warp candidate buffer ------------------------------------------------------------------------
// Each warp appends the elements that pass its gate to its own shared-memory buffer buf[0 .. *cnt) of
// (key, id) pairs (per-lane shared atomics on the warp's counter, only on the rare hot path).  The gate is
// the pair (gk, gi): an element (k, id) is a candidate iff better(k, id, gk, gi); gi = ~0 admits key ties.
// gf is the float image of gk for the one-compare group pre-test (x >= gf; -inf when gk == 0).
constexpr int SMALL_CAPW = 384;     // buffer entries per warp

struct Gate {
    uint32_t gk, gi;
    float gf;
    __device__ __forceinline__ void set(uint32_t k, uint32_t i) {
        gk = k;
        gi = i;
        gf = k ? key2f(k) : neg_inf();
    }
};

// Entries first, first + stride, ... of buf[0 .. n) go to out_k/out_i[rank] when rank < limit, with rank = the
// number of entries better than it (ids are unique: the ranks are a permutation).
__device__ __forceinline__ void place_by_rank(const uint2* buf, uint32_t n, uint32_t first, uint32_t stride,
                                              uint32_t limit, uint32_t* out_k, uint32_t* out_i) {
    for (uint32_t e = first; e < n; e += stride) {
        const uint2 c = buf[e];
        uint32_t rank = 0;
        for (uint32_t j = 0; j < n; ++j) {
            const uint2 o = buf[j];
            rank += better(o.x, o.y, c.x, c.y) ? 1u : 0u;
        }
        if (rank < limit) {
            out_k[rank] = c.x;
            out_i[rank] = c.y;
        }
    }
}

// Warp-synchronous: the top-VT (best first) of buf[0 .. n) -> out_k/out_i[0 .. VT) (empty slots (0, ~0)).
template <int VT>
__device__ __forceinline__ void warp_select(const uint2* buf, uint32_t n, uint32_t* out_k, uint32_t* out_i, int lane) {
    for (uint32_t r = (uint32_t)lane; r < (uint32_t)VT; r += 32) {
        out_k[r] = 0u;
        out_i[r] = ~0u;
    }
    __syncwarp();
    place_by_rank(buf, n, (uint32_t)lane, 32u, (uint32_t)VT, out_k, out_i);
    __syncwarp();
}

// Warp-synchronous overflow guard: if the buffer could not take another full vector from every lane,
// shrink it to its top VT (via the scratch list out_k/out_i) and tighten the gate to its entry VT-1.
template <int VT, int VW>
__device__ __forceinline__ void warp_compact(uint2* buf, uint32_t* cnt, uint32_t* out_k, uint32_t* out_i, Gate& g,
                                          int lane) {
    const uint32_t n = *cnt;
    warp_select<VT>(buf, n, out_k, out_i, lane);
    for (int r = lane; r < VT; r += 32) buf[r] = make_uint2(out_k[r], out_i[r]);
    const uint32_t nk = n < (uint32_t)VT ? n : (uint32_t)VT;
    if (n >= (uint32_t)VT) {
        const uint32_t tk = out_k[VT - 1], ti = out_i[VT - 1];
        if (better(tk, ti, g.gk, g.gi)) g.set(tk, ti);
    }
    __syncwarp();
    if (lane == 0) *cnt = nk;
    __syncwarp();
}

// ---- online softmax of the small path ------------------------------------------------------------------
// Per thread: m = the running maximum (an element seen so far, or -FLT_MAX before the first finite one) and
// s = sum of exp(x - b) over the elements seen, in a base b >= m.  b moves only when a group maximum gm
// exceeds it, and then to fl(gm + BASE_MARGIN): after its first groups a thread's maximum rarely climbs that
// far, so the rescale (two ex2, ~10 instructions) sits with the candidate work behind one warp vote, skipped
// in almost every group, instead of being predicated in all of them.  finish() moves s to the base m, once
// per thread, so that the merges and the output see (m, sum exp(x - m)) as before.  A group's exponentials
// are ex2(a) with
//   fused mode (|b| <= FUSED_MAX_B):  a = fl(x * LOG2E - bL), one FFMA, bL = fl(b * LOG2E);
//   exact mode (any other b):         a = fl(fl(x - b) * LOG2E).
// The FFMA rounds x * LOG2E - bL once, so a = ((x - b) * LOG2E + r)(1 + e), |e| <= 2^-24, with
// r = b * LOG2E - bL the rounding residual of bL (exact as fmaf(b, LOG2E, -bL)): all terms of a group share
// the factor 2^r, and the group's sum is multiplied by c = ex2(-r) before it joins s.  |b| <= FUSED_MAX_B
// keeps |bL| < 2^17, so |r| <= 2^-8 and 2^r and c are harmless; far beyond it r reaches 2^100 (the tests
// have rows of 1e37-magnitude logits) and 2^r overflows, hence the exact mode there.  Both modes give s in
// the same base, so a group may switch mode whenever b moves (a warp runs the fused mode when all its lanes
// can).
constexpr float FUSED_MAX_B = 65536.0f;
constexpr float BASE_MARGIN = 4.0f;

struct Softmax {
    float m = -FLT_MAX;
    float b = -FLT_MAX;   // base of s: m <= b <= fl(m + BASE_MARGIN) (b - m <= 4 + ulp(m) / 2)
    float s = 0.0f;
    float bL = 0.0f;      // fl(b * LOG2E)                      (fused mode only)
    float c = 1.0f;       // ex2(-(b * LOG2E - bL))             (fused mode only)
    // the whole warp is in the fused mode: a warp-uniform branch (no reconvergence bookkeeping); the exact
    // mode is right for any b, so a warp with one lane beyond FUSED_MAX_B runs it on every lane
    bool warp_fused = false;

    __device__ __forceinline__ bool fused() const { return fabsf(b) <= FUSED_MAX_B; }

    // Online softmax: a group maximum gm above the base rescales s to a new base above gm.  The caller
    // takes m = max(m, gm) and, behind a warp vote on needs_rebase (rarely true: see process_group), calls
    // rebase_warp on every lane.
    __device__ __forceinline__ bool needs_rebase(float gm) const { return gm > b; }
    __device__ __forceinline__ void rebase_warp(bool moves, float gm) {
        if (moves) rebase(gm);
        warp_fused = __all_sync(FULL, fused());          // b changes only here
    }
    __device__ __forceinline__ void rebase(float gm) {
        const float nb = gm + BASE_MARGIN;               // >= gm (= gm when BASE_MARGIN < ulp(gm) / 2)
        s *= ex2((b - nb) * LOG2E);
        b = nb;
        bL = __fmul_rn(nb, LOG2E);                       // never contracted into the FMA below
        c = ex2(-fmaf(nb, LOG2E, -bL));                  // unused (maybe inf) in the exact mode
    }

    // s -> sum exp(x - m): once per thread, after its scan (b - m = 0 when it saw no finite element).
    __device__ __forceinline__ void finish() {
        s *= ex2((b - m) * LOG2E);
        b = m;
    }
};

// Sum of the exponentials of one group (pairwise tree), in the fused or the exact mode.
template <bool FUSED, typename E, int NV>
__device__ __forceinline__ float group_exp_sum(const typename E::Vec (&v)[NV], const Softmax& sm) {
    constexpr int VW = E::W;
    float ev[NV * VW];
#pragma unroll
    for (int u = 0; u < NV; ++u) {
        float x[VW];
        E::unpack(v[u], x);
#pragma unroll
        for (int e = 0; e < VW; ++e)
            ev[u * VW + e] = ex2(FUSED ? fmaf(x[e], LOG2E, -sm.bL) : (x[e] - sm.b) * LOG2E);
    }
    return tree_sum(ev);
}

// The largest element of a group (a pairwise tree over its vectors: short dependency chains).
template <typename E, int NV>
__device__ __forceinline__ float group_max(const typename E::Vec (&v)[NV]) {
    typename E::VMax vm[NV];
#pragma unroll
    for (int u = 0; u < NV; ++u) vm[u] = E::vmax(v[u]);
#pragma unroll
    for (int w = 1; w < NV; w <<= 1) {
#pragma unroll
        for (int u = 0; u + w < NV; u += 2 * w) vm[u] = E::vmax2(vm[u], vm[u + w]);
    }
    return E::vmax_float(vm[0]);
}

// s += the group's exponentials in the base b, in the warp's mode.
template <typename E, int NV>
__device__ __forceinline__ void add_group(Softmax& sm, const typename E::Vec (&v)[NV]) {
    if (sm.warp_fused) sm.s = fmaf(group_exp_sum<true, E>(v, sm), sm.c, sm.s);
    else sm.s += group_exp_sum<false, E>(v, sm);
}

// One group of NV vectors of E::W elements per lane (vector u holds the ids base0 + u*SMALL_USTRIDE*W + e):
// online softmax statistics + candidate collection.  Invalid vectors hold -inf (harmless for the statistics)
// and are excluded from selection by valid[].
template <int VT, int NV, typename E>
__device__ __forceinline__ void process_group(const typename E::Vec (&v)[NV], const bool (&valid)[NV], uint32_t base0,
                                              Softmax& sm, Gate& g, uint2* buf, uint32_t* cnt,
                                              uint32_t* out_k, uint32_t* out_i, int lane) {
    constexpr int VW = E::W;
    const float gm = group_max<E>(v);
    sm.m = fmaxf(sm.m, gm);

    // The rare work of a group, behind one warp vote: candidates (some lane has gm >= gf) and the rescale
    // of the softmax base (some lane has gm > b).  Candidates first, so that the vectors die in the
    // exponentials below (fewer live registers there).  A hot valid vector implies gm >= gf.  (Invalid
    // vectors hold -inf, so with an open gate, gf = -inf, padding alone can enter, where the per-vector test
    // below finds nothing.)
    const bool maybe_hot = gm >= g.gf;
    const bool rebase = sm.needs_rebase(gm);
    if (__any_sync(FULL, maybe_hot || rebase)) {
        if (__any_sync(FULL, maybe_hot)) {
#pragma unroll
            for (int u = 0; u < NV; ++u) {
                const bool hot = valid[u] && E::vmax_float(E::vmax(v[u])) >= g.gf;
                if (__any_sync(FULL, hot)) {
                    // one read, broadcast: warp-uniform, and taken before any lane appends
                    if (__shfl_sync(FULL, *cnt, 0) > (uint32_t)(SMALL_CAPW - 32 * VW))
                        warp_compact<VT, VW>(buf, cnt, out_k, out_i, g, lane);
                    if (hot) {
                        // usually one element of the vector passes: key and append only those
                        float x[VW];
                        E::unpack(v[u], x);
                        uint32_t pass = 0;
#pragma unroll
                        for (int e = 0; e < VW; ++e) pass |= (x[e] >= g.gf ? 1u : 0u) << e;
                        while (pass) {
                            const int e = __ffs(pass) - 1;
                            pass &= pass - 1u;
                            const uint32_t k = f2key(pick(x, e));
                            const uint32_t id = base0 + (uint32_t)(u * SMALL_USTRIDE * VW + e);
                            if (better(k, id, g.gk, g.gi)) buf[atomicAdd(cnt, 1u)] = make_uint2(k, id);
                        }
                    }
                    __syncwarp();
                }
            }
        }
        sm.rebase_warp(rebase, gm);
    }

    add_group<E>(sm, v);
}

// Top-VT of L sorted lists (lists[l*VT .. l*VT+VT-1], best first, empty slots (0, ~0) last) -> ok/oi[0..VT).
// Rank of entry (l, i) = i + sum over other lists of the entries placed before it; equal entries (only empty
// slots) are ordered by list index, so the ranks are a permutation and every output slot is written.
template <int VT>
__device__ __forceinline__ void rank_merge(const uint32_t* lk, const uint32_t* li, int L, uint32_t* ok, uint32_t* oi,
                                           int tid, int nthreads) {
    for (int e = tid; e < L * VT; e += nthreads) {
        const int l = e / VT;
        const int i = e - l * VT;
        const uint32_t ck = lk[e], ci = li[e];
        int rank = i;
#pragma unroll 4
        for (int l2 = 0; l2 < L; ++l2) {
            if (l2 == l) continue;
            const uint32_t* bk = lk + l2 * VT;
            const uint32_t* bi = li + l2 * VT;
            const bool tie_first = l2 < l;
            int pos = 0;
#pragma unroll
            for (int st = VT / 2; st > 0; st >>= 1) {
                const int j = pos + st - 1;
                if (better(bk[j], bi[j], ck, ci) || (tie_first && bk[j] == ck && bi[j] == ci)) pos += st;
            }
            if (better(bk[pos], bi[pos], ck, ci) || (tie_first && bk[pos] == ck && bi[pos] == ci)) ++pos;
            rank += pos;
        }
        if (rank < VT) {
            ok[rank] = ck;
            oi[rank] = ci;
        }
    }
}

// Top-V of L sorted lists, as rank_merge, but usually ranking only a handful of entries.  Let t be the best of
// the lists' V-th entries: its list holds V entries >= t, so no entry below t is in the top V.  The real
// entries >= t among the first V of each list (on normal rows ~V to 2V of them) are appended to cand and
// ranked by counting among themselves; slots [min(n, V), VT) get empty entries.  More than PRUNED_CAP
// survivors (lists that interleave, e.g. one value pattern in every split) -> rank_merge of the whole lists.
// Block-wide; *n must be 0 on entry; the lists must be visible (a barrier before); two barriers inside.
constexpr int PRUNED_CAP = SMALL_THREADS;

template <int VT>
__device__ __forceinline__ void pruned_merge(const uint32_t* lk, const uint32_t* li, int L, int V, uint32_t* ok,
                                             uint32_t* oi, uint2* cand, uint32_t* n, int tid, int nthreads) {
    // t = max over lists of entry V-1 (larger key, then smaller id); every warp computes it for itself
    const int lane = tid & 31;
    uint32_t tk = 0u;
    uint32_t ti = ~0u;
    for (int l = lane; l < L; l += 32) {
        const uint32_t k = lk[l * VT + V - 1], i = li[l * VT + V - 1];
        if (better(k, i, tk, ti)) { tk = k; ti = i; }
    }
    const uint2 best = warp_best(tk, ti);
    tk = best.x;
    ti = best.y;
    for (int e = tid; e < L * VT; e += nthreads) {
        const int pos = e % VT;
        const uint32_t k = lk[e], i = li[e];
        if (pos < V && k != 0u && !better(tk, ti, k, i)) {
            const uint32_t slot = atomicAdd(n, 1u);
            if (slot < (uint32_t)PRUNED_CAP) cand[slot] = make_uint2(k, i);
        }
    }
    __syncthreads();
    const uint32_t count = *n;
    if (count > (uint32_t)PRUNED_CAP) {
        rank_merge<VT>(lk, li, L, ok, oi, tid, nthreads);
    } else {
        place_by_rank(cand, count, (uint32_t)tid, (uint32_t)nthreads, (uint32_t)V, ok, oi);
        for (int r = (int)min(count, (uint32_t)V) + tid; r < VT; r += nthreads) {
            ok[r] = 0u;
            oi[r] = ~0u;
        }
    }
    __syncthreads();
    if (tid == 0) *n = 0u;       // ready for the next merge (the next barrier orders it)
}

// Block-wide: the VT-th largest of the 256 threads' keys v (0 = the thread holds no element), via a bitonic
// sort of each warp's lane keys and a rank test of the 8 sorted per-warp lists.  Returned to every thread.
// When every key is an element of the block's range, VT distinct elements are >= the result, so an element
// below it cannot be in the block's top VT.  s_lists (SMALL_WARPS * VT words) is scratch; two barriers.
template <int VT>
__device__ __forceinline__ uint32_t block_bound(uint32_t v, uint32_t* s_lists, uint32_t* s_bound, int lane, int warp,
                                                int tid) {
#pragma unroll
    for (int k = 2; k <= 32; k <<= 1) {                   // bitonic sort, descending over lanes
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
            const uint32_t o = __shfl_xor_sync(FULL, v, j);
            const bool desc = (lane & k) == 0;
            const bool low = (lane & j) == 0;
            v = (low == desc) ? max(v, o) : min(v, o);
        }
    }
    if (lane < VT) s_lists[warp * VT + lane] = v;
    __syncthreads();
    if (tid < SMALL_WARPS * VT) {                        // is entry tid the VT-th largest of the lists?
        const uint32_t e = s_lists[tid];
        int gt = 0, ge = 0;
#pragma unroll
        for (int l = 0; l < SMALL_WARPS; ++l) {
            const uint32_t* L = s_lists + l * VT;
            int p = 0, q = 0;
#pragma unroll
            for (int st = VT / 2; st > 0; st >>= 1) {
                if (L[p + st - 1] > e) p += st;
                if (L[q + st - 1] >= e) q += st;
            }
            gt += p + (L[p] > e ? 1 : 0);
            ge += q + (L[q] >= e ? 1 : 0);
        }
        if (gt < VT && ge >= VT) *s_bound = e;            // all writers write the same value
    }
    __syncthreads();
    return *s_bound;
}

__device__ __forceinline__ size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

// ---- fast path ------------------------------------------------------------------------------------------
template <typename Tin, int VT, int CLUSTER>
__device__ __forceinline__ void small_impl(const Tin* __restrict__ logits, int* __restrict__ top_ids,
                                           float* __restrict__ top_logp, unsigned char* __restrict__ ws,
                                           int vocab, int V, int chunk, int S) {
    using E = Elem<Tin>;
    using Vec = typename E::Vec;
    constexpr int VW = E::W;
    constexpr int U = SMALL_U;
    constexpr int T = SMALL_THREADS;

    __shared__ uint32_t s_k[MERGE_CAP];
    __shared__ uint32_t s_i[MERGE_CAP];
    __shared__ float s_m[MAX_SPLITS];
    __shared__ float s_s[MAX_SPLITS];
    __shared__ uint32_t s_tk[VT];
    __shared__ uint32_t s_ti[VT];
    __shared__ float s_stat[2];
    __shared__ int s_last;
    __shared__ uint2 s_buf[SMALL_WARPS * SMALL_CAPW];
    __shared__ uint32_t s_cnt[SMALL_WARPS];
    __shared__ uint32_t s_bound;
    __shared__ uint32_t s_n;

    // launcher bug guard (block-uniform, so a cluster returns as a whole)
    if (V < 1 || V > VT || S < 1 || S > MAX_SPLITS || S * VT > MERGE_CAP || (CLUSTER > 1 && S != CLUSTER)) return;
    if constexpr (CLUSTER > 1) cluster_arrive_relaxed();   // waited for before the first remote store

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int row = (int)(blockIdx.x / (unsigned)S);
    const int split = (int)blockIdx.x - row * S;
    const int lo = min(split * chunk, vocab);
    const int hi = min(lo + chunk, vocab);
    const Tin* rp = logits + (size_t)row * (size_t)vocab;

    // aligned body [a0, a1) of whole 16-byte vectors; head [lo, a0) and tail [a1, hi) are < VW elements each
    const uintptr_t addr = reinterpret_cast<uintptr_t>(rp + lo);
    const int mis = (int)(((16u - (uint32_t)(addr & 15u)) & 15u) / (uint32_t)sizeof(Tin));
    const int a0 = min(lo + mis, hi);
    const int nv = (hi - a0) / VW;
    const int a1 = a0 + nv * VW;
    const int nhead = a0 - lo;
    const int nht = nhead + (hi - a1);
    const Vec* vp = reinterpret_cast<const Vec*>(rp + a0);
    const int nsteps = (nv + T * U - 1) / (T * U);

    Softmax sm;
    uint2* buf = s_buf + warp * SMALL_CAPW;
    uint32_t* cnt = &s_cnt[warp];
    uint32_t* wk = s_k + warp * VT;      // per-warp list slot (scratch during the scan, result at the end)
    uint32_t* wi = s_i + warp * VT;
    if (tid < SMALL_WARPS) s_cnt[tid] = 0u;
    if (tid == 0) s_n = 0u;

    // Vector u of step st of this thread is vector st*U*T + toff + u*USTRIDE of the body (toff below): each
    // warp reads U rows of 32 consecutive vectors (coalesced), and the U addresses of a thread lie within the
    // reach of LDGSTS's immediate offset (+-2 KB) from one another: one 64-bit address per step, not U.
    // Its elements have the ids step_base(st) + u*USTRIDE*VW + e.
    constexpr int USTRIDE = SMALL_USTRIDE;
    const int toff = warp * (U * USTRIDE) + lane;
    const Vec* tp = vp + toff;
    auto step_base = [&](int st) { return (uint32_t)(a0 + (st * U * T + toff) * VW); };
    Vec v[U];
    bool valid[U];
    auto load_step = [&](int step) {
        const Vec* sp = tp + step * (U * T);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            valid[u] = step * U * T + toff + u * USTRIDE < nv;
            v[u] = E::ninf_vec();
            if (valid[u]) v[u] = __ldcs(sp + u * USTRIDE);
        }
    };

    // ---- warm-up: first loads + head/tail, then the block bound
    load_step(0);
    // Steps 1 .. nsteps-1 stream through a ring of SMALL_STAGES shared-memory slots: step st goes to slot
    // st % SMALL_STAGES, issued SMALL_STAGES steps ahead, one cp.async group per step (empty past the end, so
    // the group count stays uniform).  Full steps (all U * T vectors inside the body) copy without bounds
    // tests; the partial last step tests each vector.  Each thread reads back only the 16-byte words it
    // copied itself, so no barrier is needed, only cp.async.wait_group.
    const int nfull = nv / (T * U);
    extern __shared__ uint4 s_stage[];                  // [SMALL_STAGES][U][T]
    constexpr uint32_t SLOT_BYTES = U * T * VEC_BYTES;
    // shared-window address of this thread's word of step st's slot (vector u at + u*T*VEC_BYTES)
    const uint32_t stage_addr = smem_addr(s_stage + tid);
    auto slot_of = [&](int st) { return stage_addr + (uint32_t)(st & (SMALL_RING - 1)) * SLOT_BYTES; };
    // step st's copies into slot = slot_of(st), from sp = tp + st*U*T (the main loop carries both)
    auto issue_step = [&](int st, const Vec* sp, uint32_t slot) {
        if (st < nfull) {
#pragma unroll
            for (int u = 0; u < U; ++u) cp_async16(slot + u * T * VEC_BYTES, sp + u * USTRIDE);
        } else if (st < nsteps) {                         // the partial last step: bounds per vector
            const int left = nv - (st * U * T + toff);    // vector u is in the body iff u*USTRIDE < left
            // sp made opaque here: otherwise the compiler rebuilds these rare addresses from a 64-bit
            // induction variable that it then advances in every step of the main loop
            asm("" : "+l"(sp));
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (u * USTRIDE < left) cp_async16(slot + u * T * VEC_BYTES, sp + u * USTRIDE);
            }
        }
        cp_async_commit();
    };
    if constexpr (SMALL_STAGES > 0) {
#pragma unroll
        for (int st = 1; st <= SMALL_STAGES; ++st) issue_step(st, tp + st * (U * T), slot_of(st));
    }
    float hx[1] = {neg_inf()};
    const bool hv[1] = {warp == 0 && lane < nht};
    const uint32_t hb = (uint32_t)(lane < nhead ? lo + lane : a1 + (lane - nhead));
    if (hv[0]) hx[0] = E::load1(rp + hb);
    Gate g;
    {
        // first bound: the VT-th largest of the thread maxima of the first step (and head/tail)
        typename E::VMax vm = E::vmax(v[0]);
#pragma unroll
        for (int u = 1; u < U; ++u) vm = E::vmax2(vm, E::vmax(v[u]));
        const float lm = fmaxf(hx[0], E::vmax_float(vm));
        const uint32_t key = (hv[0] || valid[0]) ? f2key(lm) : 0u;   // 0: thread holds no element
        g.set(block_bound<VT>(key, s_k, &s_bound, lane, warp, tid), ~0u);
    }
    process_group<VT, 1, Elem1>(hx, hv, hb, sm, g, buf, cnt, wk, wi, lane);
    process_group<VT, U, E>(v, valid, step_base(0), sm, g, buf, cnt, wk, wi, lane);
    // Steps whose U * T vectors all lie inside the body: no bounds test and no -inf fill.  Before steps 1, 3,
    // 7, 15, ... the gate is raised to the VT-th largest running maximum of the threads (m is an element
    // seen so far, or -FLT_MAX before any finite one): the gate then tracks the top VT of a doubling prefix
    // of the range, and far fewer elements reach the candidate buffers than with the first step's bound.
    const bool all_valid[U] = {true, true, true, true};
    int step = 1;
    int bound_step = 1;                                   // the next of 1, 3, 7, 15, ... (2^k - 1)
    const Vec* ahead = tp + (1 + SMALL_STAGES) * (U * T); // vector 0 of step + SMALL_STAGES
    // the ring slots of `step` and of the next step: two slots, so they swap every step
    static_assert(SMALL_STAGES == 0 || SMALL_STAGES == 2, "slot alternation below");
    uint32_t slot = slot_of(step), other = slot_of(step + 1);
    for (; step < nfull; ++step) {
        if constexpr (SMALL_STAGES > 0) {
            cp_async_wait<SMALL_STAGES - 1>();              // this step's group has landed
#pragma unroll
            for (int u = 0; u < U; ++u) v[u] = E::from_bits(lds128(slot + u * T * VEC_BYTES));
            // into the slot just read (same parity): the copies follow the reads in program order, as before
            // (ptxas placed them ahead of the reads' first uses then too)
            issue_step(step + SMALL_STAGES, ahead, slot);
            ahead += U * T;
            const uint32_t t = slot;
            slot = other;
            other = t;
        } else {
            const Vec* sp = tp + step * (U * T);
#pragma unroll
            for (int u = 0; u < U; ++u) v[u] = __ldcs(sp + u * USTRIDE);
        }
        // block-uniform, with this step's loads in flight; it pays off only while as many steps remain
        if (step == bound_step) {
            bound_step = 2 * step + 1;
            if (nfull >= 2 * (step + 1)) {
                const uint32_t b = block_bound<VT>(sm.m > -FLT_MAX ? f2key(sm.m) : 0u, s_k, &s_bound, lane, warp, tid);
                if (b > g.gk) g.set(b, ~0u);
            }
        }
        process_group<VT, U, E>(v, all_valid, step_base(step), sm, g, buf, cnt, wk, wi, lane);
    }
    if constexpr (SMALL_STAGES > 0) {
        cp_async_wait<0>();
        if (step < nsteps) {                              // the partial last step, from its ring slot
            const uint32_t slot = slot_of(step);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                valid[u] = step * U * T + toff + u * USTRIDE < nv;
                v[u] = valid[u] ? E::from_bits(lds128(slot + u * T * VEC_BYTES)) : E::ninf_vec();
            }
            process_group<VT, U, E>(v, valid, step_base(step), sm, g, buf, cnt, wk, wi, lane);
        }
    } else {
        for (; step < nsteps; ++step) {
            load_step(step);
            process_group<VT, U, E>(v, valid, step_base(step), sm, g, buf, cnt, wk, wi, lane);
        }
    }
    __syncwarp();
    warp_select<VT>(buf, *cnt, wk, wi, lane);                // this warp's sorted top VT -> s_k/s_i slot

    // ---- block merge
    sm.finish();
    float m = sm.m, s = sm.s;
    warp_fold_stats(m, s);
    if (lane == 0) { s_m[warp] = m; s_s[warp] = s; }
    __syncthreads();
    if (warp == 0) fold_stats(s_m, s_s, SMALL_WARPS, s_stat, lane);
    pruned_merge<VT>(s_k, s_i, SMALL_WARPS, V, s_tk, s_ti, s_buf, &s_n, tid, T);

    if constexpr (CLUSTER > 1) {
        // every block of the row's cluster stores its list and statistics into block 0's receive slots
        // (s_k/s_i from RECV_BASE, s_m/s_s from SMALL_WARPS: words block 0's own merge never touches)
        cluster_wait_acquire();                           // pairs the arrive at the start: all blocks run
        if (tid < VT) {
            store_to_block(&s_k[RECV_BASE + split * VT + tid], 0u, s_tk[tid]);
            store_to_block(&s_i[RECV_BASE + split * VT + tid], 0u, s_ti[tid]);
        }
        if (tid == 0) {
            store_to_block(&s_m[SMALL_WARPS + split], 0u, __float_as_uint(s_stat[0]));
            store_to_block(&s_s[SMALL_WARPS + split], 0u, __float_as_uint(s_stat[1]));
        }
        cluster_arrive_release();
        cluster_wait_acquire();
        if (split != 0) return;
        if (warp == 0) fold_stats(s_m + SMALL_WARPS, s_s + SMALL_WARPS, CLUSTER, s_stat, lane);
        pruned_merge<VT>(s_k + RECV_BASE, s_i + RECV_BASE, CLUSTER, V, s_tk, s_ti, s_buf, &s_n, tid, T);
    } else if (S > 1) {
        const int R = (int)(gridDim.x / (unsigned)S);
        uint32_t* cnt = reinterpret_cast<uint32_t*>(ws);
        float2* pst = reinterpret_cast<float2*>(ws + align256((size_t)R * 4));
        uint2* pcd = reinterpret_cast<uint2*>(ws + align256((size_t)R * 4) + align256((size_t)R * S * 8));
        const size_t pidx = (size_t)row * S + split;
        if (tid < VT) pcd[pidx * VT + tid] = make_uint2(s_tk[tid], s_ti[tid]);
        if (tid == 0) pst[pidx] = make_float2(s_stat[0], s_stat[1]);
        __threadfence();
        __syncthreads();
        if (tid == 0) s_last = (atomicAdd(&cnt[row], 1u) == (uint32_t)(S - 1));
        __syncthreads();
        if (!s_last) return;
        __threadfence();
        // the partials are written before they are read in every launch: only the counter goes back to 0
        const uint2* rc = pcd + (size_t)row * S * VT;
        const float2* rs = pst + (size_t)row * S;
        for (int e = tid; e < S * VT; e += T) {
            const uint2 c = __ldcg(rc + e);
            s_k[e] = c.x;
            s_i[e] = c.y;
        }
        for (int e = tid; e < S; e += T) {
            const float2 c = __ldcg(rs + e);
            s_m[e] = c.x;
            s_s[e] = c.y;
        }
        if (tid == 0) cnt[row] = 0u;
        __syncthreads();
        if (warp == 0) fold_stats(s_m, s_s, S, s_stat, lane);
        pruned_merge<VT>(s_k, s_i, S, V, s_tk, s_ti, s_buf, &s_n, tid, T);
    }

    if (tid < V) {
        const float lsum = logf(s_stat[1]);
        const size_t o = (size_t)row * V + tid;
        top_ids[o] = (int)s_ti[tid];
        top_logp[o] = (key2f(s_tk[tid]) - s_stat[0]) - lsum;
    }
}

// ---- resident path (few rows, V <= RES_VT; see the header) ------------------------------------------------
// One cluster of S = Shape::cluster blocks of T = RES_THREADS threads per row.  No scan loop, no per-warp lists,
// one cluster barrier at the end: one bound, raw candidates and statistics stored into block 0.
constexpr int RES_VT = 8;              // largest V: the block bound is the smallest of >= V warp maxima
constexpr int RES_GROUP = 2;           // vectors per thread of one bulk copy (one mbarrier) and one softmax group: what
                                       // a block still computes after its last bytes land (4: 0.4-0.9 us slower at G=1)
constexpr int RES_THREADS = 256;
constexpr int RES_WARPS = RES_THREADS / 32;
constexpr int RES_SEND_CAP = RES_THREADS / 4;  // candidates a block sends as they are (~20 per 8 warps on normal
                                         // rows, 65 seen)
constexpr int RES_LOCAL_CAP = RES_THREADS;     // more: the block ranks up to this many itself
constexpr int RES_NARROW_CLUSTER = 8;          // the portable cluster size
static_assert(RES_VT <= RES_WARPS, "bounds from RES_VT distinct warp maxima");
static_assert(RES_VT <= RES_SEND_CAP && RES_SEND_CAP <= RES_LOCAL_CAP, "a block sends its top V at most");

// One shape of the resident path: CLUSTER blocks of RES_THREADS threads per row, at most MAX_VECTORS 16-byte
// vectors per thread, MIN_BLOCKS blocks per SM (registers).  Two are built (the launcher picks by rows):
//   wide   = ROW_CLUSTER blocks (16 on sm_90), <= 16 vectors (64 KB), 3 per SM;
//   narrow = 8 blocks, <= 20 vectors (80 KB: f32 vocab 163840), 2 per SM.
template <int CLUSTER, int MAX_VECTORS, int MIN_BLOCKS>
struct ResShape {
    static constexpr int cluster = CLUSTER;
    static constexpr int max_vectors = MAX_VECTORS;
    static constexpr int min_blocks = MIN_BLOCKS;
    static constexpr int groups = MAX_VECTORS / RES_GROUP;   // bulk copies (and mbarriers) per block
    static constexpr int top_sent = 32 / CLUSTER;            // best warp maxima per block for block 0's threshold
    static constexpr int recv = CLUSTER * RES_SEND_CAP;      // block 0's receive slots
    static constexpr int min_smem = recv * 8;                // dynamic smem: the chunk, then block 0's survivors
    static_assert(MAX_VECTORS % RES_GROUP == 0 && groups <= 32, "whole groups, one candidate bit per group");
    static_assert(RES_VT <= top_sent * CLUSTER, "a threshold from RES_VT distinct warp maxima");
    static_assert(top_sent * CLUSTER == 32 && top_sent <= RES_WARPS, "one warp reads the sent maxima");
    static_assert(recv % RES_THREADS == 0 && RES_THREADS % RES_SEND_CAP == 0 && min_smem >= RES_THREADS * VEC_BYTES,
                  "block 0 scans whole slot rows");
};
using ResWide = ResShape<ROW_CLUSTER, 16, 3>;
using ResNarrow = ResShape<RES_NARROW_CLUSTER, 20, 2>;

// Shared-memory atomic add without the compiler's warp aggregation (a shuffle scan per call): the few lanes
// that reserve slots at once are serialised by the hardware instead.
__device__ __forceinline__ uint32_t shared_add(uint32_t* counter, uint32_t value) {
    uint32_t old;
    asm volatile("atom.shared.add.u32 %0, [%1], %2;\n"
                 : "=r"(old) : "r"(smem_addr(counter)), "r"(value) : "memory");
    return old;
}

// One bulk copy (the TMA engine, no per-thread requests) of `bytes` (a multiple of 16, both addresses 16-byte
// aligned) from global memory into this block's shared memory, completing its bytes on the block's mbarrier
// `bar` (common/mbarrier.cuh), which an arrive_expect_tx of the same bytes has armed.
__device__ __forceinline__ void bulk_copy_to_shared(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(FULL, x, off);
    return x;
}

template <typename Tin, typename Shape>
__device__ __forceinline__ void resident_impl(const Tin* __restrict__ logits, int* __restrict__ top_ids,
                                              float* __restrict__ top_logp, int vocab, int V, int chunk) {
    using E = Elem<Tin>;
    using Vec = typename E::Vec;
    constexpr int VW = E::W;
    constexpr int T = RES_THREADS;
    constexpr int S = Shape::cluster;
    constexpr int GROUPS = Shape::groups;
    constexpr int WARPS = RES_WARPS;
    constexpr int SEND_CAP = RES_SEND_CAP;
    constexpr int LOCAL_CAP = RES_LOCAL_CAP;
    constexpr int TOP_SENT = Shape::top_sent;

    // block 0's receive slots, written by every block of the cluster (block 0 too)
    __shared__ uint2 r_cand[S][SEND_CAP];
    __shared__ uint32_t r_count[S];
    __shared__ __align__(16) uint32_t r_max[S * TOP_SENT];   // each block's TOP_SENT best warp maxima
    __shared__ float r_m[S];
    __shared__ float r_s[S];
    // the block's own
    __shared__ uint2 s_cand[LOCAL_CAP];
    __shared__ uint32_t s_count;
    __shared__ uint32_t s_wkey[WARPS];
    __shared__ float s_wsum[WARPS];
    __shared__ uint32_t s_topk[RES_VT];
    __shared__ uint32_t s_topi[RES_VT];
    __shared__ uint2 s_pick[WARPS];
    __shared__ float s_stat[2];
    __shared__ uint32_t s_survivors;
    __shared__ uint64_t s_landed[GROUPS];   // phase 0: group g's bulk copy has landed
    extern __shared__ uint4 s_data[];    // the chunk (vector i*T + tid of the chunk at the same index); block 0's
                                         // survivors once its chunk is done

    // launcher bug guard (the same in every block, so a cluster returns as a whole)
    if (V < 1 || V > RES_VT || chunk < 0 || chunk > Shape::max_vectors * T * VW || chunk % VW != 0 || vocab % VW != 0)
        return;
    const int split = (int)(blockIdx.x % (unsigned)S);
    cluster_arrive_relaxed();                               // waited for before the first remote store
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int row = (int)(blockIdx.x / (unsigned)S);
    const int lo = min(split * chunk, vocab);
    const int nvec = (min(lo + chunk, vocab) - lo) / VW;   // vocab and chunk are multiples of VW
    const int nv = tid < nvec ? (nvec - tid + T - 1) / T : 0;   // this thread's vectors: i*T + tid, i < nv
    const uint32_t sp = smem_addr(s_data + tid);

    // The whole chunk at once: one bulk copy per group of RES_GROUP * T vectors (the chunk's contiguous bytes, so
    // that thread tid's vector i lands at s_data[i * T + tid]), each on its own mbarrier.  Thread 0 issues them
    // as soon as the barriers are initialised (fenced for the async proxy); the block barrier after it lets the
    // other threads wait on them.
    if (tid == 0) {
        s_count = 0u;
        s_survivors = 0u;
#pragma unroll
        for (int g = 0; g < GROUPS; ++g) kdt::mbar_init(smem_addr(&s_landed[g]), 1);   // thread 0's one arrival
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        const Vec* src = reinterpret_cast<const Vec*>(logits + (size_t)row * (size_t)vocab + lo);
#pragma unroll
        for (int g = 0; g < GROUPS; ++g) {
            const int first = g * RES_GROUP * T;
            if (first < nvec) {
                const uint32_t bytes = (uint32_t)min(nvec - first, RES_GROUP * T) * VEC_BYTES;
                kdt::mbar_arrive_expect_tx(smem_addr(&s_landed[g]), bytes);
                bulk_copy_to_shared(smem_addr(s_data + first), src + first, bytes, smem_addr(&s_landed[g]));
            }
        }
    }
    __syncthreads();

    // online softmax statistics group by group as the copies land (each thread reads back only its own)
    Softmax sm;
    float gmax[GROUPS];                                     // group maxima (-inf: none or all -inf)
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) gmax[g] = neg_inf();
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) {
        if (g * RES_GROUP * T >= nvec) break;              // block-uniform
        kdt::mbar_wait(smem_addr(&s_landed[g]), 0);        // each barrier's first and only phase
        Vec vg[RES_GROUP];
#pragma unroll
        for (int u = 0; u < RES_GROUP; ++u) {
            const int i = g * RES_GROUP + u;
            vg[u] = i < nv ? E::from_bits(lds128(sp + (uint32_t)i * T * VEC_BYTES)) : E::ninf_vec();
        }
        const float gm = group_max<E>(vg);
        gmax[g] = gm;
        sm.m = fmaxf(sm.m, gm);
        const bool rebase = sm.needs_rebase(gm);
        if (__any_sync(FULL, rebase)) sm.rebase_warp(rebase, gm);
        add_group<E>(sm, vg);
    }
    sm.finish();
    float mx = gmax[0];
#pragma unroll
    for (int g = 1; g < GROUPS; ++g) mx = fmaxf(mx, gmax[g]);

    // warp maxima as keys (0: the warp holds no element)
    const uint32_t wkey = __reduce_max_sync(FULL, nv > 0 ? f2key(mx) : 0u);
    if (lane == 0) s_wkey[warp] = wkey;
    __syncthreads();

    // Block bound: the smallest warp maximum.  The WARPS >= V warp maxima are distinct elements >= it,
    // so an element below it is not in the row's top V; 0 (a warp without elements) admits every element.
    uint32_t bound = ~0u, top = 0u;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
        bound = min(bound, s_wkey[w]);
        top = max(top, s_wkey[w]);
    }
    const float bf = bound ? key2f(bound) : neg_inf();
    // The block's TOP_SENT best warp maxima go to block 0 with its candidates (for block 0's prune threshold):
    // lane w of warp 0 ranks warp w's maximum (ties by warp), and the TOP_SENT best each send theirs.
    int top_rank = TOP_SENT;
    if (warp == 0 && lane < WARPS) {
        const uint32_t k = s_wkey[lane];
        top_rank = 0;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) top_rank += (s_wkey[w] > k || (s_wkey[w] == k && w < lane)) ? 1 : 0;
    }
    // the block's statistics in the base of its maximum (m <= block_max; both >= -FLT_MAX: no inf - inf)
    const float block_max = fmaxf(top ? key2f(top) : -FLT_MAX, -FLT_MAX);
    const float wsum = warp_sum(sm.s * ex2((sm.m - block_max) * LOG2E));
    if (lane == 0) s_wsum[warp] = wsum;

    // Candidates: the elements >= bf of the groups whose maximum reaches it.  Every warp holds at least one
    // (its maximum), so the warp works together: per pass each lane takes its next such group (its RES_GROUP
    // vectors at once), reserves its slots with one atomic and writes its few candidates.
    uint32_t groups = 0;
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) groups |= (nv > 0 && gmax[g] >= bf ? 1u : 0u) << g;
    static_assert(RES_GROUP * VW <= 32, "one pass bit per element of a group");
    while (__any_sync(FULL, groups != 0u)) {
        const int g = groups ? __ffs(groups) - 1 : 0;
        const bool active = groups != 0u;
        groups &= groups - 1u;
        uint32_t pass = 0;
#pragma unroll
        for (int u = 0; u < RES_GROUP; ++u) {
            // the group's loads at once: an index past the thread's vectors reads a real slot (at most
            // T - 1 < Shape::min_smem / VEC_BYTES) and is masked
            const int i = g * RES_GROUP + u;
            float x[VW];
            E::unpack(E::from_bits(s_data[max(min(i, nv - 1), 0) * T + tid]), x);   // its own copy: visible
            uint32_t bits = 0;
#pragma unroll
            for (int e = 0; e < VW; ++e) bits |= (x[e] >= bf ? 1u : 0u) << e;
            pass |= (active && i < nv ? bits : 0u) << (u * VW);
        }
        if (pass) {
            uint32_t slot = shared_add(&s_count, (uint32_t)__popc(pass));
            do {
                const int bit = __ffs(pass) - 1;
                pass &= pass - 1u;
                const int i = g * RES_GROUP + bit / VW;
                const int e = bit % VW;
                if (slot < (uint32_t)LOCAL_CAP)
                    s_cand[slot] = make_uint2(f2key(E::element(s_data, i * T + tid, e)),
                                              (uint32_t)(lo + (i * T + tid) * VW + e));
                ++slot;
            } while (pass);
        }
    }
    __syncthreads();

    // what the block sends: its candidates, or when there are too many its exact top V
    uint32_t n = s_count;
    const bool ranked = n > (uint32_t)SEND_CAP;         // block-uniform
    if (ranked) {
        if (n <= (uint32_t)LOCAL_CAP) {
            place_by_rank(s_cand, n, (uint32_t)tid, (uint32_t)T, (uint32_t)V, s_topk, s_topi);
        } else {
            // (ties over a whole chunk, adversarial orders) V rounds of a block-wide best below the last pick
            uint32_t pk = ~0u, pi = 0u;                     // above every element
            for (int r = 0; r < V; ++r) {
                uint32_t ck = 0u, ci = ~0u;
                for (int i = 0; i < nv; ++i) {
                    float x[VW];
                    E::unpack(E::from_bits(lds128(sp + (uint32_t)i * T * VEC_BYTES)), x);
#pragma unroll
                    for (int e = 0; e < VW; ++e) {
                        const uint32_t k = f2key(x[e]);
                        const uint32_t id = (uint32_t)(lo + (i * T + tid) * VW + e);
                        if (better(pk, pi, k, id) && better(k, id, ck, ci)) { ck = k; ci = id; }
                    }
                }
                const uint2 wb = warp_best(ck, ci);
                if (lane == 0) s_pick[warp] = wb;
                __syncthreads();
                pk = 0u;
                pi = ~0u;
#pragma unroll
                for (int w = 0; w < WARPS; ++w) {
                    const uint2 c = s_pick[w];
                    if (better(c.x, c.y, pk, pi)) { pk = c.x; pi = c.y; }
                }
                if (tid == 0) { s_topk[r] = pk; s_topi[r] = pi; }
                __syncthreads();                            // s_pick is rewritten in the next round
            }
        }
        __syncthreads();
        n = (uint32_t)V;                                    // n > SEND_CAP >= V elements: all V slots real
    }

    cluster_wait_acquire();                                 // pairs the arrive at the start: every block runs
    if (tid < (int)n)
        store_to_block(&r_cand[split][tid], 0u, ranked ? make_uint2(s_topk[tid], s_topi[tid]) : s_cand[tid]);
    if (top_rank < TOP_SENT) store_to_block(&r_max[split * TOP_SENT + top_rank], 0u, s_wkey[lane]);
    if (tid == 0) {
        float block_sum = 0.0f;                             // in warp order: the same bits in every run
#pragma unroll
        for (int w = 0; w < WARPS; ++w) block_sum += s_wsum[w];
        store_to_block(&r_count[split], 0u, n);
        store_to_block(&r_m[split], 0u, __float_as_uint(block_max));
        store_to_block(&r_s[split], 0u, __float_as_uint(block_sum));
    }
    // The stores above, published to block 0.  (st.async stores that complete_tx on block 0's mbarriers, with
    // no cluster barrier, measured 0.1-0.25 us faster on the H200, but compute-sanitizer's racecheck never
    // finishes on them.)
    cluster_arrive_release();
    cluster_wait_acquire();
    if (split != 0) return;                                 // (after the barrier: block 0 never reads a block
                                                            // that has exited, no block stores into an exited one)

    // ---- block 0: the prune threshold t = the V-th largest sent warp maximum (V distinct elements are >= it, so
    // no element below it is in the top V); every warp computes it for itself from broadcast shared loads
    // (eight warps of shuffles would queue on the SM's shuffle unit)
    static_assert(S * TOP_SENT == 32, "one sent maximum per lane");
    uint32_t t;
    {
        const uint32_t k = r_max[lane];
        int above = 0;
#pragma unroll
        for (int j = 0; j < 32; ++j) above += r_max[j] > k ? 1 : 0;
        t = __reduce_min_sync(FULL, above < V ? k : ~0u);
    }
    // the received candidates >= t, each thread Shape::recv / T slots, one atomic per thread
    uint2* s_surv = reinterpret_cast<uint2*>(s_data);      // block 0's chunk is done with
    constexpr int SLOTS = Shape::recv / T;
    uint2 c[SLOTS];
    uint32_t keep = 0;
#pragma unroll
    for (int it = 0; it < SLOTS; ++it) {
        const int e = tid + it * T;
        const int b = e / SEND_CAP;
        const int j = e - b * SEND_CAP;
        const bool real = j < (int)r_count[b];
        c[it] = real ? r_cand[b][j] : make_uint2(0u, 0u);
        keep |= (real && c[it].x >= t ? 1u : 0u) << it;
    }
    if (keep) {
        uint32_t slot = shared_add(&s_survivors, (uint32_t)__popc(keep));
#pragma unroll
        for (int it = 0; it < SLOTS; ++it) {
            if (keep >> it & 1u) s_surv[slot++] = c[it];
        }
    }
    if (warp == 1) {                                        // the row's statistics: sum in the base of its maximum
        const float bm = lane < S ? r_m[lane] : -FLT_MAX;
        const float row_max = key2f(__reduce_max_sync(FULL, f2key(bm)));
        const float sum = warp_sum(lane < S ? r_s[lane] * ex2((bm - row_max) * LOG2E) : 0.0f);
        if (lane == 0) { s_stat[0] = row_max; s_stat[1] = logf(sum); }
    }
    __syncthreads();
    // the survivors hold the row's top V (at least V of them): rank them and write the outputs
    const uint32_t survivors = s_survivors;
    const float row_max = s_stat[0];
    const float lsum = s_stat[1];
    const size_t out = (size_t)row * V;
    if (survivors <= 32u) {
        if (warp == 0 && lane < (int)survivors) {
            const uint2 mine = s_surv[lane];
            uint32_t rank = 0;
#pragma unroll
            for (int j = 0; j < 32; ++j) {
                if (j < (int)survivors) {
                    const uint2 o = s_surv[j];
                    rank += better(o.x, o.y, mine.x, mine.y) ? 1u : 0u;
                }
            }
            if (rank < (uint32_t)V) {
                top_ids[out + rank] = (int)mine.y;
                top_logp[out + rank] = (key2f(mine.x) - row_max) - lsum;
            }
        }
    } else {                                                // ties at t
        place_by_rank(s_surv, survivors, (uint32_t)tid, (uint32_t)T, (uint32_t)V, s_topk, s_topi);
        __syncthreads();
        if (tid < V) {
            top_ids[out + tid] = (int)s_topi[tid];
            top_logp[out + tid] = (key2f(s_topk[tid]) - row_max) - lsum;
        }
    }
}

// ---- general path ---------------------------------------------------------------------------------------
__device__ __forceinline__ unsigned long long comp(float x, int id) {
    return ((unsigned long long)f2key(x) << ID_BITS) | (unsigned long long)(ID_MASK - (uint32_t)id);
}

// Warp-uniform shared-memory histogram increment, aggregated over lanes hitting the same bin (real logits
// crowd into a few top-bit bins; plain atomics would serialise 32-way).
__device__ __forceinline__ void warp_hist_add(uint32_t* hist, uint32_t bin, bool ok, int lane) {
    if (!__any_sync(FULL, ok)) return;
    const uint32_t peers = __match_any_sync(FULL, ok ? bin : 0xffffffffu);
    if (ok && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (uint32_t)__popc(peers));
}

// Exclusive prefix sum over the block in thread order (GEN_THREADS threads).
__device__ __forceinline__ uint32_t block_excl_scan(uint32_t v, uint32_t* s_w, int lane, int warp) {
    const uint32_t inc = kdt::warp_inclusive_scan(v);
    if (lane == 31) s_w[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        const uint32_t t = kdt::warp_inclusive_scan(lane < GEN_WARPS ? s_w[lane] : 0u);
        if (lane < GEN_WARPS) s_w[lane] = t;
    }
    __syncthreads();
    const uint32_t r = (warp ? s_w[warp - 1] : 0u) + inc - v;
    __syncthreads();
    return r;
}

template <typename Tin>
__device__ __forceinline__ void general_impl(const Tin* __restrict__ logits, int* __restrict__ top_ids,
                                             float* __restrict__ top_logp, int vocab, int V) {
    using E = Elem<Tin>;
    constexpr int T = GEN_THREADS;
    constexpr int U = GEN_U;
    constexpr int BPT = GEN_BINS / T;

    __shared__ uint32_t hist[GEN_BINS];
    __shared__ unsigned long long cand[MAX_V];
    __shared__ uint32_t s_w[GEN_WARPS];
    __shared__ float s_m[GEN_WARPS];
    __shared__ float s_s[GEN_WARPS];
    __shared__ float s_stat[2];
    __shared__ uint32_t s_digit, s_above, s_cnt;

    if (V < 1 || V > MAX_V || V > vocab || vocab > MAX_VOCAB) return;   // launcher bug guard

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int row = blockIdx.x;
    const Tin* rp = logits + (size_t)row * (size_t)vocab;

    // f(x, id, ok) on every slot of the row, called warp-uniformly (ok = false past the end of the row);
    // U coalesced scalar loads in flight per thread
    auto for_each = [&](auto&& f) {
        for (int b = 0; b < vocab; b += T * U) {
            float x[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int j = b + u * T + tid;
                x[u] = j < vocab ? E::load1(rp + j) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int j = b + u * T + tid;
                f(x[u], j, j < vocab);
            }
        }
    };

    for (int i = tid; i < GEN_BINS; i += T) hist[i] = 0u;
    __syncthreads();

    // pass 1: softmax statistics + histogram of the top 11 bits (= key >> 21)
    float m = -FLT_MAX, s = 0.0f;
    for (int b = 0; b < vocab; b += T * U) {
        float x[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = b + u * T + tid;
            ok[u] = j < vocab;
            x[u] = ok[u] ? E::load1(rp + j) : neg_inf();
        }
        float gm = x[0];
#pragma unroll
        for (int u = 1; u < U; ++u) gm = fmaxf(gm, x[u]);
        raise_max(m, s, gm);
        float ev[U];
#pragma unroll
        for (int u = 0; u < U; ++u) ev[u] = ex2((x[u] - m) * LOG2E);
        s += tree_sum(ev);
#pragma unroll
        for (int u = 0; u < U; ++u) warp_hist_add(hist, f2key(x[u]) >> 21, ok[u], lane);
    }
    warp_fold_stats(m, s);
    if (lane == 0) { s_m[warp] = m; s_s[warp] = s; }
    __syncthreads();
    if (warp == 0) fold_stats(s_m, s_s, GEN_WARPS, s_stat, lane);
    // (the __syncthreads inside block_excl_scan orders s_stat and hist)

    // radix select on the composite: nb bits fixed (= prefix P), `need` still wanted among its elements
    uint32_t need = (uint32_t)V;
    unsigned long long P = 0ull;
    int nb = 0;
    int w = 11;
    for (;;) {
        const int nbins = 1 << w;
        uint32_t c = 0u;
#pragma unroll
        for (int q = 0; q < BPT; ++q) {
            const int idx = tid * BPT + q;
            if (idx < nbins) c += hist[nbins - 1 - idx];
        }
        const uint32_t ex = block_excl_scan(c, s_w, lane, warp);
        if (ex < need && need <= ex + c) {   // exactly one thread
            uint32_t run = ex;
#pragma unroll
            for (int q = 0; q < BPT; ++q) {
                const int idx = tid * BPT + q;
                if (idx < nbins) {
                    const uint32_t h = hist[nbins - 1 - idx];
                    if (run + h >= need) {
                        s_digit = (uint32_t)(nbins - 1 - idx);
                        s_above = run;
                        break;
                    }
                    run += h;
                }
            }
        }
        __syncthreads();
        const uint32_t d = s_digit;
        const uint32_t hd = hist[d];
        need -= s_above;
        P = (P << w) | d;
        nb += w;
        __syncthreads();
        for (int i = tid; i < GEN_BINS; i += T) hist[i] = 0u;
        __syncthreads();
        if (hd == need) break;          // every element with this prefix is taken (always true at nb = 50)
        w = min(11, COMP_BITS - nb);
        const int shp = COMP_BITS - nb, shd = COMP_BITS - nb - w;
        const uint32_t mask = (1u << w) - 1u;
        const unsigned long long Pc = P;
        for_each([&](float x, int j, bool ok) {
            const unsigned long long cc = comp(x, j);
            warp_hist_add(hist, (uint32_t)(cc >> shd) & mask, ok && (cc >> shp) == Pc, lane);
        });
        __syncthreads();
    }

    // gather exactly V elements: prefix >= P
    if (tid == 0) s_cnt = 0u;
    __syncthreads();
    {
        const int shp = COMP_BITS - nb;
        const unsigned long long Pc = P;
        for_each([&](float x, int j, bool ok) {
            const unsigned long long cc = comp(x, j);
            const bool sel = ok && (cc >> shp) >= Pc;
            const uint32_t bal = __ballot_sync(FULL, sel);
            if (bal) {
                uint32_t b0 = 0u;
                if (lane == __ffs(bal) - 1) b0 = atomicAdd(&s_cnt, (uint32_t)__popc(bal));
                b0 = __shfl_sync(FULL, b0, __ffs(bal) - 1);
                const uint32_t slot = b0 + (uint32_t)__popc(bal & ((1u << lane) - 1u));
                if (sel && slot < (uint32_t)MAX_V) cand[slot] = cc;
            }
        });
    }
    __syncthreads();
    int p2 = 1;
    while (p2 < V) p2 <<= 1;
    for (int i = V + tid; i < p2; i += T) cand[i] = 0ull;
    __syncthreads();
    // bitonic sort, descending
    for (int k = 2; k <= p2; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int t = tid; t < (p2 >> 1); t += T) {
                const int i = (t / j) * 2 * j + (t % j);
                const int pj = i + j;
                const bool desc = (i & k) == 0;
                const unsigned long long a = cand[i], bb = cand[pj];
                if ((a < bb) == desc) { cand[i] = bb; cand[pj] = a; }
            }
            __syncthreads();
        }
    }
    const float bm = s_stat[0];
    const float lsum = logf(s_stat[1]);
    for (int r = tid; r < V; r += T) {
        const unsigned long long cc = cand[r];
        const size_t o = (size_t)row * V + r;
        top_ids[o] = (int)(ID_MASK - (uint32_t)(cc & ID_MASK));
        top_logp[o] = (key2f((uint32_t)(cc >> ID_BITS)) - bm) - lsum;
    }
}

}  // namespace

// ---- exported launch constants (read by kdt/launch/topk.py through module.get_global) ------------------
extern "C" __constant__ int kdt_topk_small_threads = SMALL_THREADS;
extern "C" __constant__ int kdt_topk_small_max_v = SMALL_MAX_V;
extern "C" __constant__ int kdt_topk_max_splits = MAX_SPLITS;
extern "C" __constant__ int kdt_topk_merge_cap = MERGE_CAP;
extern "C" __constant__ int kdt_topk_general_threads = GEN_THREADS;
extern "C" __constant__ int kdt_topk_max_v = MAX_V;
extern "C" __constant__ int kdt_topk_max_vocab = MAX_VOCAB;
extern "C" __constant__ int kdt_topk_small_stage_bytes = SMALL_STAGE_BYTES;
extern "C" __constant__ int kdt_topk_cluster_size = ROW_CLUSTER;
extern "C" __constant__ int kdt_topk_resident_max_v = RES_VT;
extern "C" __constant__ int kdt_topk_resident_threads = RES_THREADS;
extern "C" __constant__ int kdt_topk_resident_wide_cluster = ResWide::cluster;
extern "C" __constant__ int kdt_topk_resident_wide_max_vectors = ResWide::max_vectors;
extern "C" __constant__ int kdt_topk_resident_wide_min_smem = ResWide::min_smem;
extern "C" __constant__ int kdt_topk_resident_narrow_cluster = ResNarrow::cluster;
extern "C" __constant__ int kdt_topk_resident_narrow_max_vectors = ResNarrow::max_vectors;
extern "C" __constant__ int kdt_topk_resident_narrow_min_smem = ResNarrow::min_smem;

// ---- entry points ---------------------------------------------------------------------------------------
#define KDT_TOPK_SMALL_ENTRY(NAME, TIN, VT, CLUSTER)                                                        \
    extern "C" __global__ void __launch_bounds__(SMALL_THREADS, SMALL_MIN_BLOCKS) NAME(                       \
        const TIN* __restrict__ logits, int* __restrict__ top_ids, float* __restrict__ top_logp,          \
        unsigned char* __restrict__ ws, int vocab, int V, int chunk, int S) {                            \
        small_impl<TIN, VT, CLUSTER>(logits, top_ids, top_logp, ws, vocab, V, chunk, S);                  \
    }
// kdt_topk_small_<dtype>_v<VT>: S blocks per row (merged through the workspace when S > 1);
// kdt_topk_cluster_<dtype>_v<VT>: S = ROW_CLUSTER blocks per row in one cluster (no workspace).
#define KDT_TOPK_SMALL(DT, TIN, VT)                                                                         \
    KDT_TOPK_SMALL_ENTRY(kdt_topk_small_##DT##_v##VT, TIN, VT, 1)                                           \
    KDT_TOPK_SMALL_ENTRY(__cluster_dims__(ROW_CLUSTER, 1, 1) kdt_topk_cluster_##DT##_v##VT, TIN, VT, ROW_CLUSTER)

KDT_TOPK_SMALL(f32, float, 1)
KDT_TOPK_SMALL(f32, float, 2)
KDT_TOPK_SMALL(f32, float, 4)
KDT_TOPK_SMALL(f32, float, 8)
KDT_TOPK_SMALL(f32, float, 16)
KDT_TOPK_SMALL(f32, float, 32)
KDT_TOPK_SMALL(bf16, uint16_t, 1)
KDT_TOPK_SMALL(bf16, uint16_t, 2)
KDT_TOPK_SMALL(bf16, uint16_t, 4)
KDT_TOPK_SMALL(bf16, uint16_t, 8)
KDT_TOPK_SMALL(bf16, uint16_t, 16)
KDT_TOPK_SMALL(bf16, uint16_t, 32)

// kdt_topk_resident_<shape>_<dtype>: one cluster of SHAPE::cluster blocks per row, the chunk in dynamic shared
// memory.
#define KDT_TOPK_RESIDENT(NAME, TIN, SHAPE)                                                                  \
    extern "C" __global__ void __cluster_dims__(SHAPE::cluster, 1, 1)                                         \
        __launch_bounds__(RES_THREADS, SHAPE::min_blocks)                                                     \
        NAME(const TIN* __restrict__ logits, int* __restrict__ top_ids, float* __restrict__ top_logp,        \
             int vocab, int V, int chunk) {                                                                  \
        resident_impl<TIN, SHAPE>(logits, top_ids, top_logp, vocab, V, chunk);                               \
    }
KDT_TOPK_RESIDENT(kdt_topk_resident_wide_f32, float, ResWide)
KDT_TOPK_RESIDENT(kdt_topk_resident_wide_bf16, uint16_t, ResWide)
KDT_TOPK_RESIDENT(kdt_topk_resident_narrow_f32, float, ResNarrow)
KDT_TOPK_RESIDENT(kdt_topk_resident_narrow_bf16, uint16_t, ResNarrow)

extern "C" __global__ void __launch_bounds__(GEN_THREADS, 1)
kdt_topk_general_f32(const float* __restrict__ logits, int* __restrict__ top_ids, float* __restrict__ top_logp,
                     int vocab, int V) {
    general_impl<float>(logits, top_ids, top_logp, vocab, V);
}

extern "C" __global__ void __launch_bounds__(GEN_THREADS, 1)
kdt_topk_general_bf16(const uint16_t* __restrict__ logits, int* __restrict__ top_ids, float* __restrict__ top_logp,
                      int vocab, int V) {
    general_impl<uint16_t>(logits, top_ids, top_logp, vocab, V);
}
