// kernels/topk/small.cuh -- the small path (V <= 32): one block per split of a row scans its columns once (16-byte
// loads; sm_90: through a 2-step cp.async ring; sm_120: into registers, 3 blocks per SM, the first steps prefetched
// into L2), keeping the online softmax and a per-warp candidate buffer behind a gate, then merges its warp lists.
// small_impl<Tin, VT, CLUSTER> serves kdt_topk_small_* (CLUSTER = 1: S blocks per row, merged through the
// workspace by the last block) and kdt_topk_cluster_* (CLUSTER = ROW_CLUSTER blocks of one cluster, merged over
// distributed shared memory into block 0). See plans/kernels/topk.md, "Small path".
#pragma once

#include <float.h>
#include <stdint.h>

#include "common/cluster.cuh"
#include "common/ptx.cuh"
#include "topk/config.cuh"
#include "topk/elements.cuh"
#include "topk/keys.cuh"
#include "topk/select.cuh"
#include "topk/softmax.cuh"

namespace topk {

using kdt::cluster_arrive_relaxed;
using kdt::cluster_arrive_release;
using kdt::cluster_wait_acquire;
using kdt::cp_async16;
using kdt::cp_async_commit;
using kdt::cp_async_wait;
using kdt::lds128;
using kdt::smem_addr;
using kdt::store_to_block;

// One group of NV vectors of E::W elements per lane (vector u holds the ids base0 + u*SMALL_USTRIDE*W + e):
// online softmax statistics + candidate collection.  Invalid vectors hold -inf (harmless for the statistics)
// and are excluded from selection by valid[].
template <int VT, int NV, typename E>
__device__ __forceinline__ void process_group(const typename E::Vec (&v)[NV], const bool (&valid)[NV], uint32_t base0,
                                              Softmax& sm, Gate& g, uint2* buf, uint32_t* cnt,
                                              uint32_t* out_k, uint32_t* out_i, int lane) {
    constexpr int VW = E::W;
    // A hot valid vector implies gm >= gf. (Invalid vectors hold -inf, so with an open gate, gf = -inf, padding
    // alone can enter, where the per-vector test below finds nothing.)
    scan_group<E>(v, valid, sm, g, [&](int u, bool hot) {
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
    });
}

// Workspace parts are padded to 256 bytes (kdt/launch/topk.py: workspace_nbytes).
__device__ __forceinline__ size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

// A row's top V (V <= VT) and log-probabilities from S blocks (block b: row b / S, split b % S, the columns
// [split * chunk, (split + 1) * chunk)): the scan with the gate schedule, the warp lists, the block merge, then
// (S > 1) the merge of the splits, over the cluster (CLUSTER > 1) or through the workspace `ws`.
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
            kdt::opaque(sp);
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
    // Without a ring (sm_120), steps 1 .. SMALL_L2_WARMUP go to L2 with step 0's loads (one bulk prefetch of its U
    // rows of contiguous vectors per warp and step, the partial last step up to the body's end), so that a short
    // range has its first steps in flight from the start, as the ring does on sm_90.
    if constexpr (SMALL_L2_WARMUP > 0) {
        if (lane == 0) {
#pragma unroll
            for (int st = 1; st <= SMALL_L2_WARMUP; ++st) {
                const int first = st * U * T + warp * U * USTRIDE;
                if (first < nv) kdt::bulk_prefetch_l2(vp + first, (uint32_t)min(U * USTRIDE, nv - first) * VEC_BYTES);
            }
        }
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
    // Without the ring (sm_120) the scan takes all of the 80 registers of 3 blocks per SM: the merges read the
    // warp index again, and the workspace slot row * S + split is blockIdx.x itself, so that neither value lives
    // through the scan as a spill.
    const int mwarp = SMALL_STAGES > 0 ? warp : (int)(kdt::thread_x() >> 5);
    sm.finish();
    float m = sm.m, s = sm.s;
    warp_fold_stats(m, s);
    if (lane == 0) { s_m[mwarp] = m; s_s[mwarp] = s; }
    __syncthreads();
    if (mwarp == 0) fold_stats(s_m, s_s, SMALL_WARPS, s_stat, lane);
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
        if (mwarp == 0) fold_stats(s_m + SMALL_WARPS, s_s + SMALL_WARPS, CLUSTER, s_stat, lane);
        pruned_merge<VT>(s_k + RECV_BASE, s_i + RECV_BASE, CLUSTER, V, s_tk, s_ti, s_buf, &s_n, tid, T);
    } else if (S > 1) {
        const int R = (int)(gridDim.x / (unsigned)S);
        uint32_t* cnt = reinterpret_cast<uint32_t*>(ws);
        float2* pst = reinterpret_cast<float2*>(ws + align256((size_t)R * 4));
        uint2* pcd = reinterpret_cast<uint2*>(ws + align256((size_t)R * 4) + align256((size_t)R * S * 8));
        const size_t pidx = SMALL_STAGES > 0 ? (size_t)row * S + split : (size_t)blockIdx.x;
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
        if (mwarp == 0) fold_stats(s_m, s_s, S, s_stat, lane);
        pruned_merge<VT>(s_k, s_i, S, V, s_tk, s_ti, s_buf, &s_n, tid, T);
    }

    if (tid < V) {
        const float lsum = logf(s_stat[1]);
        const size_t o = (size_t)row * V + tid;
        top_ids[o] = (int)s_ti[tid];
        top_logp[o] = (key2f(s_tk[tid]) - s_stat[0]) - lsum;
    }
}

}  // namespace topk
