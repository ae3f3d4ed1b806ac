// kernels/topk/gate.cuh -- the gate path (32 < V <= 1024, rows 16-byte aligned): one block of 1024 threads per row
// reads the row once, in 16-byte vectors (f32 rows through a cp.async ring on the 227 KB parts), and keeps in a
// shared buffer every element whose composite reaches the gate, a lower bound of the row's V-th best composite
// (opened at the first step's V-th best vector maximum; bf16 vectors tested by packed compares, a part's vectors
// appended with one reservation except in the one-block f32 kernel). The one-block bf16 kernel on the 227 KB parts
// instead keeps every vector's maximum and takes the gate from the V-th best of them after the scan, then reads the
// vectors that reach it again (topk/gate_maxima.cuh). The warps stream without block barriers: a warp
// whose append passes a mark (or finds the buffer full) raises a flag, every warp meets the others at the end of its
// half step (a split's: its step; at once, if the buffer is full or it has finished), and the block prunes the
// buffer by radix select, which raises the gate. The meeting's barriers are the divergent kind (warps reach them
// from different places). The softmax statistics ride in the same pass; a rank of what the buffer holds writes the V
// best. Exact: an element below the gate is below V kept ones. Split rows (few rows, SPLIT): S blocks a row each
// keep their columns' V best, and the row's last block to finish merges them through the workspace.
// gate_impl<Tin, SPLIT> serves kdt_topk_gate_{f32,bf16} and kdt_topk_gate_split_{f32,bf16}. Design, figures:
// plans/kernels/topk.md, "Gate path (wide V)".
#pragma once

#include <float.h>
#include <stdint.h>

#include <type_traits>

#include "common/bits.cuh"
#include "common/ptx.cuh"
#include "topk/config.cuh"
#include "topk/elements.cuh"
#include "topk/gate_maxima.cuh"
#include "topk/keys.cuh"
#include "topk/radix.cuh"
#include "topk/softmax.cuh"

namespace topk {

static_assert(GATE_WARPS == 32, "a warp reduces the warps' maxima");

// The block's state besides the buffer.
struct GateShared {
    uint32_t hist[GEN_BINS];        // radix_select's histogram
    uint32_t warp_sum[GATE_WARPS];  // block_excl_scan's partials
    uint32_t warp_max[GATE_WARPS];  // each warp's largest key so far, written at every rendezvous
    float m[GATE_WARPS];
    float s[GATE_WARPS];
    float stat[2];
    unsigned long long gate;        // the gate after the last prune
    uint32_t digit, above;          // radix_select's
    uint32_t count;                 // entries reserved in the buffer (may run past the capacity: then full)
    uint32_t prune;                 // a warp asks for a prune (its append passed the mark or found the buffer full)
};

// The gate G (a composite: every kept element reaches it) in the forms the scan tests: x > gf passes, x == gf
// passes when id <= gid, x < gf fails -- exactly comp(x, id) >= G for non-NaN x (f2key is monotone and maps -0
// to +0; a gate key below -inf's has no float image: then every element passes). For bf16 elements the same test
// on bf16 pairs: x > gf iff x > below, and x >= least holds for x > gf and for x == gf only, where below and least
// are the bf16 values next to gf (both gf itself when gf is a bf16 value; gf is never NaN).
struct BlockGate {
    unsigned long long cc = 0ull;
    float gf = neg_inf();
    uint32_t gid = ~0u;
    uint32_t below2 = 0xff80ff80u;   // bf16 pairs (the f32 kernels never read them)
    uint32_t least2 = 0xff80ff80u;

    __device__ __forceinline__ void set(unsigned long long c) {
        cc = c;
        const uint32_t k = (uint32_t)(c >> ID_BITS);
        const bool open = k < f2key(neg_inf());
        gf = open ? neg_inf() : key2f(k);
        gid = open ? ~0u : ID_MASK - (uint32_t)(c & ID_MASK);
        // gf's bits truncated to bf16 round toward zero: below gf when positive, above it when negative
        const uint32_t u = __float_as_uint(gf), t = u >> 16;
        const bool exact = (u & 0xffffu) == 0u, negative = (u >> 31) != 0u;
        const uint32_t below = exact ? t : (negative ? t + 1u : t);
        const uint32_t least = exact ? t : (negative ? t : t + 1u);
        below2 = below * 0x10001u;
        least2 = least * 0x10001u;
    }
    // branch-free: the compares combine as predicates
    __device__ __forceinline__ bool passes(float x, uint32_t id) const {
        return (x > gf) | ((x == gf) & (id <= gid));
    }
};

// Bit e set where element e of a vector (ids id0 + e) passes the gate (none where !hot).
__device__ __forceinline__ uint32_t gate_mask(const float4& v, const BlockGate& g, uint32_t id0, bool hot = true) {
    const float x[4] = {v.x, v.y, v.z, v.w};
    uint32_t pass = 0u;
#pragma unroll
    for (int e = 0; e < 4; ++e) pass |= (hot & g.passes(x[e], id0 + (uint32_t)e) ? 1u : 0u) << e;
    return pass;
}
// bf16: two compares a pair (HSET2) and no unpacking. Ties (x == gf) pass where id <= gid: a prefix of the vector's
// ids. Each compare leaves 0xff in the two bytes of a passing half; two byte permutes gather elements 0-3 and 4-7
// one byte each, and a multiply sums the bytes (disjoint bits, no carries) into the top byte.
__device__ __forceinline__ uint32_t gate_mask(const uint4& v, const BlockGate& g, uint32_t id0, bool hot = true) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t above[4], reach[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        above[i] = kdt::bf16x2_gt_mask(w[i], g.below2);
        reach[i] = kdt::bf16x2_ge_mask(w[i], g.least2);
    }
    auto to_bits = [](const uint32_t (&m)[4]) {
        const uint32_t lo = __byte_perm(m[0], m[1], 0x6420), hi = __byte_perm(m[2], m[3], 0x6420);
        return (((lo & 0x08040201u) | (hi & 0x80402010u)) * 0x01010101u) >> 24;
    };
    const uint32_t ids_ok = g.gid < id0 ? 0u : 0xffu >> (7u - min(g.gid - id0, 7u));
    return hot ? to_bits(reach) & (to_bits(above) | ids_ok) : 0u;
}

// buf[0 .. n) (n > V) pruned in place to its V best plus at most `slack` (those of the radix select's last bin);
// returns the new gate. Every entry lies in [gate, (hi_key, any id)]: their common prefix is skipped. Its barriers
// are the divergent kind: the warps may have come from different places (gate_rendezvous).
__device__ __forceinline__ unsigned long long gate_prune(unsigned long long* buf, uint32_t n, int V, uint32_t slack,
                                                         unsigned long long gate, uint32_t hi_key, GateShared& sh) {
    constexpr int T = GATE_THREADS;
    const int tid = threadIdx.x, lane = tid & 31;
    const unsigned long long hi = comp_ceiling(hi_key);
    const unsigned long long diff = gate ^ hi;
    const int nb0 = diff ? __clzll((long long)diff) - (64 - COMP_BITS) : COMP_BITS - 1;
    unsigned long long P;
    int nb;
    radix_select<DivergentBarrier>((uint32_t)V, slack, false, hi >> (COMP_BITS - nb0), nb0,
                 [&](auto&& f) {
                     for (uint32_t b = 0; b < n; b += T) {
                         const uint32_t i = b + tid;
                         f(i < n ? buf[i] : 0ull, i < n);
                     }
                 },
                 sh.hist, sh.warp_sum, sh.digit, sh.above, P, nb);
    const int shp = COMP_BITS - nb;
    // compaction in place: the whole buffer in registers first
    unsigned long long held[GATE_MAX_CAPACITY / T];
#pragma unroll
    for (int q = 0; q < GATE_MAX_CAPACITY / T; ++q) {
        const uint32_t i = (uint32_t)(q * T + tid);
        held[q] = i < n ? buf[i] : 0ull;
    }
    if (tid == 0) sh.count = 0u;
    DivergentBarrier::sync();
#pragma unroll
    for (int q = 0; q < GATE_MAX_CAPACITY / T; ++q) {
        const uint32_t i = (uint32_t)(q * T + tid);
        const bool sel = i < n && (held[q] >> shp) >= P;
        const uint32_t bal = __ballot_sync(FULL, sel);
        if (bal) {
            uint32_t b0 = 0u;
            if (lane == __ffs(bal) - 1) b0 = atomicAdd(&sh.count, (uint32_t)__popc(bal));
            b0 = __shfl_sync(FULL, b0, __ffs(bal) - 1);
            if (sel) buf[b0 + (uint32_t)__popc(bal & ((1u << lane) - 1u))] = held[q];
        }
    }
    const unsigned long long raised = (P << shp) > gate ? (P << shp) : gate;
    if (tid == 0) {
        sh.gate = raised;
        sh.prune = 0u;
    }
    DivergentBarrier::sync();
    return raised;
}

// Where the warps meet: every warp of the block calls it, from wherever it is (a single body, so its barriers are
// the same instructions for all). If a warp asked for a prune, the block prunes the buffer; `finished`: no prune was
// asked, so every warp has finished its steps (a scanning warp comes only when a prune is asked). Returns the
// gate. hi_key: the largest key the warp has seen.
__device__ __noinline__ unsigned long long gate_rendezvous(unsigned long long* buf, int capacity, int V,
                                                           GateShared& sh, uint32_t hi_key, bool& finished) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncwarp();
    if (lane == 0) sh.warp_max[warp] = hi_key;
    kdt::block_barrier_divergent();
    const bool prune = sh.prune != 0u;
    finished = !prune;
    if (!prune) return sh.gate;
    const uint32_t hi = __reduce_max_sync(FULL, sh.warp_max[lane]);
    const uint32_t n = min(sh.count, (uint32_t)capacity);
    // an intermediate prune may keep the radix select's last bin whole (up to V / 2 more, below the mark)
    return gate_prune(buf, n, V, (uint32_t)V / 2u, sh.gate, hi, sh);
}

// The warp's largest key so far (the rendezvous' upper bound of the buffer).
__device__ __forceinline__ uint32_t warp_hi_key(float m) { return __reduce_max_sync(FULL, f2key(m)); }

// The ids of a lane's vectors 32 apart in the row (a step's): element e of vector u is id0 + u * 32 * W + e.
template <int W>
struct StridedIds {
    uint32_t id0;
    __device__ __forceinline__ uint32_t operator()(int u) const { return id0 + (uint32_t)(u * 32 * W); }
};

// The pass bits of H vectors of a lane (bit u * W + e: element e of vector u, id id_of(u) + e) against the gate.
template <typename E, int H, class IdOf>
__device__ __forceinline__ uint32_t gate_masks(const typename E::Vec (&v)[H], const BlockGate& g, const IdOf& id_of) {
    uint32_t pass = 0u;
#pragma unroll
    for (int u = 0; u < H; ++u) pass |= gate_mask(v[u], g, id_of(u)) << (u * E::W);
    return pass;
}

// Appends the elements of H vectors of a lane (bit u * W + e is element e of vector u, id id_of(u) + e) whose bits
// are set in `pass` to the buffer, one shared atomic per lane with candidates (they are few: a scan over the warp
// would cost more). Past `mark` the warp asks for a prune (the warps meet at their next look); when the buffer is
// full, it meets them now and re-tests what is left against the raised gate.
template <typename E, int H, class IdOf>
__device__ __forceinline__ void gate_append(const typename E::Vec (&v)[H], const IdOf& id_of, uint32_t pass,
                                            BlockGate& g, unsigned long long* buf, int capacity, uint32_t mark,
                                            int V, GateShared& sh, float m) {
    constexpr int W = E::W;
    static_assert(H * W <= 32 && (W & (W - 1)) == 0, "a pass bit per element");
    while (__any_sync(FULL, pass != 0u)) {
        const uint32_t c = (uint32_t)__popc(pass);
        uint32_t slot = c ? atomicAdd(&sh.count, c) : 0u;
        const bool past_mark = c && slot + c > mark;
        while (pass != 0u && slot < (uint32_t)capacity) {
            const int b = __ffs(pass) - 1;
            pass &= pass - 1u;
            const uint32_t id = H == 1 ? id_of(0) + (uint32_t)b : id_of(b / W) + (uint32_t)(b % W);
            buf[slot++] = comp(E::at(v, b), (int)id);
        }
        if (__any_sync(FULL, past_mark) && (threadIdx.x & 31) == 0) atomicOr(&sh.prune, 1u);
        if (__any_sync(FULL, pass != 0u)) {   // the buffer is full
            bool finished;
            g.set(gate_rendezvous(buf, capacity, V, sh, warp_hi_key(m), finished));
            pass &= gate_masks<E>(v, g, id_of);
        }
    }
}

// A gate from the block's first step: the key of the V-th best vector maximum (V of its vectors hold an element
// with at least that key), or a little below it (the radix select may keep its last bin whole). Block-wide.
template <typename E, int U>
__device__ __forceinline__ unsigned long long gate_from_maxima(const typename E::Vec (&v)[U], const bool (&valid)[U],
                                                               int V, GateShared& sh) {
    unsigned long long tagged[U];   // (key of the maximum, reversed vector tag): unique, as radix_select needs
#pragma unroll
    for (int u = 0; u < U; ++u)
        tagged[u] = ((unsigned long long)f2key(E::vmax_float(E::vmax(v[u]))) << ID_BITS) |
                    (ID_MASK - (uint32_t)(threadIdx.x * U + u));
    unsigned long long P;
    int nb;
    radix_select<AlignedBarrier>((uint32_t)V, (uint32_t)V, false, 0ull, 0,
                 [&](auto&& f) {
#pragma unroll
                     for (int u = 0; u < U; ++u) f(tagged[u], valid[u]);
                 },
                 sh.hist, sh.warp_sum, sh.digit, sh.above, P, nb);
    const unsigned long long gate = ((P << (COMP_BITS - nb)) >> ID_BITS) << ID_BITS;   // every id of the key
    if (threadIdx.x == 0) sh.gate = gate;
    return gate;   // sh.gate is read only after a later barrier
}

// buf[0 .. n) (V <= n <= GATE_RANK_HELD * T, 2 n <= capacity): entries all in [lo, (hi_key, any id)]; their V best
// written in descending order as row `row`'s outputs, with no prune first. An entry's place = the entries in
// higher bins of an 11-bit digit just below the common prefix of lo and hi, plus the larger ones of its own bin;
// only bins that start below V are gathered and ranked (bins of real logits hold a few). hist[b] holds bin b's
// start << 16 plus the entries placed so far, so one atomic gives an entry its slot and the bin's start. A bin
// that starts below V with more than GATE_RANK_BIN entries (tied keys share one) takes the exact prune and the
// bitonic sort instead. buf[n .. n + V + GATE_RANK_BIN) is scratch. hist is left dirty (nothing selects after).
__device__ __forceinline__ void rank_and_write(unsigned long long* buf, uint32_t n, int V, unsigned long long lo,
                                               uint32_t hi_key, GateShared& sh, int row, int* __restrict__ top_ids,
                                               float* __restrict__ top_logp) {
    constexpr int T = GATE_THREADS;
    constexpr int BPT = GEN_BINS / T;
    constexpr int HELD = GATE_RANK_HELD;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    unsigned long long* const grouped = buf + n;                      // [< V + GATE_RANK_BIN]: bins below V
    const unsigned long long diff = lo ^ comp_ceiling(hi_key);
    const int top = diff ? 63 - __clzll((long long)diff) : 0;
    const int shift = max(0, top - 10);                               // the digit: bits shift .. top
    unsigned long long e[HELD];
    uint32_t bin[HELD];
#pragma unroll
    for (int q = 0; q < HELD; ++q) {
        const uint32_t i = (uint32_t)(q * T + tid);
        e[q] = i < n ? buf[i] : 0ull;
        bin[q] = (uint32_t)(e[q] >> shift) & (uint32_t)(GEN_BINS - 1);
        if (i < n) atomicAdd(&sh.hist[bin[q]], 1u);                  // hist is zero (radix_select leaves it so)
    }
    __syncthreads();
    uint32_t count[BPT], c = 0u;
#pragma unroll
    for (int q = 0; q < BPT; ++q) {                                   // thread t: bins 2047 - 2t, 2046 - 2t
        count[q] = sh.hist[GEN_BINS - 1 - (tid * BPT + q)];
        c += count[q];
    }
    uint32_t above = block_excl_scan<AlignedBarrier>(c, sh.warp_sum, lane, warp);
    bool crowded = false;
#pragma unroll
    for (int q = 0; q < BPT; ++q) {
        crowded |= above < (uint32_t)V && count[q] > (uint32_t)GATE_RANK_BIN;
        sh.hist[GEN_BINS - 1 - (tid * BPT + q)] = above << 16;        // only this thread touched these bins
        above += count[q];
    }
    if (__syncthreads_or(crowded)) {                                  // a crowded bin: prune exactly, then sort
        for (int i = tid; i < GEN_BINS; i += T) sh.hist[i] = 0u;
        __syncthreads();
        if (n > (uint32_t)V) gate_prune(buf, n, V, 0u, lo, hi_key, sh);
        __syncthreads();
        sort_and_write(buf, V, sh.stat, row, top_ids, top_logp);
        return;
    }
    bool ranked[HELD];
#pragma unroll
    for (int q = 0; q < HELD; ++q) {
        ranked[q] = (uint32_t)(q * T + tid) < n && (sh.hist[bin[q]] >> 16) < (uint32_t)V;   // the start never moves
        if (ranked[q]) {
            const uint32_t h = atomicAdd(&sh.hist[bin[q]], 1u);
            grouped[(h >> 16) + (h & 0xffffu)] = e[q];
        }
    }
    __syncthreads();
    const float bm = sh.stat[0], lsum = logf(sh.stat[1]);
#pragma unroll
    for (int q = 0; q < HELD; ++q) {
        if (ranked[q]) {
            const uint32_t h = sh.hist[bin[q]];                       // start << 16 | the bin's entries
            const uint32_t from = h >> 16, to = from + (h & 0xffffu);
            uint32_t place = from;
            for (uint32_t t = from; t < to; ++t) place += (grouped[t] > e[q]) ? 1u : 0u;
            if (place < (uint32_t)V) write_output(e[q], row, V, (int)place, bm, lsum, top_ids, top_logp);
        }
    }
}

// A split's record in the workspace (two 16-byte words): its softmax statistics over its columns, how many
// entries it left (its V best, or all its columns if fewer), the largest key it saw and a composite below all of
// its entries (the merge's radix select starts from their common prefix).
struct GateSplitRecord {
    float m, s;
    uint32_t count, hi_key;
    unsigned long long lo;
};

// The workspace of split rows (kdt/launch/topk.py lays it out the same way): u32 counter[R] | two uint4 a split
// [R][S] | u64 entries[R][S][V], each part from a 256-byte boundary. The counters end every launch at zero.
struct GateWorkspace {
    uint32_t* counter;
    uint4* record;
    unsigned long long* entries;
    __device__ __forceinline__ GateWorkspace(unsigned char* ws, int R, int S) {
        const size_t a = ((size_t)R * 4 + 255) & ~(size_t)255;
        const size_t b = ((size_t)R * S * 32 + 255) & ~(size_t)255;
        counter = reinterpret_cast<uint32_t*>(ws);
        record = reinterpret_cast<uint4*>(ws + a);
        entries = reinterpret_cast<unsigned long long*>(ws + a + b);
    }
};

// Split rows: every block stores its entries and record, and the row's last block to finish (a counter per row,
// put back to zero by it) gathers the splits' entries into its buffer (S * V <= capacity) and their statistics.
// Returns false in every block but that one. On return (true) buf[0 .. n) holds the entries, all in [lo, hi_key].
__device__ __forceinline__ bool gate_gather_splits(unsigned long long* buf, const GateSplitRecord& mine,
                                                   unsigned char* __restrict__ ws, int row, int split, int S, int V,
                                                   GateShared& sh, uint32_t& n, unsigned long long& lo,
                                                   uint32_t& hi_key) {
    constexpr int T = GATE_THREADS;
    __shared__ uint32_t last;                         // this block is the row's last to finish (it merges)
    __shared__ uint32_t offset[GATE_MAX_SPLITS + 1];  // where each split's entries go in the buffer
    const int tid = threadIdx.x, lane = tid & 31;
    const int R = (int)(gridDim.x / (unsigned)S);
    const GateWorkspace w(ws, R, S);
    const size_t at = (size_t)row * S + (size_t)split;
    for (uint32_t i = (uint32_t)tid; i < mine.count; i += T) w.entries[at * V + i] = buf[i];
    if (tid == 0) {
        w.record[2 * at] = make_uint4(__float_as_uint(mine.m), __float_as_uint(mine.s), mine.count, mine.hi_key);
        w.record[2 * at + 1] = make_uint4((uint32_t)mine.lo, (uint32_t)(mine.lo >> 32), 0u, 0u);
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&w.counter[row], 1u) == (uint32_t)(S - 1) ? 1u : 0u;
    __syncthreads();
    if (last == 0u) return false;
    __threadfence();
    // warp 0 reads the S records (S <= 32): the offsets, the statistics, the bounds
    if (tid < 32) {
        const bool has = lane < S;
        const size_t r = (size_t)row * S + (size_t)lane;
        const uint4 a = has ? __ldcg(w.record + 2 * r) : make_uint4(0u, 0u, 0u, 0u);
        const uint4 b = has ? __ldcg(w.record + 2 * r + 1) : make_uint4(~0u, ~0u, 0u, 0u);
        uint32_t before = a.z;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const uint32_t o = __shfl_up_sync(FULL, before, off);
            if (lane >= off) before += o;
        }
        offset[lane + 1] = before;                     // inclusive: offset[s + 1] = entries of splits 0 .. s
        if (lane == 0) offset[0] = 0u;
        sh.m[lane] = has ? __uint_as_float(a.x) : -FLT_MAX;
        sh.s[lane] = has ? __uint_as_float(a.y) : 0.0f;
        const unsigned long long l = ((unsigned long long)b.y << 32) | b.x;
        unsigned long long lmin = l;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const unsigned long long o = __shfl_xor_sync(FULL, lmin, off);
            lmin = o < lmin ? o : lmin;
        }
        const uint32_t hmax = __reduce_max_sync(FULL, a.w);
        if (lane == 0) {                                  // the bounds to every thread, through the scan's
            sh.gate = lmin;                               // fields, which nothing reads again before the prune
            sh.warp_max[0] = hmax;
            w.counter[row] = 0u;                          // the next launch finds it zero
        }
    }
    __syncthreads();
    if (tid < 32) fold_stats(sh.m, sh.s, S, sh.stat, lane);
    n = offset[S];
    // entry e of the concatenated lists: every load in flight before the stores (n <= S * V <= capacity), its
    // split found by a binary search over the offsets
    unsigned long long held[GATE_MAX_CAPACITY / T];
#pragma unroll
    for (int q = 0; q < GATE_MAX_CAPACITY / T; ++q) {
        const uint32_t e = (uint32_t)(q * T + tid);
        if (e < n) {
            int lo_split = 0, hi_split = S - 1;           // the split sp with offset[sp] <= e < offset[sp + 1]
            while (lo_split < hi_split) {
                const int mid = (lo_split + hi_split + 1) >> 1;
                if (offset[mid] <= e) lo_split = mid; else hi_split = mid - 1;
            }
            held[q] = __ldcg(w.entries + ((size_t)row * S + (size_t)lo_split) * V + (e - offset[lo_split]));
        }
    }
#pragma unroll
    for (int q = 0; q < GATE_MAX_CAPACITY / T; ++q) {
        const uint32_t e = (uint32_t)(q * T + tid);
        if (e < n) buf[e] = held[q];
    }
    lo = sh.gate;
    hi_key = sh.warp_max[0];
    __syncthreads();
    return true;
}

// The end of a split row's block (its V best in buf[0 .. count), all in [lo, hi_key]): the row's last block to
// finish merges every split's V best and writes the row. Not inlined: the scan's registers stay as they are
// without the merge's select and sort beside them.
__device__ __noinline__ void gate_finish_split(unsigned long long* buf, GateSplitRecord mine, unsigned char* ws,
                                               int V, int S, int capacity, GateShared& sh, int* __restrict__ top_ids,
                                               float* __restrict__ top_logp) {
    const int row = (int)(blockIdx.x / (unsigned)S);
    uint32_t n, hi_key;
    unsigned long long lo;
    if (!gate_gather_splits(buf, mine, ws, row, (int)(blockIdx.x % (unsigned)S), S, V, sh, n, lo, hi_key)) return;
    if (2 * n > (uint32_t)capacity) {                 // the rank's scratch: prune to at most 1.5 V first
        lo = gate_prune(buf, n, V, (uint32_t)V / 2u, lo, hi_key, sh);
        n = sh.count;
    }
    __syncthreads();
    rank_and_write(buf, n, V, lo, hi_key, sh, row, top_ids, top_logp);
}

// A row's top V and log-probabilities from S blocks and one read (block b: row b / S, columns [split * chunk,
// + chunk) of split b % S): buf (dynamic shared memory) holds `capacity` entries, gate_capacity(V). SPLIT: the
// splits meet in the workspace `ws` and the row's last block merges them; without it S = 1, chunk = vocab and
// the kernel is the one-block-per-row kernel it was before splits (a separate entry point, so that the split's
// merge does not change how its scan compiles).
template <typename Tin, bool SPLIT>
__device__ __forceinline__ void gate_impl(const Tin* __restrict__ logits, int* __restrict__ top_ids,
                                          float* __restrict__ top_logp, unsigned char* __restrict__ ws, int vocab,
                                          int V, int capacity, int chunk, int S) {
    using E = Elem<Tin>;
    using Vec = typename E::Vec;
    constexpr int T = GATE_THREADS;
    constexpr int U = GATE_U;
    constexpr int W = E::W;
    constexpr int PARTS = SPLIT ? 1 : 2;          // a step's parts, each followed by a look at the prune flag
    // a part's vectors appended together, after its softmax (one reservation, one look at the mark), or each as it is
    // tested: the one-block f32 kernel, where at V = 64 most vectors are cold and the joint append measured slower
    // (plans/kernels/topk.md, "The bf16 test by packed compares")
    constexpr bool APPEND_PARTS = SPLIT || !std::is_same<Tin, float>::value;
    // the one-block bf16 kernel on the 227 KB parts: the gate from every vector's maximum, after the scan
    // (topk/gate_maxima.cuh; a split's block keeps the first step's gate: G1 K15 V1024 measured 1.09x slower with it)
    constexpr bool MAXIMA = !SPLIT && !std::is_same<Tin, float>::value && GATE_BF16_MAXIMA_BYTES > 0;
    static_assert(U % PARTS == 0, "parts of a step");

    // [capacity], then the f32 ring ([STAGES][U][T] vectors) or the bf16 maxima ([steps * U][T] bf16)
    extern __shared__ unsigned long long buf[];
    __shared__ GateShared sh;

    if (V < 1 || V > MAX_V || V > vocab || vocab > MAX_VOCAB || vocab % W || capacity != gate_capacity(V) ||
        (SPLIT && (S < 2 || S > GATE_MAX_SPLITS || S * V > capacity || ws == nullptr || chunk < 1 || chunk % W ||
                   (long long)chunk * S < vocab || (long long)chunk * (S - 1) >= vocab)))
        return;   // launcher bug guard

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    // the split's columns [col0, col0 + W * vectors) of the row (SPLIT; else the whole row)
    const int row = SPLIT ? (int)(blockIdx.x / (unsigned)S) : (int)blockIdx.x;
    const int col0 = SPLIT ? (int)(blockIdx.x % (unsigned)S) * chunk : 0;
    const Vec* rp = reinterpret_cast<const Vec*>(logits + (size_t)row * (size_t)vocab + col0);
    const int vectors = SPLIT ? min(chunk, vocab - col0) / W : vocab / W;
    // a prune is asked for past 2 V + 128 entries (it leaves at most 1.5 V): the gate rises while the row is read
    const uint32_t mark = (uint32_t)min(2 * V + 128, capacity / 2);

    for (int i = tid; i < GEN_BINS; i += T) sh.hist[i] = 0u;
    if (tid == 0) {
        sh.gate = 0ull;
        sh.count = sh.prune = 0u;
    }
    __syncthreads();

    // each warp's share of a step is one contiguous run of 32 * U vectors (a load instruction reads 512 bytes of it)
    const int warp_first = warp * 32 * U;

    // Steps from 1 on stream through the ring (STAGES > 0): step st's vectors go to slot st % STAGES, copied
    // STAGES steps ahead, one cp.async group a step (empty past the end, so that the count stays uniform). A
    // thread reads back only the vectors it copied: no barrier, only the group wait. The next copies go into the
    // slot just read, after the reads in program order (as the small path's ring).
    constexpr int STAGES = std::is_same<Tin, float>::value ? GATE_F32_STAGES : 0;
    constexpr int RING = STAGES > 0 ? STAGES : 1;
    const int steps = (vectors + T * U - 1) / (T * U);
    // this thread's vector u of step st: ring[((st % RING) * U + u) * T]
    const Vec* const ring = reinterpret_cast<const Vec*>(buf + capacity) + tid;
    auto issue_step = [&](int st) {
        if (st < steps) {
            const int base = st * T * U + warp_first + lane;
            const uint32_t slot = kdt::smem_addr(ring + (st % RING) * U * T);
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (base + u * 32 < vectors) kdt::cp_async16(slot + (uint32_t)(u * T * VEC_BYTES), rp + base + u * 32);
        }
        kdt::cp_async_commit();
    };

    uint16_t* const maxima = reinterpret_cast<uint16_t*>(buf + capacity) + tid;   // MAXIMA

    Softmax sm;
    BlockGate g;
    for (int first = 0, st = 0; first < vectors; first += T * U, ++st) {
        Vec v[U];
        bool valid[U];
        if (STAGES == 0 || st == 0) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int i = first + warp_first + u * 32 + lane;
                valid[u] = i < vectors;
                v[u] = valid[u] ? __ldg(rp + i) : E::ninf_vec();
            }
            if constexpr (STAGES > 0)
                for (int ahead = 1; ahead <= STAGES; ++ahead) issue_step(ahead);   // behind step 0's loads
        } else if constexpr (STAGES > 0) {
            kdt::cp_async_wait<STAGES - 1>();       // this step's group has landed
#pragma unroll
            for (int u = 0; u < U; ++u) {
                valid[u] = first + warp_first + u * 32 + lane < vectors;
                v[u] = valid[u] ? ring[((st % RING) * U + u) * T] : E::ninf_vec();
            }
            issue_step(st + STAGES);
        }
        // The first step opens the gate at the V-th best of its vector maxima (V vectors hold an element at
        // least as good), so that it appends about V elements, not all of them.
        if (!MAXIMA && first == 0 && min(vectors, T * U) >= V) g.set(gate_from_maxima<E>(v, valid, V, sh));
        // the step in parts (the one-block kernel: halves), each followed by a look at the prune flag: a warp that
        // asked waits for the others to reach a meeting, half a step at most (plans/kernels/topk.md, "Meetings
        // within a step"); a split's block keeps whole steps (its rows are short: one or two steps)
#pragma unroll
        for (int part = 0; part < PARTS; ++part) {
            constexpr int H = U / PARTS;
            Vec vh[H];
            bool validh[H];
#pragma unroll
            for (int u = 0; u < H; ++u) {
                vh[u] = v[part * H + u];
                validh[u] = valid[part * H + u];
            }
            if constexpr (MAXIMA) {
                scan_group_maxima<H>(vh, sm, maxima, st * U + part * H);
                continue;                 // nothing appended: no prune to meet for
            } else if constexpr (APPEND_PARTS) {
                // the part's candidates are tested vector by vector and appended together (one reservation)
                const uint32_t id0 =
                    (uint32_t)col0 + (uint32_t)(first + warp_first + part * H * 32 + lane) * (uint32_t)W;
                uint32_t pass = 0u;
                scan_group<E>(vh, validh, sm, g, [&](int u, bool hot) {
                    pass |= gate_mask(vh[u], g, id0 + (uint32_t)(u * 32 * W), hot) << (u * W);
                });
                gate_append<E>(vh, StridedIds<W>{id0}, pass, g, buf, capacity, mark, V, sh, sm.m);
            } else {
                scan_group<E>(vh, validh, sm, g, [&](int u, bool hot) {
                    const Vec one[1] = {vh[u]};
                    const uint32_t id =
                        (uint32_t)col0 + (uint32_t)(first + warp_first + (part * H + u) * 32 + lane) * (uint32_t)W;
                    gate_append<E>(one, StridedIds<W>{id}, gate_mask(vh[u], g, id, hot), g, buf, capacity, mark, V,
                                   sh, sm.m);
                });
            }
            // another warp asked for a prune: meet it. A plain read: a request it misses only waits for the next
            // look, and the flag is cleared only inside a meeting, behind its barriers.
            if (__any_sync(FULL, *reinterpret_cast<volatile const uint32_t*>(&sh.prune) != 0u)) {
                bool finished;
                g.set(gate_rendezvous(buf, capacity, V, sh, warp_hi_key(sm.m), finished));
            }
        }
    }
    if constexpr (STAGES > 0) kdt::cp_async_wait<0>();   // the empty groups past the end
    if constexpr (MAXIMA) {
        // the gate from the V-th best maximum, then the vectors that reach it read again and appended (no prune on
        // rows of real logits; a full buffer meets the others as in the scan)
        __syncthreads();
        if (vectors >= V) {
            g.set(gate_from_row_maxima(maxima, warp_first, lane, vectors, steps, V, sh.hist, sh.warp_sum, sh.digit,
                                       sh.above));
            if (tid == 0) sh.gate = g.cc;   // read only after a later barrier (a meeting's)
        }
        gather_hot(rp, maxima, warp_first, lane, vectors, steps, g.gf,
                   [&](const Vec (&v)[U], const int (&index)[U], const bool (&mine)[U]) {
                       // one reservation for the round's vectors
                       auto id_of = [&](int u) { return (uint32_t)col0 + (uint32_t)index[u] * (uint32_t)W; };
                       uint32_t pass = 0u;
#pragma unroll
                       for (int u = 0; u < U; ++u) pass |= (mine[u] ? gate_mask(v[u], g, id_of(u)) : 0u) << (u * W);
                       gate_append<E>(v, id_of, pass, g, buf, capacity, mark, V, sh, sm.m);
                   });
    }
    // past the last step: meet the others until none asks for a prune (a meeting without a request has every
    // warp here: a warp still scanning comes only when asked)
    for (;;) {
        bool finished;
        g.set(gate_rendezvous(buf, capacity, V, sh, warp_hi_key(sm.m), finished));
        if (finished) break;
    }

    sm.finish();
    float m = sm.m, s = sm.s;
    warp_fold_stats(m, s);
    if (lane == 0) { sh.m[warp] = m; sh.s[warp] = s; }
    __syncthreads();
    if (warp == 0) fold_stats(sh.m, sh.s, GATE_WARPS, sh.stat, lane);
    // every element above the gate is in buf: min(V, columns) <= count <= mark <= capacity / 2 (no prune was asked)
    const uint32_t n = sh.count;
    const uint32_t hi_key = __reduce_max_sync(FULL, sh.warp_max[lane]);
    if constexpr (SPLIT) {
        // the split's V best (fewer only if it has fewer columns) go to the workspace; the row's last block to
        // finish merges every split's
        const unsigned long long lo = n > (uint32_t)V ? gate_prune(buf, n, V, 0u, g.cc, hi_key, sh) : g.cc;
        __syncthreads();
        gate_finish_split(buf, GateSplitRecord{sh.stat[0], sh.stat[1], min(n, (uint32_t)V), hi_key, lo}, ws, V, S,
                          capacity, sh, top_ids, top_logp);
        return;
    }
    rank_and_write(buf, n, V, g.cc, hi_key, sh, row, top_ids, top_logp);
}

}  // namespace topk
