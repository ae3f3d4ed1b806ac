// kernels/tree_sample/draw.cuh -- one draw of the contract's sample(g, i, p) by a cluster of S::CLUSTER blocks (S: the
// Shape), each block a chunk of the row. temperature 0: the argmax. Otherwise z = x * (1 / temperature); top-k and
// top-p each reduce to a threshold in the draw's order (the kept set is a prefix of z descending, id ascending), found
// by histogram levels over the cluster (0.5-nat bins below the row max, then 8-bit digits of z's key, then of the id)
// until the bin holding the cut has at most CAP tokens, which are gathered, sorted and cut exactly; then the Gumbel-max
// over the kept tokens, noise only where z + 17.33 can still beat the best score (exact). Top-p alone first tries the
// tokens within NEAR_NATS of the row max, which each warp keeps in the first pass and the blocks exchange with the max:
// one exchange decides a language model's row.
//
// Exchanges between the blocks alternate two buffers (Draw::round), so a block may write the next round's while
// another still reads this one's; a walk's draws carry the round on, as no cluster barrier separates them.
//
// Probability mass is fixed point: q = round(exp(z - z_max) * 2^31) per token, summed in 64-bit integers (two
// 32-bit shared-memory adds with a carry: the only native shared atomics; float adds are compare-and-swap loops),
// so every block of the cluster, and the final sorted cut, sum exactly the same integers in any order. The total
// rounding is under vocab * 2^-32 of a total >= 1 (3.8e-5 at vocab 163840), inside the contract's 1e-4 decision
// margin, like float32's z. Passes after the first read the chunk from L2. Design: plans/kernels/tree-sample.md.
#pragma once

#include <stdint.h>

#include "common/bits.cuh"
#include "common/cluster.cuh"
#include "common/philox.cuh"
#include "common/ptx.cuh"
#include "tree_sample/row.cuh"

namespace ts {

constexpr int BINS = 256;            // bins of a histogram level (8-bit digits)
constexpr int NATS_BINS = 64;        // the first level: 0.5-nat bins below the row max, the last one open-ended
constexpr int COPIES = 4;            // histogram copies per block (four warps per copy): less same-address contention
constexpr int CAP = 1024;            // the most tokens of a cut bin gathered and sorted
constexpr int LEVELS = 9;            // nats, 4 digits of the key, 4 of ~id: the last leaves one token
constexpr float MASS_ONE = 2147483648.f;  // the fixed-point mass of the row's largest z (2^31)
constexpr float NEAR_NATS = 8.f;     // top-p's first try: the tokens within this of the row max (mass >= e^-8 each)
constexpr int NEAR_PER_WARP = 16;    // the near tokens a warp keeps in the first pass (more: the near pass instead)
constexpr int NEAR_PER_BLOCK = 16;   // the near tokens of a block's list, with their noise (more: the warps' lists)
constexpr uint64_t NO_POSITION = ~0ull;  // a draw's position_of(): this row is not drawn (a slot the walk cannot reach)

// All of a block's shared state (with tree_sample/depth.cuh's TreeSmem): loose __shared__ variables, one per
// template instance, were laid out 4 bytes apart for sm_90 and sm_120 (tests/test_arches.py holds them equal).
struct Smem {
    // read by the other blocks of the cluster; double-buffered by exchange round (round & 1)
    uint32_t pub_count[2][BINS];
    unsigned long long pub_mass[2][BINS];
    unsigned long long pub_value[2];
    uint32_t n_cand;                      // how many tokens this block gathered into cand
    unsigned long long cand[CAP];         // this block's gathered tokens
    // top-p's near tokens from the first pass, published with the first exchange: per warp its largest logit (the
    // float's bits, high word) and how many it had (low word), and the first NEAR_PER_WARP of them
    unsigned long long near_head[2][WARPS];
    unsigned long long near[2][WARPS][NEAR_PER_WARP];
    // the block's near tokens (within NEAR_NATS of its largest z) from those lists, with each one's Gumbel noise, and
    // how many (NEAR_PER_BLOCK + 1: not made, a list it needed was cut short or they are more)
    unsigned long long block_near[2][NEAR_PER_BLOCK];
    float block_noise[2][NEAR_PER_BLOCK];
    uint32_t block_near_count[2];
    // this block's own
    union {  // a level's histogram copies and a gather's lists are never live at once
        struct {
            uint32_t count[COPIES][BINS];
            uint32_t mass_lo[COPIES][BINS], mass_hi[COPIES][BINS];
        } bins;
        struct {
            unsigned long long merged[CAP];  // every block's gathered tokens, as gathered
            union {
                unsigned long long sorted[CAP];  // the same, descending (the levels' cut)
                unsigned long long mass[CAP];    // their fixed-point masses (top-p's near draw; from the
                                                 // blocks' lists, their noise)
            };
        } list;
    };
    uint32_t total_count[BINS];
    unsigned long long total_mass[BINS];
    unsigned long long warp_value[WARPS];
    uint32_t n_merged;                    // merge_listed's count
    // the near lists to read, in order: (first token << 12) | (list << 5) | length
    uint32_t listed[CLUSTER_MAX * WARPS];
    uint32_t listed_lists, listed_total;  // how many lists, and tokens in all
    unsigned long long near_verdict;      // warp 0's verdict on top-p's near draw: (NearVerdict << 32) | token
    float row_max, row_mass;              // top-p alone: the row's largest logit and mass, from the first exchange
    uint32_t offset[CLUSTER_MAX + 1];     // gather_and_sort: where each block's tokens start in merged
    int next, next_depth;                 // the walk's next slot and depth, from thread 0
    uint32_t walks;                       // the every-slot path: this cluster is its request's last, it walks
    unsigned long long decided;           // the block's result of a cut or a draw, for all its threads
    int cut_bin;                          // the scan's result: the bin holding the cut (-1: fewer than asked)
    uint32_t cut_count, before_count;
    unsigned long long before_mass, all_mass;
};

// What one draw works on; identical in every block of the cluster.
template <typename Tin, class S>
struct Draw {
    const Tin* row;
    int begin, end;                       // this block's chunk
    float inv_temperature;
    uint32_t rank;                        // this block in the cluster
    uint32_t round;                       // exchange rounds so far (the buffer of the next is round & 1), carried
                                          // from draw to draw where no cluster barrier separates them (the walk)
    float z_max;
};

// The tokens a histogram level looks at: every token >= floor (the previous filter's threshold) in the first
// level; then those of the cut bins so far (nats bin `nats`, then key digits, then id digits).
struct Filter {
    unsigned long long floor;
    int nats;
    uint32_t key_prefix, key_mask, id_prefix, id_mask;
};

__device__ __forceinline__ int nats_bin(float z, float z_max) {
    const float d = (z_max - z) * 2.f;
    return d < static_cast<float>(NATS_BINS - 1) ? static_cast<int>(d) : NATS_BINS - 1;  // NaN: the last bin
}

__device__ __forceinline__ uint32_t fixed_mass(float z, float z_max) {
    return __float2uint_rn(__expf(z - z_max) * MASS_ONE);
}

// The priority index (0 first) of token (t, z) at `level` of `f`, or -1 when the level does not look at it.
__device__ __forceinline__ int bin_of(const Filter& f, int level, int t, float z, float z_max) {
    if (!(z > -__builtin_huge_valf())) return -1;  // -inf (never drawn) and NaN
    const uint32_t key = order_key(z);
    if (packed(key, t) < f.floor) return -1;
    const int nats = nats_bin(z, z_max);
    if (level == 0) return nats;
    if (nats != f.nats || (key & f.key_mask) != f.key_prefix) return -1;
    if (level <= 4) return BINS - 1 - static_cast<int>((key >> (8 * (4 - level))) & (BINS - 1));
    const uint32_t id = ~static_cast<uint32_t>(t);
    if ((id & f.id_mask) != f.id_prefix) return -1;
    return BINS - 1 - static_cast<int>((id >> (8 * (8 - level))) & (BINS - 1));
}

// Whether token (t, z) is in the set `f` describes (the tokens still undecided after the level that made it).
__device__ __forceinline__ bool in_cut(const Filter& f, int t, float z, float z_max) {
    if (!(z > -__builtin_huge_valf())) return false;
    const uint32_t key = order_key(z);
    return packed(key, t) >= f.floor && nats_bin(z, z_max) == f.nats && (key & f.key_mask) == f.key_prefix &&
           (~static_cast<uint32_t>(t) & f.id_mask) == f.id_prefix;
}

// The cluster-wide barrier, then the block's own: every block of the cluster meets at both, and racecheck, which
// orders shared-memory accesses by block barriers, sees one.
__device__ __forceinline__ void cluster_barrier() {
    kdt::cluster_sync();
    __syncthreads();
}

// merge over the lanes of each aligned group of 2 * FIRST (the whole warp by default), in every lane of the group:
// where only lanes [0, 2 * FIRST) hold values, lane 0 gets them all in log2(2 * FIRST) steps, not five.
template <int FIRST = 16, typename T, class Merge>
__device__ __forceinline__ T warp_reduce(T v, Merge merge) {
#pragma unroll
    for (int d = FIRST; d > 0; d >>= 1) v = merge(v, __shfl_xor_sync(0xffffffffu, v, d));
    return v;
}

__device__ __forceinline__ unsigned long long max_of(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

__device__ __forceinline__ unsigned long long warp_max(unsigned long long v) { return warp_reduce(v, max_of); }
__device__ __forceinline__ float warp_max(float v) {
    return warp_reduce(v, [](float a, float b) { return fmaxf(a, b); });
}

// merge(v) over every thread of the cluster, in every thread: by lanes, warps, then ranks, so a merge that is
// commutative (both lanes of a butterfly get the same value) gives every block the same result. Each block's own
// value stays in s.pub_value[buffer] for the others, buffer = (d.round before the call) & 1.
// cluster_publish is its first half: the block's value published, up to the cluster barrier; returns the buffer.
// also(buffer) runs in every thread after the block barrier, while warp 0 reduces: work for the other warps that the
// exchange should carry.
struct Nothing {
    __device__ void operator()(int) const {}
};
template <typename Tin, class S, class Merge, class Also = Nothing>
__device__ int cluster_publish(unsigned long long v, unsigned long long identity, Merge merge, Draw<Tin, S>& d,
                               Smem& s, Also&& also = Also{}) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int buffer = d.round++ & 1;
    v = warp_reduce(v, merge);
    if (lane == 0) s.warp_value[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = warp_reduce<WARPS / 2>(lane < WARPS ? s.warp_value[lane] : identity, merge);
        if (lane == 0) s.pub_value[buffer] = v;
    } else {
        also(buffer);
    }
    cluster_barrier();
    return buffer;
}

template <typename Tin, class S, class Merge>
__device__ unsigned long long cluster_reduce(unsigned long long v, unsigned long long identity, Merge merge,
                                             Draw<Tin, S>& d, Smem& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int buffer = cluster_publish(v, identity, merge, d, s);
    if (warp == 0) {
        const unsigned long long mine = lane < S::CLUSTER ? kdt::load_from_block(&s.pub_value[buffer], lane) : identity;
        v = warp_reduce<CLUSTER_MAX / 2>(mine, merge);
        if (lane == 0) s.warp_value[0] = v;
    }
    __syncthreads();
    v = s.warp_value[0];
    __syncthreads();
    return v;
}

// The largest v over the cluster, in every thread.
template <typename Tin, class S>
__device__ unsigned long long cluster_max(unsigned long long v, Draw<Tin, S>& d, Smem& s) {
    return cluster_reduce(v, 0ull, max_of, d, s);
}

// 64-bit fixed-point mass added with native 32-bit shared atomics: the low word, then the high word and the carry.
__device__ __forceinline__ void add_mass(uint32_t* lo, uint32_t* hi, unsigned long long q) {
    const uint32_t low = static_cast<uint32_t>(q), high = static_cast<uint32_t>(q >> 32);
    const uint32_t old = atomicAdd(lo, low);
    const uint32_t carry = old + low < old ? 1u : 0u;
    if (high + carry) atomicAdd(hi, high + carry);
}

// Adds (1, q) to bin `bin` of this warp's copy where `in`; a warp whose tokens share one bin (flat rows) adds once.
template <bool BY_MASS>
__device__ __forceinline__ void histogram_add(Smem& s, int bin, uint32_t q, bool in) {
    const unsigned lanes = __ballot_sync(0xffffffffu, in);
    if (lanes == 0u) return;
    const int copy = (threadIdx.x >> 7) & (COPIES - 1);
    const int first = __shfl_sync(0xffffffffu, bin, __ffs(lanes) - 1);
    if (__all_sync(0xffffffffu, !in || bin == first)) {
        unsigned long long sum = in && BY_MASS ? q : 0ull;
        if (BY_MASS) {
#pragma unroll
            for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
        }
        if ((threadIdx.x & 31) == 0) {
            atomicAdd(&s.bins.count[copy][first], static_cast<uint32_t>(__popc(lanes)));
            if (BY_MASS) add_mass(&s.bins.mass_lo[copy][first], &s.bins.mass_hi[copy][first], sum);
        }
    } else if (in) {
        atomicAdd(&s.bins.count[copy][bin], 1u);
        if (BY_MASS) add_mass(&s.bins.mass_lo[copy][bin], &s.bins.mass_hi[copy][bin], q);
    }
}

// One histogram level over the cluster: the count (and, BY_MASS, the fixed-point mass) per bin of the tokens `f`
// looks at, summed over the blocks (exact integers: every block holds the same totals), then the bin where the
// running count reaches need_count, or the running mass reaches need_mass (at level 0: top_p, a fraction of the
// level's whole mass): s.cut_bin, s.cut_count, s.before_count, s.before_mass, s.all_mass.
template <bool BY_MASS, typename Tin, class S>
__device__ void histogram_level(const Filter& f, int level, uint32_t need_count, double need_mass, Draw<Tin, S>& d,
                                Smem& s) {
    const int bins = level == 0 ? NATS_BINS : BINS;
    for (int i = threadIdx.x; i < COPIES * BINS; i += THREADS) {
        (&s.bins.count[0][0])[i] = 0u;
        (&s.bins.mass_lo[0][0])[i] = 0u;
        (&s.bins.mass_hi[0][0])[i] = 0u;
    }
    __syncthreads();
    const float z_max = d.z_max, inv_t = d.inv_temperature;
    for_each_logit<S::UNROLL>(d.row, d.begin, d.end, [&](int t, float x, bool live) {
        const float z = x * inv_t;
        const int bin = live ? bin_of(f, level, t, z, z_max) : -1;
        histogram_add<BY_MASS>(s, bin, BY_MASS && bin >= 0 ? fixed_mass(z, z_max) : 0u, bin >= 0);
    });
    __syncthreads();
    const int buffer = d.round++ & 1;
    for (int b = threadIdx.x; b < bins; b += THREADS) {
        uint32_t c = 0;
        unsigned long long m = 0;
#pragma unroll
        for (int k = 0; k < COPIES; ++k) {
            c += s.bins.count[k][b];
            m += (static_cast<unsigned long long>(s.bins.mass_hi[k][b]) << 32) | s.bins.mass_lo[k][b];
        }
        s.pub_count[buffer][b] = c;
        s.pub_mass[buffer][b] = m;
    }
    cluster_barrier();
    for (int b = threadIdx.x; b < bins; b += THREADS) {
        uint32_t c[S::CLUSTER];
        unsigned long long m[S::CLUSTER];
#pragma unroll
        for (uint32_t r = 0; r < S::CLUSTER; ++r) {  // all loads first: one round trip of distributed shared memory
            c[r] = kdt::load_from_block(&s.pub_count[buffer][b], r);
            m[r] = BY_MASS ? kdt::load_from_block(&s.pub_mass[buffer][b], r) : 0ull;
        }
        uint32_t count = 0;
        unsigned long long mass = 0;
#pragma unroll
        for (int r = 0; r < S::CLUSTER; ++r) {
            count += c[r];
            mass += m[r];
        }
        s.total_count[b] = count;
        s.total_mass[b] = mass;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x, per = bins / 32;
        uint32_t c = 0;
        unsigned long long m = 0;
        for (int k = 0; k < per; ++k) {
            c += s.total_count[lane * per + k];
            m += s.total_mass[lane * per + k];
        }
        const uint32_t c_incl = kdt::warp_inclusive_scan(c);
        const unsigned long long m_incl = kdt::warp_inclusive_scan(m);
        const unsigned long long all_mass = __shfl_sync(0xffffffffu, m_incl, 31);
        const double need = level == 0 ? need_mass * static_cast<double>(all_mass) : need_mass;
        const bool reached = BY_MASS ? static_cast<double>(m_incl) >= need && c > 0u : c_incl >= need_count;
        const unsigned hits = __ballot_sync(0xffffffffu, reached);
        const unsigned nonempty = __ballot_sync(0xffffffffu, c > 0u);
        // the owner: the lane of the first bin where the running count or mass reaches the need; where the mass
        // never does (the need is all of it), the lane of the last bin with tokens, which is then the cut
        const int owner = hits ? __ffs(hits) - 1 : BY_MASS && nonempty ? 31 - __clz(nonempty) : -1;
        if (lane == 0 && owner < 0) s.cut_bin = -1;
        if (lane == owner) {
            uint32_t before_c = c_incl - c;
            unsigned long long before_m = m_incl - m;
            int cut = -1;
            uint32_t cut_before_c = 0;
            unsigned long long cut_before_m = 0;
            for (int b = lane * per; b < (lane + 1) * per; ++b) {
                const uint32_t bc = s.total_count[b];
                const unsigned long long bm = s.total_mass[b];
                if (bc > 0u) {
                    cut = b;
                    cut_before_c = before_c;
                    cut_before_m = before_m;
                    if (hits && (BY_MASS ? static_cast<double>(before_m + bm) >= need : before_c + bc >= need_count))
                        break;
                }
                before_c += bc;
                before_m += bm;
            }
            s.cut_bin = cut;
            s.cut_count = s.total_count[cut];
            s.before_count = cut_before_c;
            s.before_mass = cut_before_m;
        }
        if (lane == 0) s.all_mass = all_mass;
    }
    __syncthreads();
}

// Appends v to list (CAP entries; *count counts past them too) where `in`: one shared atomic per warp. Every lane
// calls it.
__device__ __forceinline__ void append_to(uint32_t* count, unsigned long long* list, unsigned long long v, bool in) {
    const unsigned lanes = __ballot_sync(0xffffffffu, in);
    if (lanes == 0u) return;
    uint32_t base = 0;
    if ((threadIdx.x & 31) == 0) base = atomicAdd(count, static_cast<uint32_t>(__popc(lanes)));
    base = __shfl_sync(0xffffffffu, base, 0);
    const uint32_t slot = base + __popc(lanes & ((1u << (threadIdx.x & 31)) - 1u));
    if (in && slot < CAP) list[slot] = v;
}

// Appends token (t, z) to this block's candidates where `in`: one shared atomic per warp. Every lane calls it.
__device__ __forceinline__ void append_candidate(Smem& s, int t, float z, bool in) {
    append_to(&s.n_cand, s.cand, packed(order_key(z), t), in);
}

// The first i of s.sorted[0..n) where the running fixed-point mass reaches `need`, or -1: by one warp.
__device__ __forceinline__ int first_reaching(const Smem& s, uint32_t n, float z_max, double need) {
    unsigned long long running = 0;
    for (uint32_t first = 0; first < n; first += 32) {
        const uint32_t i = first + (threadIdx.x & 31);
        const unsigned long long q = i < n ? fixed_mass(kdt::ordered_float(key_of(s.list.sorted[i])), z_max) : 0ull;
        const unsigned long long incl = running + kdt::warp_inclusive_scan(q);
        const unsigned hits = __ballot_sync(0xffffffffu, i < n && static_cast<double>(incl) >= need);
        if (hits) return static_cast<int>(first) + __ffs(hits) - 1;
        running = __shfl_sync(0xffffffffu, incl, 31);
    }
    return -1;
}

// s.list.merged[0..n) sorted, descending, into s.list.sorted, by rank (the values are distinct: ids are).
__device__ __forceinline__ void sort_merged(uint32_t n, Smem& s) {
    for (uint32_t i = threadIdx.x; i < n; i += THREADS) {
        const unsigned long long v = s.list.merged[i];
        uint32_t ahead = 0;
        for (uint32_t j = 0; j < n; ++j) ahead += s.list.merged[j] > v;
        s.list.sorted[ahead] = v;
    }
    __syncthreads();
}

// The tokens every block gathered, into s.list.merged in rank order; returns how many, or CAP + 1 when the blocks
// counted more than CAP in all (then nothing is copied). Every block runs it and gets the same list: each decides for
// itself what rank 0 would otherwise send (no verdict round, no barrier after it). The next writes to cand and n_cand
// come after another cluster barrier (the next exchange), so the reads here are safe.
template <class S>
__device__ uint32_t gather_all(Smem& s) {
    if (threadIdx.x < 32) {  // lane r asks rank r: one round trip of distributed shared memory, not one a block
        const uint32_t lane = threadIdx.x;
        const uint32_t n = lane < S::CLUSTER ? min(kdt::load_from_block(&s.n_cand, lane), CAP + 1u) : 0u;
        const uint32_t through = kdt::warp_inclusive_scan(n);
        if (lane < S::CLUSTER) s.offset[lane] = through - n;
        if (lane == S::CLUSTER - 1) s.offset[S::CLUSTER] = through;
    }
    __syncthreads();
    const uint32_t n = s.offset[S::CLUSTER];
    if (n > CAP) return CAP + 1;
    for (uint32_t i = threadIdx.x; i < n; i += THREADS) {  // each thread one token, whichever block holds it
        uint32_t r = 0;
        while (i >= s.offset[r + 1]) ++r;
        s.list.merged[i] = kdt::load_from_block(&s.cand[i - s.offset[r]], r);
    }
    __syncthreads();
    return n;
}

// The same, sorted (packed, descending) into s.list.sorted.
template <class S>
__device__ uint32_t gather_and_sort(Smem& s) {
    const uint32_t n = gather_all<S>(s);
    if (n <= CAP) sort_merged(n, s);
    return n;
}

// The tokens with in_set(t, z) from every block (at most CAP in all), sorted in every block, and the threshold:
// BY_MASS false, the need_count-th; BY_MASS, the first whose running fixed-point mass reaches need_mass (where it
// never does, the need being all of their mass, the last). Every block gets the same value (0: none gathered).
template <bool BY_MASS, typename Tin, class S, class In>
__device__ unsigned long long gather_cut(In in_set, uint32_t need_count, double need_mass, Draw<Tin, S>& d, Smem& s) {
    if (threadIdx.x == 0) s.n_cand = 0u;
    __syncthreads();
    const float z_max = d.z_max, inv_t = d.inv_temperature;
    for_each_logit<S::UNROLL>(d.row, d.begin, d.end, [&](int t, float x, bool live) {
        const float z = x * inv_t;
        const bool in = live && in_set(t, z);
        append_candidate(s, t, z, in);
    });
    cluster_barrier();
    const uint32_t gathered = gather_and_sort<S>(s);
    const uint32_t n = gathered <= CAP ? gathered : 0u;  // more than CAP: callers gather only when they fit
    if (threadIdx.x < 32) {
        uint32_t pick = n ? n - 1 : 0;
        if (!BY_MASS) {
            pick = need_count >= 1u && need_count <= n ? need_count - 1 : pick;
        } else {
            const int reached = first_reaching(s, n, z_max, need_mass);
            if (reached >= 0) pick = static_cast<uint32_t>(reached);
        }
        if (threadIdx.x == 0) s.decided = n ? s.list.sorted[pick] : 0ull;
    }
    __syncthreads();
    const unsigned long long threshold = s.decided;
    __syncthreads();
    return threshold;
}

// The threshold of a filter (kept: packed >= it) among the tokens >= floor: the need_count-th token of the order
// (top-k, BY_MASS false), or the first whose running mass reaches top_p of theirs (top-p). All blocks get it.
template <bool BY_MASS, typename Tin, class S>
__device__ unsigned long long select_threshold(unsigned long long floor, uint32_t need_count, float top_p,
                                               Draw<Tin, S>& d, Smem& s) {
    Filter f{floor, 0, 0u, 0u, 0u, 0u};
    double need_mass = top_p;
    for (int level = 0; level < LEVELS; ++level) {
        histogram_level<BY_MASS>(f, level, need_count, need_mass, d, s);
        if (s.cut_bin < 0) return floor;  // fewer tokens than top_k: all kept
        if (level == 0) need_mass *= static_cast<double>(s.all_mass);
        need_count -= s.before_count;
        need_mass -= static_cast<double>(s.before_mass);
        const uint32_t digit = static_cast<uint32_t>(BINS - 1 - s.cut_bin);
        if (level == 0) {
            f.nats = s.cut_bin;
        } else if (level <= 4) {
            f.key_prefix |= digit << (8 * (4 - level));
            f.key_mask |= (BINS - 1u) << (8 * (4 - level));
        } else {
            f.id_prefix |= digit << (8 * (8 - level));
            f.id_mask |= (BINS - 1u) << (8 * (8 - level));
        }
        if (s.cut_count > CAP && level + 1 < LEVELS) continue;
        // the cut bin's tokens, sorted, cut there
        const float z_max = d.z_max;
        const unsigned long long threshold = gather_cut<BY_MASS>(
            [&](int t, float z) { return in_cut(f, t, z, z_max); }, need_count, need_mass, d, s);
        return threshold > floor ? threshold : floor;
    }
    return floor;  // not reached: the last level leaves at most one token
}

// Philox words of quad `quad` at `position`: out of line, so that the passes carry a call, not ten rounds (the
// noise is computed only for the tokens that can still win).
__device__ __noinline__ uint4 noise_words(uint32_t quad, uint32_t pos_lo, uint32_t pos_hi, uint2 key) {
    return kdt::philox4x32_10(make_uint4(quad, 0u, pos_lo, pos_hi), key);
}

__device__ __forceinline__ uint32_t word_of(const uint4& words, int t) {
    return (t & 3) == 0 ? words.x : (t & 3) == 1 ? words.y : (t & 3) == 2 ? words.z : words.w;
}

// The largest logit of a 16-byte vector: bf16 by packed maxima (four pairs, no per-logit work). Float maxima ignore
// NaN (bad input; it then never wins a later comparison either).
__device__ __forceinline__ float vector_max(const uint4& w, const uint16_t*) {
    const uint32_t pairs = kdt::bf16x2_max(kdt::bf16x2_max(w.x, w.y), kdt::bf16x2_max(w.z, w.w));
    return fmaxf(kdt::bits_to_float(pairs << 16), kdt::bits_to_float(pairs & 0xFFFF0000u));
}
__device__ __forceinline__ float vector_max(const uint4& w, const float*) {
    return fmaxf(fmaxf(__uint_as_float(w.x), __uint_as_float(w.y)), fmaxf(__uint_as_float(w.z), __uint_as_float(w.w)));
}

// The largest logit of this block's chunk.
template <typename Tin, class S>
__device__ __forceinline__ float chunk_max(const Draw<Tin, S>& d) {
    float best = -__builtin_huge_valf();
    for_each_vector<S::UNROLL>(
        d.row, d.begin, d.end,
        [&](int, const uint4& w, bool live) {
            if (live) best = fmaxf(best, vector_max(w, d.row));
        },
        [&](int, float x, bool live) {
            if (live) best = fmaxf(best, x);
        });
    return best;
}

// Where a token of logit x can have z = x * inv_t >= z_near: x >= x_near (z_near over inv_t, less its rounding), so
// that a whole vector can be skipped on its largest logit.
__device__ __forceinline__ float near_logit(float z_near, float inv_t) {
    return z_near / inv_t - (fabsf(z_near / inv_t) * 1e-5f + 1e-30f);
}

// Vector u of a batch held in registers, u known only at run time (selects: an index would put w in local memory).
template <int UNROLL>
__device__ __forceinline__ uint4 pick(const uint4 (&w)[UNROLL], int u) {
    uint4 v = w[0];
#pragma unroll
    for (int i = 1; i < UNROLL; ++i)
        if (u == i) v = w[i];
    return v;
}

// Bit k set where element k of a vector has z = x * inv_t >= z_near.
template <typename Tin>
__device__ __forceinline__ uint32_t near_mask(const uint4& v, const Tin* row, float inv_t, float z_near) {
    constexpr int PER = 16 / static_cast<int>(sizeof(Tin));
    uint32_t mask = 0u;
#pragma unroll
    for (int k = 0; k < PER; ++k) mask |= element(v, k, row) * inv_t >= z_near ? 1u << k : 0u;
    return mask;
}

// A running maximum m of logits and the mass below it, l = sum of 2^((x - m) * to_log2) (exp(z - z_max) with
// to_log2 = log2(e) / T); m = -inf holds no mass.
struct MaxSum {
    float m, l;
};

// The chunk's largest logit and its mass in one pass (top-p alone: the row is read once for both): a running
// maximum per thread, the sum rescaled once per vector where it moves; -inf logits hold no mass (2^-inf = 0 once
// the running maximum is finite: a vector of -inf only is skipped whole). In the same pass
// top-p's near tokens: each warp keeps in s.near[buffer] its tokens within NEAR_NATS of its own largest logit so
// far, at most NEAR_PER_WARP, and publishes that logit and how many it had in s.near_head[buffer]. A warp's largest
// logit is at most the row's, so its list holds every token of the warp within NEAR_NATS of the row max; a warp
// whose largest logit is further below is not read (merge_near). No block barrier: each warp goes at its own pace.
template <typename Tin, class S>
__device__ __forceinline__ MaxSum chunk_max_sum_near(const Draw<Tin, S>& d, float to_log2, int buffer, Smem& s) {
    constexpr int PER = 16 / static_cast<int>(sizeof(Tin));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float inv_t = d.inv_temperature;
    MaxSum t{-__builtin_huge_valf(), 0.f};
    const auto raise = [&](float top) {
        if (top > t.m) {
            t.l *= kdt::ex2((t.m - top) * to_log2);  // t.m = -inf: 0, and l is still 0
            t.m = top;
        }
    };
    const auto add = [&](float x) {
        if (x > -__builtin_huge_valf()) t.l += kdt::ex2((x - t.m) * to_log2);
    };
    float warp_top = -__builtin_huge_valf();  // the warp's largest logit so far (the same in every lane)
    uint32_t kept = 0;  // the warp's near tokens so far, while at most NEAR_PER_WARP; past it, only more than that
    const auto keep = [&](int token, float z, bool in) {
        const unsigned lanes = __ballot_sync(0xffffffffu, in);
        const uint32_t slot = kept + __popc(lanes & ((1u << lane) - 1u));
        if (in && slot < NEAR_PER_WARP) s.near[buffer][warp][slot] = packed(order_key(z), token);
        kept += __popc(lanes);
    };
    for_each_batch<S::UNROLL>(
        d.row, d.begin, d.end,
        [&](int first, uint4 (&w)[S::UNROLL], int vectors) {
            float top = -__builtin_huge_valf();
#pragma unroll
            for (int u = 0; u < S::UNROLL; ++u) {
                const float m = vector_max(w[u], d.row);
                if (first + u * THREADS + static_cast<int>(threadIdx.x) >= vectors || !(m > -__builtin_huge_valf()))
                    continue;
                top = fmaxf(top, m);
                raise(m);
                const float offset = t.m * to_log2;  // 2^(x * to_log2 - offset): one fused multiply-add a logit
#pragma unroll
                for (int k = 0; k < PER; ++k) t.l += kdt::ex2(fmaf(element(w[u], k, d.row), to_log2, -offset));
            }
            warp_top = fmaxf(warp_top, warp_max(top));
            if (kept > NEAR_PER_WARP) return;
            // The batch's near tokens into the warp's list with one warp scan (not a vote per logit: a chain of
            // dependent votes cost the pass as much as its exponentials). A vector can hold one only where its
            // largest logit reaches x_near; where more vectors than the list holds can, it is cut short unread.
            const float z_near = warp_top * inv_t - NEAR_NATS, x_near = near_logit(z_near, inv_t);
            uint32_t near_vectors = 0u, warp_near_vectors = 0u;
#pragma unroll
            for (int u = 0; u < S::UNROLL; ++u) {
                const bool near = first + u * THREADS + static_cast<int>(threadIdx.x) < vectors &&
                                  vector_max(w[u], d.row) >= x_near;
                near_vectors |= near ? 1u << u : 0u;
                warp_near_vectors += __popc(__ballot_sync(0xffffffffu, near));
            }
            if (warp_near_vectors > NEAR_PER_WARP) kept = NEAR_PER_WARP + 1;
            if (warp_near_vectors == 0u || warp_near_vectors > NEAR_PER_WARP) return;
            // the few vectors that can (a rolled loop: this code runs in few warps, once)
            uint32_t mine = 0u;
            for (uint32_t rest = near_vectors; rest != 0u; rest &= rest - 1u)
                mine += __popc(near_mask(pick(w, __ffs(rest) - 1), d.row, inv_t, z_near));
            const uint32_t through = kdt::warp_inclusive_scan(mine);
            uint32_t slot = kept + through - mine;
            for (uint32_t rest = near_vectors; rest != 0u; rest &= rest - 1u) {
                const int u = __ffs(rest) - 1;
                const uint4 v = pick(w, u);
                const int t0 = d.begin + (first + u * THREADS + static_cast<int>(threadIdx.x)) * PER;
                for (uint32_t mask = near_mask(v, d.row, inv_t, z_near); mask != 0u; mask &= mask - 1u, ++slot) {
                    const int k = __ffs(mask) - 1;
                    if (slot < NEAR_PER_WARP)
                        s.near[buffer][warp][slot] = packed(order_key(element(v, k, d.row) * inv_t), t0 + k);
                }
            }
            kept += __shfl_sync(0xffffffffu, through, 31);
        },
        [&](int token, float x, bool live) {
            if (live) {
                raise(x);
                add(x);
            }
            warp_top = fmaxf(warp_top, warp_max(live ? x : -__builtin_huge_valf()));
            const float z = x * inv_t;
            if (kept <= NEAR_PER_WARP) keep(token, z, live && z >= warp_top * inv_t - NEAR_NATS);
        });
    if (lane == 0)
        s.near_head[buffer][warp] = (static_cast<unsigned long long>(__float_as_uint(warp_top)) << 32) | kept;
    return t;
}

// A MaxSum as one 64-bit value for the exchange (m in the high word).
__device__ __forceinline__ unsigned long long pack_max_sum(MaxSum x) {
    return (static_cast<unsigned long long>(__float_as_uint(x.m)) << 32) | __float_as_uint(x.l);
}
__device__ __forceinline__ MaxSum unpack_max_sum(unsigned long long p) {
    return MaxSum{__uint_as_float(static_cast<uint32_t>(p >> 32)), __uint_as_float(static_cast<uint32_t>(p))};
}

// The union of packed MaxSums over lanes (the Merge of cluster_publish): the largest m first, then each lane's sum
// rescaled to it once and added, not a rescale of both sides at every step of the butterfly (a chain of two
// exponentials a step). Both lanes of a butterfly get the same value, so every lane does.
struct MaxSumMerge {
    float to_log2;
};
template <int FIRST = 16>
__device__ __forceinline__ unsigned long long warp_reduce(unsigned long long v, const MaxSumMerge& merge) {
    const MaxSum x = unpack_max_sum(v);
    const float m = warp_reduce<FIRST>(x.m, [](float a, float b) { return fmaxf(a, b); });
    const float l = x.m > -__builtin_huge_valf() ? x.l * kdt::ex2((x.m - m) * merge.to_log2) : 0.f;
    return pack_max_sum({m, warp_reduce<FIRST>(l, [](float a, float b) { return a + b; })});
}

// Top-p's first try (top-k off): the tokens within NEAR_NATS of the row max, where a language model's top-p set
// lies, from the lists the warps kept in the first pass (chunk_max_sum_near). Before the first exchange warp 1 of each
// block makes the block's list of them, with each one's noise (make_block_list); right after it warp 0 alone reads
// every block's max, mass and list in one round trip of distributed shared memory and draws from registers
// (decide_block_lists). Where a block's list it needs was not made, it reads the warps' lists: every list's head in a
// second round trip, the lists that can hold such a token in a third, and where they are few cuts and draws among them
// itself (no block barrier until its verdict). Where a list it needs was cut short, near_gather finds them by a
// second pass over the chunk; where they are many, the block merges and draws. Where they cannot decide (more than
// CAP, or their mass short of the need): the histogram levels. Every block reaches the same verdict.
enum NearVerdict : uint32_t { NEAR_DRAWN, NEAR_UNREACHED, NEAR_GATHER, NEAR_MERGE, NEAR_DECIDE, NEAR_LEVELS };
constexpr uint32_t NEAR_WARP_LISTED = 4 * 32;  // warp 0 reads up to this many listed tokens itself (4 a lane)
constexpr uint32_t NEAR_WARP_TOKENS = 2 * 32;  // and draws among up to this many itself (2 a lane)

template <int LANES>  // threads [0, LANES) take part: warp 0 or the block
__device__ __forceinline__ void lanes_sync() {
    if constexpr (LANES == 32) __syncwarp();
    else __syncthreads();
}

// The listed tokens (s.listed, in the first exchange's buffer) within NEAR_NATS of the row max (key_near: z_near's
// order key) appended to s.list.merged, s.n_merged counting (past CAP too); a batch's loads all issued first.
template <int LANES>
__device__ void merge_listed(int buffer, uint32_t key_near, Smem& s) {
    constexpr int BATCH = 4;
    const uint32_t total = s.listed_total, lists = s.listed_lists;
    for (uint32_t first = 0; first < total; first += LANES * BATCH) {
        unsigned long long v[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const uint32_t e = first + b * LANES + threadIdx.x;
            v[b] = 0ull;
            if (e < total) {
                uint32_t lo = 0, hi = lists - 1;  // the last list whose tokens start at or before e
                while (lo < hi) {
                    const uint32_t mid = (lo + hi + 1) / 2;
                    if ((s.listed[mid] >> 12) <= e) lo = mid;
                    else hi = mid - 1;
                }
                const uint32_t entry = s.listed[lo], list = (entry >> 5) & 127u;
                v[b] = kdt::load_from_block(&s.near[buffer][list % WARPS][e - (entry >> 12)], list / WARPS);
            }
        }
#pragma unroll
        for (int b = 0; b < BATCH; ++b)
            append_to(&s.n_merged, s.list.merged, v[b],
                      first + b * LANES + threadIdx.x < total && key_of(v[b]) >= key_near);
    }
    lanes_sync<LANES>();
}

// The draw among the n near tokens in s.list.merged by threads [0, LANES): a token is kept where the mass strictly
// ahead of it in the draw's order (z descending, id ascending) is under `need` (top_p of the row's fixed-point
// mass): the sorted cut, without sorting. The Gumbel-max among the kept; -1 where their mass never reaches the need.
// Integer masses: every block gets the same token.
template <int LANES>
__device__ int decide_near(uint32_t n, double need, float z_max, uint2 key, uint32_t pos_lo, uint32_t pos_hi,
                           Smem& s) {
    for (uint32_t i = threadIdx.x; i < n; i += LANES)
        s.list.mass[i] = fixed_mass(kdt::ordered_float(key_of(s.list.merged[i])), z_max);
    lanes_sync<LANES>();
    bool reached = false;
    unsigned long long best = 0ull;
    for (uint32_t i = threadIdx.x; i < n; i += LANES) {
        const unsigned long long v = s.list.merged[i];
        unsigned long long ahead = 0ull;
        for (uint32_t j = 0; j < n; ++j) ahead += s.list.merged[j] > v ? s.list.mass[j] : 0ull;
        reached = reached || static_cast<double>(ahead + s.list.mass[i]) >= need;
        if (static_cast<double>(ahead) < need) {
            const int t = token_of(v);
            const float score = kdt::ordered_float(key_of(v)) +
                                kdt::gumbel_of_word(word_of(noise_words(static_cast<uint32_t>(t) >> 2, pos_lo, pos_hi,
                                                                        key), t));
            best = max_of(best, packed(order_key(score), t));
        }
    }
    best = warp_max(best);
    if constexpr (LANES == 32) {
        return __any_sync(0xffffffffu, reached) ? token_of(best) : -1;
    } else {
        if ((threadIdx.x & 31) == 0) s.warp_value[threadIdx.x >> 5] = best;
        reached = __syncthreads_or(reached);
        for (int w = 0; w < WARPS; ++w) best = max_of(best, s.warp_value[w]);
        __syncthreads();  // before warp_value is written again
        return reached ? token_of(best) : -1;
    }
}

// Warp 1 of each block, after the first pass's block barrier while warp 0 reduces (cluster_publish's `also`): the
// block's near tokens, those within NEAR_NATS of its own largest z, from its warps' lists, into s.block_near[buffer]
// with each one's Gumbel noise at `position` (none at NO_POSITION), and their count, NEAR_PER_BLOCK + 1 where a list
// it needed was cut short or they are more. The block's largest z is at most the row's, so a list made holds every
// token of the block within NEAR_NATS of the row max: warp 0 reads them all with the blocks' (max, mass).
__device__ void make_block_list(int buffer, float inv_t, uint64_t position, uint2 key, Smem& s) {
    const uint32_t lane = threadIdx.x & 31;
    const unsigned long long head = lane < WARPS ? s.near_head[buffer][lane] : 0ull;
    const float top = lane < WARPS ? __uint_as_float(static_cast<uint32_t>(head >> 32)) : -__builtin_huge_valf();
    const float z_near = kdt::ordered_float(order_key(warp_max(top) * inv_t)) - NEAR_NATS;
    const uint32_t key_near = order_key(z_near);
    const bool needed = lane < WARPS && top * inv_t >= z_near;
    const uint32_t length = needed ? min(static_cast<uint32_t>(head), static_cast<uint32_t>(NEAR_PER_WARP)) : 0u;
    const bool cut_short = __any_sync(0xffffffffu, needed && static_cast<uint32_t>(head) > NEAR_PER_WARP);
    uint32_t mine = 0u;
    for (uint32_t j = 0; j < length; ++j) mine += key_of(s.near[buffer][lane][j]) >= key_near ? 1u : 0u;
    const uint32_t through = kdt::warp_inclusive_scan(mine), total = __shfl_sync(0xffffffffu, through, 31);
    if (cut_short || total > NEAR_PER_BLOCK) {
        if (lane == 0) s.block_near_count[buffer] = NEAR_PER_BLOCK + 1;
        return;
    }
    for (uint32_t j = 0, slot = through - mine; j < length; ++j) {
        const unsigned long long v = s.near[buffer][lane][j];
        if (key_of(v) >= key_near) s.block_near[buffer][slot++] = v;
    }
    __syncwarp();
    if (lane < total && position != NO_POSITION) {
        const int t = token_of(s.block_near[buffer][lane]);
        s.block_noise[buffer][lane] = kdt::gumbel_of_word(word_of(
            noise_words(static_cast<uint32_t>(t) >> 2, static_cast<uint32_t>(position),
                        static_cast<uint32_t>(position >> 32), key), t));
    }
    if (lane == 0) s.block_near_count[buffer] = total;
}

// The draw among the near tokens of the blocks' lists (make_block_list), by warp 0 right after the first exchange:
// counts, tokens and noise were loaded with the blocks' (max, mass). As decide_near, from registers: -1 where their
// mass never reaches `need`, -2 where a list needed was not made or they are more than 32 (then the warps' lists).
template <class S>
__device__ int decide_block_lists(const uint32_t block_count, const bool block_needed,
                                  const unsigned long long (&token)[S::CLUSTER * NEAR_PER_BLOCK / 32],
                                  const float (&noise)[S::CLUSTER * NEAR_PER_BLOCK / 32], float z_max, float z_near,
                                  double need, Smem& s) {
    constexpr int ENTRIES = S::CLUSTER * NEAR_PER_BLOCK / 32;
    const uint32_t lane = threadIdx.x & 31;
    const bool made = block_count <= NEAR_PER_BLOCK;
    if (__any_sync(0xffffffffu, block_needed && !made)) return -2;
    const uint32_t key_near = order_key(z_near);
    uint32_t valid = 0u;
#pragma unroll
    for (int m = 0; m < ENTRIES; ++m) {
        const uint32_t e = lane + 32 * m, block = e / NEAR_PER_BLOCK;
        const bool listed = __shfl_sync(0xffffffffu, made ? block_count : 0u, block) > e % NEAR_PER_BLOCK;
        valid |= listed && key_of(token[m]) >= key_near ? 1u << m : 0u;
    }
    const uint32_t mine = __popc(valid);
    const uint32_t through = kdt::warp_inclusive_scan(mine), n = __shfl_sync(0xffffffffu, through, 31);
    if (n > 32) return -2;
    uint32_t slot = through - mine;  // list.mass holds each token's noise (its bits) here: the masses stay in registers
#pragma unroll
    for (int m = 0; m < ENTRIES; ++m) {
        if (!(valid >> m & 1u)) continue;
        s.list.merged[slot] = token[m];
        s.list.mass[slot++] = __float_as_uint(noise[m]);
    }
    __syncwarp();
    const bool here = lane < n;
    const unsigned long long v = here ? s.list.merged[lane] : 0ull;
    const float z = kdt::ordered_float(key_of(v));
    const uint32_t q = here ? fixed_mass(z, z_max) : 0u;
    unsigned long long ahead = 0ull;
    for (uint32_t j = 0; j < n; ++j) {
        const unsigned long long other = __shfl_sync(0xffffffffu, v, j);
        const uint32_t other_q = __shfl_sync(0xffffffffu, q, j);
        ahead += other > v ? other_q : 0ull;
    }
    const bool reached = __any_sync(0xffffffffu, here && static_cast<double>(ahead + q) >= need);
    const unsigned long long best = warp_max(
        here && static_cast<double>(ahead) < need
            ? packed(order_key(z + __uint_as_float(static_cast<uint32_t>(s.list.mass[lane]))), token_of(v))
            : 0ull);
    return reached ? token_of(best) : -1;
}

// Warp 0, right after the first exchange (buffer: its): the row's max and mass, the near tokens from the lists, and
// where warp 0 can, the draw; its verdict for the block in s.near_verdict, the row in s.row_max and s.row_mass.
template <typename Tin, class S, class PositionOf>
__device__ void near_from_lists(int buffer, float to_log2, float top_p, uint2 key, PositionOf& position_of,
                                const Draw<Tin, S>& d, Smem& s) {
    constexpr int HEADS = S::CLUSTER * WARPS / 32;
    static_assert(HEADS * 32 == S::CLUSTER * WARPS, "lists");
    const uint32_t lane = threadIdx.x;
    // one round trip: every block's (max, mass) and list (make_block_list): entry e of the cluster's list is entry
    // e % NEAR_PER_BLOCK of block e / NEAR_PER_BLOCK, lane l's e = l + 32 m
    const unsigned long long mine =
        lane < S::CLUSTER ? kdt::load_from_block(&s.pub_value[buffer], lane)
                          : pack_max_sum({-__builtin_huge_valf(), 0.f});
    constexpr int ENTRIES = S::CLUSTER * NEAR_PER_BLOCK / 32;
    static_assert(ENTRIES * 32 == S::CLUSTER * NEAR_PER_BLOCK, "block lists");
    const uint32_t block_count = lane < S::CLUSTER ? kdt::load_from_block(&s.block_near_count[buffer], lane) : 0u;
    unsigned long long block_token[ENTRIES];
    float block_noise[ENTRIES];
#pragma unroll
    for (int m = 0; m < ENTRIES; ++m) {
        const uint32_t e = lane + 32 * m;
        block_token[m] = kdt::load_from_block(&s.block_near[buffer][e % NEAR_PER_BLOCK], e / NEAR_PER_BLOCK);
        block_noise[m] = kdt::load_from_block(&s.block_noise[buffer][e % NEAR_PER_BLOCK], e / NEAR_PER_BLOCK);
    }
    const MaxSum row =
        unpack_max_sum(__shfl_sync(0xffffffffu, warp_reduce<CLUSTER_MAX / 2>(mine, MaxSumMerge{to_log2}), 0));
    const auto verdict = [&](NearVerdict what, int token) {
        if (lane == 0) {
            s.near_verdict = (static_cast<unsigned long long>(what) << 32) | static_cast<uint32_t>(token);
            s.row_max = row.m;
            s.row_mass = row.l;
        }
    };
    const uint64_t position = position_of();
    if (position == NO_POSITION) return verdict(NEAR_UNREACHED, 0);
    const float inv_t = d.inv_temperature;
    const float z_max = kdt::ordered_float(order_key(row.m * inv_t)), z_near = z_max - NEAR_NATS;
    const double need = static_cast<double>(top_p) * static_cast<double>(row.l) * MASS_ONE;
    // the blocks' lists, where every one needed was made: the draw from registers
    const float block_top = unpack_max_sum(mine).m;
    const int drawn = decide_block_lists<S>(block_count, lane < S::CLUSTER && block_top * inv_t >= z_near, block_token,
                                            block_noise, z_max, z_near, need, s);
    if (drawn != -2) return verdict(drawn >= 0 ? NEAR_DRAWN : NEAR_LEVELS, drawn);
    // else the warps' lists, their heads in another round trip: one is needed where its warp's largest logit reaches
    // z_near; one cut short: the second pass
    unsigned long long head[HEADS];  // lane l's lists: HEADS * l .. HEADS * l + HEADS - 1
#pragma unroll
    for (int k = 0; k < HEADS; ++k) {
        const uint32_t list = HEADS * lane + k;
        head[k] = kdt::load_from_block(&s.near_head[buffer][list % WARPS], list / WARPS);
    }
    uint32_t length[HEADS];
    bool cut_short = false;
#pragma unroll
    for (int k = 0; k < HEADS; ++k) {
        const float top = __uint_as_float(static_cast<uint32_t>(head[k] >> 32));
        const uint32_t count = static_cast<uint32_t>(head[k]);
        const bool needed = top * inv_t >= z_near;
        cut_short = cut_short || (needed && count > NEAR_PER_WARP);
        length[k] = needed ? min(count, static_cast<uint32_t>(NEAR_PER_WARP)) : 0u;
    }
    if (__any_sync(0xffffffffu, cut_short)) return verdict(NEAR_GATHER, 0);
    // the needed lists in list order, with where each one's tokens start: one scan of (lists << 16) + tokens
    uint32_t mine_listed = 0;
#pragma unroll
    for (int k = 0; k < HEADS; ++k) mine_listed += length[k] ? (1u << 16) + length[k] : 0u;
    const uint32_t through = kdt::warp_inclusive_scan(mine_listed);
    const uint32_t all = __shfl_sync(0xffffffffu, through, 31), lists = all >> 16, total = all & 0xffffu;
    uint32_t at_list = (through - mine_listed) >> 16, at_token = (through - mine_listed) & 0xffffu;
#pragma unroll
    for (int k = 0; k < HEADS; ++k) {
        if (!length[k]) continue;
        s.listed[at_list++] = (at_token << 12) | ((HEADS * lane + k) << 5) | length[k];
        at_token += length[k];
    }
    if (lane == 0) {
        s.listed_lists = lists;
        s.listed_total = total;
        s.n_merged = 0u;
    }
    __syncwarp();
    if (total > NEAR_WARP_LISTED) return verdict(NEAR_MERGE, 0);
    merge_listed<32>(buffer, order_key(z_near), s);
    const uint32_t n = s.n_merged;
    if (n > NEAR_WARP_TOKENS) return verdict(NEAR_DECIDE, 0);
    const int token = decide_near<32>(n, need, z_max, key, static_cast<uint32_t>(position),
                                      static_cast<uint32_t>(position >> 32), s);
    verdict(token >= 0 ? NEAR_DRAWN : NEAR_LEVELS, token);
}

// The near tokens by a second pass over the chunk (from L2), into s.list.merged in every block: how many, or CAP + 1.
template <typename Tin, class S>
__device__ uint32_t near_gather(Draw<Tin, S>& d, Smem& s) {
    if (threadIdx.x == 0) s.n_cand = 0u;
    __syncthreads();
    const float z_max = d.z_max, inv_t = d.inv_temperature, z_near = z_max - NEAR_NATS;
    const float x_near = near_logit(z_near, inv_t);  // whole vectors below it hold no candidate
    for_each_vector<S::UNROLL>(
        d.row, d.begin, d.end,
        [&](int t0, const uint4& w, bool live) {
            const bool near = live && vector_max(w, d.row) >= x_near;
            if (__ballot_sync(0xffffffffu, near) == 0u) return;
            constexpr int PER = 16 / static_cast<int>(sizeof(Tin));
#pragma unroll
            for (int k = 0; k < PER; ++k) {
                const float z = element(w, k, d.row) * inv_t;
                append_candidate(s, t0 + k, z, near && z >= z_near);
            }
        },
        [&](int t, float x, bool live) {
            const float z = x * inv_t;
            append_candidate(s, t, z, live && z >= z_near);
        });
    cluster_barrier();
    return gather_all<S>(s);
}

// The block's chunk into L2, by the bulk-copy engine (nothing to wait for), before the first pass: the later passes
// read it from there.
template <typename Tin, class S>
__device__ __forceinline__ void prefetch_chunk(const Draw<Tin, S>& d) {
    const uint32_t bytes = static_cast<uint32_t>(d.end - d.begin) * sizeof(Tin) & ~15u;
    if (threadIdx.x == 0 && bytes && (reinterpret_cast<uintptr_t>(d.row + d.begin) & 15u) == 0)
        kdt::bulk_prefetch_l2(d.row + d.begin, bytes);
}

// The token drawn from the row (every thread of every block of the cluster gets it), or -1 where position_of()
// says NO_POSITION. position_of() runs after the first exchange's block barrier (on top-p's near path, in warp 0
// right after the exchange) and gives the draw's position, the same in every block.
template <typename Tin, class S, class PositionOf>
__device__ int draw(Draw<Tin, S>& d, float temperature, int top_k, float top_p, uint64_t seed, PositionOf&& position_of,
                    int vocab, Smem& s) {
    const bool greedy = temperature == 0.f;
    const float inv_t = d.inv_temperature;
    const bool k_on = top_k > 0 && top_k < vocab, p_on = top_p < 1.f;
    const uint2 key = make_uint2(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    uint32_t pos_lo = 0u, pos_hi = 0u;
    const auto positioned = [&] {
        const uint64_t position = position_of();
        pos_lo = static_cast<uint32_t>(position), pos_hi = static_cast<uint32_t>(position >> 32);
        return position != NO_POSITION;
    };
    float best_score;  // a lower bound of the winner's score, for the Gumbel pass's skip
    if (greedy || !(k_on || p_on)) {
        // the first token of the order (the argmax), by max of packed (key, ~id) values: the greedy draw, and
        // with temperature alone the tightest bound, that token's own score
        unsigned long long first = 0ull;
        for_each_logit<S::UNROLL>(d.row, d.begin, d.end, [&](int t, float x, bool live) {
            const unsigned long long v = live ? packed(order_key(greedy ? x : x * inv_t), t) : 0ull;
            first = v > first ? v : first;
        });
        first = cluster_max(first, d, s);
        if (!positioned()) return -1;
        if (greedy) return token_of(first);
        d.z_max = kdt::ordered_float(key_of(first));
        const int t = token_of(first);
        best_score = d.z_max + kdt::gumbel_of_word(word_of(noise_words(static_cast<uint32_t>(t) >> 2, pos_lo, pos_hi,
                                                                       key), t));
    } else if (k_on) {
        // with a filter only the max: z_max = (the row's largest logit) * (1 / T), as x * (1 / T) rounds
        // monotonically; the first token's score is then bounded by z_max + GUMBEL_MIN
        d.z_max = kdt::ordered_float(key_of(
            cluster_max(static_cast<unsigned long long>(order_key(chunk_max(d) * inv_t)) << 32, d, s)));
        if (!positioned()) return -1;
        best_score = d.z_max + kdt::GUMBEL_MIN;
    } else {
        // top-p alone: the max, the row's mass and each warp's near tokens in one pass, published together; warp
        // 0 draws from the lists where it can, else the block goes on as its verdict says
        const float to_log2 = inv_t * 1.4426950408889634f;
        const int buffer = cluster_publish(
            pack_max_sum(chunk_max_sum_near(d, to_log2, d.round & 1, s)),
            pack_max_sum({-__builtin_huge_valf(), 0.f}),
            MaxSumMerge{to_log2}, d, s,
            [&](int published) {
                if (threadIdx.x >> 5 == 1) make_block_list(published, inv_t, position_of(), key, s);
            });
        if (threadIdx.x < 32) near_from_lists(buffer, to_log2, top_p, key, position_of, d, s);
        __syncthreads();
        const unsigned long long verdict = s.near_verdict;
        const float row_max = s.row_max, row_mass = s.row_mass;
        if (!positioned()) return -1;
        const uint32_t what = static_cast<uint32_t>(verdict >> 32);
        if (what == NEAR_DRAWN) return static_cast<int>(static_cast<uint32_t>(verdict));
        d.z_max = kdt::ordered_float(order_key(row_max * inv_t));
        best_score = d.z_max + kdt::GUMBEL_MIN;
        uint32_t n = CAP + 1;
        if (what == NEAR_GATHER) {
            n = near_gather(d, s);
        } else if (what == NEAR_MERGE) {
            merge_listed<THREADS>(buffer, order_key(d.z_max - NEAR_NATS), s);
            n = s.n_merged;
        } else if (what == NEAR_DECIDE) {
            n = s.n_merged;
        }
        if (n <= CAP) {
            const int token = decide_near<THREADS>(n, static_cast<double>(top_p) * static_cast<double>(row_mass) *
                                                          MASS_ONE, d.z_max, key, pos_lo, pos_hi, s);
            if (token >= 0) return token;
        }
    }

    unsigned long long threshold = 0ull;
    if (k_on) threshold = select_threshold<false>(threshold, static_cast<uint32_t>(top_k), 1.f, d, s);
    if (p_on) threshold = select_threshold<true>(threshold, 0u, top_p, d, s);

    // Gumbel-max over the kept tokens. The first token is always kept, so best_score bounds the winner's score
    // from below, and so does the best score so far: a token whose z + GUMBEL_MAX is under it cannot win and gets
    // no noise.
    unsigned long long best = 0ull;
    int cached_quad = -1;
    uint4 words = make_uint4(0u, 0u, 0u, 0u);
    for_each_logit<S::UNROLL>(d.row, d.begin, d.end, [&](int t, float x, bool live) {
        const float z = x * inv_t;
        if (!live || !(z + kdt::GUMBEL_MAX >= best_score) || packed(order_key(z), t) < threshold) return;
        if ((t >> 2) != cached_quad) {
            cached_quad = t >> 2;
            words = noise_words(static_cast<uint32_t>(cached_quad), pos_lo, pos_hi, key);
        }
        const float score = z + kdt::gumbel_of_word(word_of(words, t));
        const unsigned long long v = packed(order_key(score), t);
        if (v > best) {
            best = v;
            best_score = score > best_score ? score : best_score;
        }
    });
    return token_of(cluster_max(best, d, s));
}

}  // namespace ts
