// kernels/tree_build.cu -- `tree-build`: the best-first draft tree (contract: plans/contracts.md, `tree-build`).
//
// Launch shape
//   grid = G blocks, one request each; block = kdt_tree_build_threads (256). Warp 0 runs the sequential
//   best-first loop, then the whole block writes the outputs. No workspace; every output element is written.
//   Entry points kdt_tree_build_p{NPL} and kdt_tree_build_p{NPL}_g, NPL in {1, 2, 4, 8, 16, 32}: NPL is the
//   number of slots each lane of warp 0 owns, the smallest power of two >= ceil(N / 32) (N = B + 1). The plain
//   variant has every log-prob the build can read (ranks < min(V, B + 1)) staged in shared memory; the _g variant
//   (only when K * V is too big for the budget, e.g. K = 64, V = 1024, B = 1023) reads ranks >= Vs from global.
//   Dynamic shared memory, computed the same way by the launcher from the exported constants:
//     smem_slot_bytes * P + smem_header_bytes + max(4 * K * Vs, 4 * 8 warps * 32 * W),   P = 32 * NPL,
//     W = ceil(N / 32), Vs = min(V, B + 1, (smem_budget - smem_slot_bytes * P - smem_header_bytes) / (4 * K)).
//   The budget (96 KiB) stays under sm_120's 99 KiB opt-in limit. The loop reads no global memory in the plain
//   variant.
//
// Memory traffic per request
//   reads  top_logp[g]: the [K, Vs] prefix once, coalesced (plus, _g only, single floats gathered on demand);
//          top_ids[g]: one 4-byte gather per taken node (its token), in the finalize.
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
//   Finalize (whole block): the per-slot outputs from the loop's records; mask rows from, for each slot j, the
//   bits of j's ancestors-or-self inside j's 32-slot word (pointer jumping with shuffles) and j's first ancestor
//   below that word: a row follows these exits (one step per nonzero word) into a zeroed per-warp tile, which the
//   warp then copies out coalesced.

#include <cstdint>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kLp0Len = 72;       // lp0[d] = top_logp[g, d, 0] for d < K, -inf for K <= d < 72 (d <= 65 is read)
constexpr int kMiscInts = 8;      // misc[0] = n_nodes
constexpr int kSlotBytes = 28;    // shared bytes per slot of P (see the layout below)
constexpr int kHeaderBytes = 4 * kLp0Len + 4 * kMiscInts;
constexpr int kSmemBudget = 98304;   // 96 KiB: under sm_120's 99 KiB opt-in limit

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

// Order-preserving key of a score; -inf and NaN -> 0 ("dead / no entry"). Every other float maps above 0.
__device__ __forceinline__ uint32_t score_key(float x) {
    const uint32_t u = __float_as_uint(x);
    const uint32_t k = u ^ ((uint32_t)((int32_t)u >> 31) | 0x80000000u);
    return (x > -INFINITY) ? k : 0u;
}

// Inverse of score_key for keys > 0.
__device__ __forceinline__ float key_score(uint32_t k) {
    const uint32_t u = (k & 0x80000000u) ? (k ^ 0x80000000u) : ~k;
    return __uint_as_float(u);
}

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

template <int NPL, bool kPartialLp>
__device__ __forceinline__ void tree_build_body(const float* __restrict__ top_logp, const int* __restrict__ top_ids,
                                                int K, int V, int B, int Vs, int* __restrict__ n_nodes,
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
    uint32_t* const tiles = reinterpret_cast<uint32_t*>(smem_raw + off_x(P));

    const int tid = (int)threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = (int)blockIdx.x;
    const int N = B + 1;
    const int W = (N + 31) >> 5;
    const float* const glp = top_logp + (size_t)g * K * V;
    const int* const gid = top_ids + (size_t)g * K * V;

    // ---- prologue: clear per-slot state, stage the log-probs ----
    for (int i = tid; i < P; i += kThreads) {
        ent[i] = make_uint2(0u, (uint32_t)i << 16);     // no entry; pay names its own slot
        fc_s[i] = -1;
        ns_s[i] = -1;
    }
    for (int i = tid; i < kLp0Len; i += kThreads) lp0[i] = (i < K) ? glp[(size_t)i * V] : -INFINITY;
    for (int i = tid; i < K * Vs; i += kThreads) {
        const int d = i / Vs;
        const int r = i - d * Vs;
        lp_s[i] = glp[(size_t)d * V + r];
    }
    __syncthreads();

    // ---- best-first loop: warp 0 ----
    if (warp == 0) {
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
            tok = gid[(size_t)(dep - 1) * V + rnk];
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

#define KDT_TREE_BUILD_ENTRY(NPL, SUFFIX, PARTIAL)                                                             \
    extern "C" __global__ void __launch_bounds__(kThreads) kdt_tree_build_p##NPL##SUFFIX(                     \
        const float* __restrict__ top_logp, const int* __restrict__ top_ids, int K, int V, int B, int Vs,       \
        int* __restrict__ n_nodes, int* __restrict__ parent, int* __restrict__ depth, int* __restrict__ token, \
        int* __restrict__ rank, float* __restrict__ logw, int* __restrict__ first_child,                       \
        int* __restrict__ next_sibling, uint32_t* __restrict__ mask) {                                          \
        tree_build_body<NPL, PARTIAL>(top_logp, top_ids, K, V, B, Vs, n_nodes, parent, depth, token, rank, logw,         \
                             first_child, next_sibling, mask);                                                   \
    }

// kdt_tree_build_p{NPL}: the needed [K, Vs = min(V, B + 1)] log-probs fit in shared memory.
// kdt_tree_build_p{NPL}_g: they do not (Vs < min(V, B + 1)); ranks >= Vs are read from global memory.
KDT_TREE_BUILD_ENTRY(1, , false)
KDT_TREE_BUILD_ENTRY(2, , false)
KDT_TREE_BUILD_ENTRY(4, , false)
KDT_TREE_BUILD_ENTRY(8, , false)
KDT_TREE_BUILD_ENTRY(16, , false)
KDT_TREE_BUILD_ENTRY(32, , false)
KDT_TREE_BUILD_ENTRY(1, _g, true)
KDT_TREE_BUILD_ENTRY(2, _g, true)
KDT_TREE_BUILD_ENTRY(4, _g, true)
KDT_TREE_BUILD_ENTRY(8, _g, true)
KDT_TREE_BUILD_ENTRY(16, _g, true)
KDT_TREE_BUILD_ENTRY(32, _g, true)
