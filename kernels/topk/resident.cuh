// kernels/topk/resident.cuh -- the resident path (V <= 8, few rows, 16-byte aligned rows): one cluster per row;
// each block's whole chunk lands in shared memory at once by bulk copies, one bound from the warp maxima, raw
// candidates and statistics stored into block 0, which prunes, ranks and writes the row. resident_impl<Tin, Shape>
// serves kdt_topk_resident_{wide,narrow}_{f32,bf16}, one ResShape each. See plans/kernels/topk.md, "Resident path".
#pragma once

#include <float.h>
#include <stdint.h>

#include "common/cluster.cuh"
#include "common/mbarrier.cuh"
#include "common/ptx.cuh"
#include "topk/config.cuh"
#include "topk/elements.cuh"
#include "topk/keys.cuh"
#include "topk/select.cuh"
#include "topk/softmax.cuh"

namespace topk {

using kdt::bulk_copy_to_shared;
using kdt::cluster_arrive_relaxed;
using kdt::cluster_arrive_release;
using kdt::cluster_wait_acquire;
using kdt::lds128;
using kdt::mbar_arrive_expect_tx;
using kdt::mbar_init;
using kdt::mbar_wait;
using kdt::shared_add;
using kdt::smem_addr;
using kdt::store_to_block;

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

// A row's top V and log-probabilities from one cluster of Shape::cluster blocks (block `split` owns the columns
// [split * chunk, (split + 1) * chunk)): per block the chunk by bulk copies, the statistics, the bound and the
// candidates; then block 0 prunes, ranks and writes. The steps: plans/kernels/topk.md, "Resident path".
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
        for (int g = 0; g < GROUPS; ++g) mbar_init(smem_addr(&s_landed[g]), 1);   // thread 0's one arrival
        kdt::fence_mbarrier_init_cluster();
        kdt::fence_proxy_async();
        const Vec* src = reinterpret_cast<const Vec*>(logits + (size_t)row * (size_t)vocab + lo);
#pragma unroll
        for (int g = 0; g < GROUPS; ++g) {
            const int first = g * RES_GROUP * T;
            if (first < nvec) {
                const uint32_t bytes = (uint32_t)min(nvec - first, RES_GROUP * T) * VEC_BYTES;
                mbar_arrive_expect_tx(smem_addr(&s_landed[g]), bytes);
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
        mbar_wait(smem_addr(&s_landed[g]), 0);        // each barrier's first and only phase
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
    // The stores above, published to block 0 (plain stores and a cluster barrier, not st.async: see
    // plans/kernels/topk.md, "Resident path").
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

}  // namespace topk
