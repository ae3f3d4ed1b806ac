// verify-attn: MLA (absorbed) tree-verify attention over a paged prefix and the tree's own keys.
//
// Contract (plans/contracts.md, `verify-attn`)
//   q bf16 [G,N,H,Dqk], kv_cache bf16 [pages,64,Dqk], block_table int32 [G,max_pages], prefix_len int32 [G],
//   kv_tree bf16 [G,N,Dqk], mask uint32 [G,N,W] (W = ceil(N/32)), n_nodes int32 [G].
//   For slot i <= n_nodes[g] and head h: scores = softmax_scale * q[g,i,h] . key over prefix tokens
//   t < prefix_len[g] (page block_table[g, t/64], row t%64) and over tree slots j with bit j of mask[g,i]
//   set; value = first Dv columns of the key row. out [G,N,H,Dv] (float32 or bf16 bits) = softmax @ V,
//   lse float32 [G,N,H] = natural-log logsumexp of the scaled scores. Slots i > n_nodes: out 0, lse -inf.
//
// Limits
//   Dqk = 576 and Dv = 512 only (kdt_verify_attn_dqk / kdt_verify_attn_dv; the launcher rejects others).
//   Page size 64. N*H <= 2^31/64 rows per request, G <= 65535 (grid y), any prefix the block table holds.
//   A row with no admissible key (empty prefix and no mask bit) gets out 0, lse -inf, like the reference.
//
// Algorithm (one CTA = 256 threads = 8 warps; mma.sync m16n8k16 bf16 -> f32, on sm_90a wgmma; online
// softmax in fp32)
//   The H*N query rows of request g are numbered r = i*H + h (exactly the memory order of q / out / lse),
//   and a CTA owns ROWS = 64 consecutive rows: MLA has one latent KV head, so all 64 rows (slots x heads)
//   share every key and the CTA streams the request's keys once for all of them, in tiles of KV_T tokens:
//   first the prefix (KV_T divides the page: a tile is one contiguous piece of one page), then the tree
//   (kv_tree[g], N slots, each row's mask bits applied as -inf). Q (64 x 576) stays in smem. Per tile k:
//     B0   cp.async.wait_group 0 + __syncthreads: tile k is in smem and every warp is past tile k-1, so tile
//          k+1 is prefetched into the other buffer (cp.async 16 B, zero-fill past the prefix / past N; the
//          block_table entry was read one tile ahead). sm_120: one buffer, load then compute.
//     S    S = Q K^T (64 x KV_T) by ldmatrix from XOR-swizzled smem (16-byte chunk c of a 1152-byte row r at
//          c ^ (r & 7): the 8 rows of an 8x8 ldmatrix hit 8 different bank groups).
//          sm_90 (KV_T = 64, "split-D"): warp w = 4*dh + 2*rg + cg computes rows 32rg..+32 x keys 32cg..+32
//          over the k16 steps 2j + dh (half of Dqk): 2 + 2 ldmatrix.x4 per 8 mma. Warps w and w^4 add their
//          partials through 2 KB of the P buffer (two 64-thread named barriers); afterwards warp w owns rows
//          32rg + 16dh..+16 x keys 32cg..+32 (16 rows x 32 keys, the layout the softmax below expects).
//          sm_90a (cubin built for compute_90a, `WG_S`): wgmma instead of the split-D mma.sync: warpgroup
//          c = w / 4 issues 36 wgmma.m64n32k16 (Q and K from smem through descriptors, 128-byte swizzle, Q and
//          key tiles stored as 9 column blocks of 64 x 128 B) for rows 0..63 x keys 32c..+32; warp w ends up
//          owning rows 16(w%4)..+16 x keys 32c..+32 (no exchange). P V is on wgmma too (`WG_PV`, below).
//          sm_120 (KV_T = 16): warp w computes rows 16(w/2)..+16 x keys 8(w%2)..+8 over all of Dqk.
//     max  s *= softmax_scale*log2(e); masked -> -inf; row max per warp -> smem; B1 (__syncthreads on sm_90
//          split-D, a 64-thread named barrier of the two warps sharing the rows on sm_90a and sm_120); both
//          warps owning a row take the same new running max m.
//     P    p = exp2(s - m), P (bf16) -> smem, alpha = exp2(m_old - m) (-> smem on the mma.sync P V path);
//          each warp keeps a partial row sum over its own keys (same m in both warps, so the partials add at
//          the end). P smem: ROWS rows of KV_T bf16, 16-byte chunk c of row r at c ^ (r & 7) (sm_90: rows of
//          128 B, i.e. exactly the wgmma K-major 128-byte swizzle layout of a 64 x 64 tile, 1 KB aligned).
//     B2   __syncthreads (sm_90a: each thread first issues fence.proxy.async for its own P stores, so that the
//          wgmma, an async-proxy reader, sees them after the barrier).
//     PV   mma.sync (sm_90, sm_120): warp w owns value columns 64w..+64 for all 64 rows: O (64 x 64 fp32 per
//          warp = 128 registers per thread) *= alpha (skipped by a warp vote when alpha == 1), O += P V with
//          P by ldmatrix and V = the first 512 columns of the same smem key tile by ldmatrix.trans (V is not
//          read again from memory).
//          sm_90a (`WG_PV`): warpgroup c owns value columns 256c..+256 for all 64 rows; O is the m64n256 D
//          fragment (128 fp32 registers per thread: warp w holds rows 16(w%4) + gq, +8, the rows whose
//          softmax it computed, so alpha is applied from registers, before B2, skipped by a warp vote when
//          1). After B2: wgmma.fence, 4 x wgmma.m64n256k16 (one per 16 keys), commit, wait_group 0.
//            A = P through a K-major 128-byte-swizzle descriptor (SBO 1024 B; k16 step = +32 B);
//            B = V = column blocks 4c..4c+3 of the same key tile through an MN-major ("transposed B",
//            imm-trans-b = 1) 128-byte-swizzle descriptor: LBO = 8192 B (next 64 value columns = next column
//            block), SBO = 1024 B (next 8 keys); k16 step = +2048 B (16 key rows of 128 B).
//          The wait retires the wgmma before the next B0, after which its key buffer is refilled and P is
//          overwritten (synchronous: no P V / softmax overlap yet).
//   sm_90a default (`WG_PIPE`, warp-specialised; the per-tile steps above remain the sm_90 / sm_120 path and
//   the WG_PIPE = false fallback): warpgroup 0 alone computes S (36 x wgmma.m64n64k16: all 64 keys over all
//   of Dqk, so Q and K are read once per tile, 144 KB of smem operand reads instead of 216 KB with m64n32 in
//   both warpgroups; S was smem-bandwidth-bound), the softmax (a quad owns a whole row: no cross-warp max,
//   no B1) and its half of P V; warpgroup 1 issues all key-tile cp.async and the other half of P V. P_k is
//   written into the rope column block (block 8, 64 x 128 B) of tile k's own buffer, which S_k was the last
//   to read, so P needs no buffer of its own and P_{k+1} never waits for the P V readers of P_k.
//   Handoffs between the warpgroups: shared-memory mbarriers (OFF_BAR, 5 x 8 B); every producing thread
//   arrives (mbarrier.arrive.release.cta; count = their number), every thread of the consumer waits
//   (mbarrier.try_wait.parity.acquire.cta in a loop); it = k - kb is the tile's index in the split:
//     PREADY    count 128, WG0 -> WG1: P_k and alpha_k are in smem (WG0 fenced its P stores to the async proxy
//               first). One phase per tile: WG1 waits parity it & 1.
//     FULL      count 128, WG1 -> WG0: tile k+1 landed (WG1 waited its cp.async and fenced), arrived while
//               WG1's P V runs; also releases WG1's read of alpha_k. Arrived iff k + 1 < ke, so phase j
//               completes in WG1's iteration j: WG0 waits parity (it - 1) & 1 before S_k, it > 0.
//     EMPTY[b]  count 256, WG0 + WG1 -> WG1: every warp's P V of tile k retired (and WG0's P_k stores are
//               done), so WG1 refills buffer b = it & 1 with tile k+2 (WG1 arrives, then waits: its own four
//               warps' P V reads are ordered too). Arrived iff k + 2 < ke; used every other tile: WG1 waits
//               parity (it >> 1) & 1.
//     SDONE     count 128, WG0 -> WG0: all four warps past their S wait before any P store overwrites the
//               rope block (every warp's share of the S wgmma reads all 64 key rows). Every WG0 thread arrives
//               and then waits parity it & 1 (no thread arrives for tile it + 1 before the phase of it
//               completed, so it never runs two phases ahead). An mbarrier like the other handoffs: with a
//               WG0-only bar.sync here racecheck still reported invl_s across the epilogue __syncthreads;
//               with every handoff on mbarriers it reports nothing (H200, 2026-11-30).
//   WG0 per tile: [FULL] S_k, wait, [SDONE], softmax, P_k + alpha_k, [arrive PREADY], O *= alpha, P V_k, wait,
//   [arrive EMPTY]. WG1: [PREADY], O *= alpha_k (from smem), issue P V_k, wait tile k+1 + [arrive FULL], wait
//   P V_k, [EMPTY], load tile k+2. So WG0's S_{k+1} overlaps WG1's P V_k, the loads leave WG0's path and the
//   only full-CTA barriers are the prologue and the epilogue. The tensor pipe still idles during WG0's softmax
//   (a third key buffer for S_{k+1} before softmax_k does not fit). No mbarrier runs two phases ahead of its
//   waiter (a parity wait could not tell them apart): PREADY / FULL arrival it+1 is ordered after the
//   consumer's wait it by FULL / PREADY, and EMPTY[b] arrival it+2 after WG1's wait it by FULL (tile k+2 is
//   loaded after that wait); this is also why EMPTY needs one mbarrier per buffer (WG0 can retire P V of
//   tiles k and k+1 before WG1 waits for k). Running max, row sums and lse live in WG0 only; alpha reaches
//   WG1 through smem (read before WG1's FULL arrival, after which WG0 may write the next one).
//   (mbarriers instead of bar.arrive / bar.sync pairs: same overlap, and compute-sanitizer racecheck models
//   their release / acquire; it reported every bar.arrive-ordered handoff, e.g. alpha_s, as a hazard.)
//   Epilogue: l = sum of the partials, out = O / l, lse = (m + log2 l) * ln 2; rows past n_nodes (and rows
//   with no admissible key) get out 0 and lse -inf.
//   Split (flash-decoding, num_splits > 1, grid z): split s of a request takes key tiles
//   [s*per, (s+1)*per), per = ceil(tiles / num_splits) from the request's actual prefix_len; it writes O / l
//   and lse (-inf for an empty split) to the workspace; kdt_verify_attn_combine merges the splits through lse.
//   The workspace holds no state between launches: every word the combine reads was written by the same
//   launch, so it is not zeroed afterwards.
//
// Launch shape
//   kdt_verify_attn_fwd:     grid (ceil(N*H/64), G, num_splits), block 256, dynamic smem
//                            kdt_verify_attn_smem_bytes: 230912 B on sm_90 / sm_100 (Q 72 KB + 2 x 72 KB key
//                            tiles of 64 tokens + P 8 KB + 1.5 KB row stats); 95744 B on sm_120 (Q 72 KB + one
//                            18 KB tile of 16 tokens + P 2 KB + stats, under the 99 KB limit). 1 CTA per SM.
//                            sm_90a: 230952 B, the same plus the 5 WG_PIPE mbarriers (40 B); WG_PIPE leaves
//                            the 8 KB P buffer and the row-stat arrays other than alpha / 1/l unused (P lives
//                            in the key tile's rope block); 254 registers with WG_PIPE (128 O + 32 S
//                            accumulators in WG0, ptxas uses the rest of the 255 it may: 1 CTA of 256 threads
//                            per SM), 193 with the fallback; no spill.
//   kdt_verify_attn_combine: grid (ceil(N*H/2), G), block 256 (4 warps per row), no smem; only when
//                            num_splits > 1. num_splits comes from shapes only (graph capturable).
//
// Memory traffic
//   Keys: every query tile of a request reads all of its prefix + tree keys once: ceil(N*H/64) *
//   (prefix + N) * 1152 B per request (HBM once, L2 for the other query tiles, which run concurrently).
//   Q: 72 KB per CTA; out: N*H*Dv*4 (or 2) B; lse: N*H*4 B; split partials: num_splits * G * ceil(N*H/64) * 64
//   * 513 * 4 B written once and read once (mostly from L2).
//   FLOPs counted: 2*H*N*(prefix+N)*(576+512); rows past n_nodes and padding rows of the last query tile
//   are computed anyway (masked out at the end).

#include <stdint.h>

#include "common/verify_attn_ptx.cuh"

namespace va {

constexpr int DQK = 576;                      // key dim (512 latent + 64 rope)
constexpr int DV = 512;                       // value dim (first DV columns of a key row)
constexpr int PAGE = 64;                      // kv_cache page size in tokens
constexpr int ROWS = 64;                      // query rows (slot, head) per CTA
constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int ROW_BYTES = DQK * 2;            // 1152 B per key / query row
constexpr int ROW_CHUNKS = ROW_BYTES / 16;    // 72 16-byte chunks per row

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 1200 || __CUDA_ARCH__ < 900)
constexpr int KV_T = 16;                      // keys per tile (99 KB smem parts: sm_120, sm_8x)
constexpr int STAGES = 1;
#else
constexpr int KV_T = 64;                      // keys per tile = one page (227 KB smem parts: sm_90, sm_100)
constexpr int STAGES = 2;
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr bool WG_S = true;                   // sm_90a: S = Q K^T by wgmma (see below)
#else
constexpr bool WG_S = false;
#endif
// Q / key tile layout in smem. mma.sync paths: row-major rows of 1152 B (TROW), 16-byte chunk c of row r at
// chunk c ^ (r & 7) inside its group of 8 (BLK = 128 B between 64-column blocks). WG_S: the wgmma 128-byte
// swizzle layout: 64-column block m of a 64-row tile at m * 8192 B, row r at +128 r, chunk u at u ^ (r & 7)
// (TROW = 128, BLK = 8192). Both: byte offset of (row r, column block m, chunk u) = m*BLK + r*TROW + 16*(u^(r&7)).
constexpr int TROW = WG_S ? 128 : ROW_BYTES;
constexpr int BLK = WG_S ? 64 * 128 : 128;
constexpr int S_WN = 2;                       // warps along the keys of a tile in S = Q K^T
constexpr int TW = KV_T / S_WN;               // keys per S warp (after the split-D exchange, see below)
// S = Q K^T warp layout.
//   SPLIT_D (KV_T = 64): warp w = 4*dh + 2*rg + cg computes a 32-row x 32-key partial over the k16 steps
//     ks = 2j + dh (half the 576 dims), 2 ldmatrix.x4 (A) + 2 (B) per 8 mma; warps w and w+4 then add
//     their partials through smem (each keeps 16 of the 32 rows): 1/3 less ldmatrix traffic than 16x32 tiles.
//   else (KV_T = 16): warp w = 2*rg + cg computes 16 rows x 8 keys over all 576 dims.
constexpr bool SPLIT_D = KV_T == 64 && !WG_S;
constexpr int NT = TW / 8;                    // 8-key n-tiles per S warp
constexpr int MT = ROWS / 16;                 // 16-row m-tiles per PV warp (all rows)
constexpr int DV_W = DV / WARPS;              // value columns per PV warp
constexpr int PV_NP = DV_W / 16;              // pairs of 8-column n-tiles per PV warp
constexpr int KSTEPS_PV = KV_T / 16;          // k16 steps of P V per tile
constexpr int P_ROW_BYTES = KV_T * 2;
constexpr int P_CHUNKS = KV_T / 8;            // 16-byte chunks per P row
// O accumulators per thread: O_NT n8-tiles x 4 fp32 = 128 registers on every path.
//   mma.sync P V: tile j = 2*PV_NP*mt + nt holds rows 16mt + gq (+8) x columns DV_W*warp + 8nt + 2cq (+1).
//   WG_PV: the m64n256k16 D fragment, tile j holds rows own0 + gq (+8) x columns PV_WG_N*s_cg + 8j + 2cq (+1).
constexpr int O_NT = MT * 2 * PV_NP;
// sm_90a: P V by wgmma as well (WG_PV): warpgroup c computes O[:, 256c..256c+255] (all 64 rows) with 4
// wgmma.m64n256k16 per key tile, A = P (64 x 64, K-major 128-byte swizzle, the P tile is exactly one swizzle
// column block) and B = V = column blocks 4c..4c+3 of the key tile (MN-major, transposed B). Setting WG_PV to
// false keeps wgmma S with the mma.sync P V below (a diagnosis switch; both are complete paths).
constexpr bool WG_PV = WG_S;
constexpr int PV_WG_N = DV / 2;               // value columns per warpgroup (the n of m64n256k16)
// sm_90a: warp-specialised producer / consumer tile loop (`WG_PIPE`, see the header comment). false = the
// synchronous loop below with WG_S / WG_PV (both warpgroups compute S, m64n32 each); a diagnosis switch.
constexpr bool WG_PIPE = WG_S;
constexpr int WG_THREADS = 128;               // one warpgroup
constexpr int PIPE_NT = KV_T / 8;             // WG_PIPE: n8 tiles of the m64n64 S fragment (all keys of a tile)
constexpr int P_BLK = DQK / 64 - 1;           // WG_PIPE: P_k lives in column block 8 (rope, 64 x 128 B) of tile k
// WG_PIPE handoffs between the warpgroups: shared-memory mbarriers (index into the OFF_BAR array of 8-byte
// words). Every producing thread arrives (release), every thread of the consuming warpgroup waits on the
// phase parity (acquire); see the header comment for the parities.
constexpr int MB_PREADY = 0;                  // WG0 -> WG1: P_k and alpha_k are in smem (one phase per tile)
constexpr int MB_FULL = 1;                    // WG1 -> WG0: tile k+1 has landed (cp.async by WG1)
constexpr int MB_EMPTY = 2;                   // + buffer k & 1: both warpgroups' P V of tile k has retired
constexpr int MB_SDONE = MB_EMPTY + STAGES;   // WG0 -> WG0: every warp's S wgmma of tile k has retired
constexpr int PIPE_MBARS = MB_SDONE + 1;      // PREADY, FULL, EMPTY[0], EMPTY[1], SDONE
constexpr int MB_HANDOFF_ARRIVALS = WG_THREADS;  // PREADY, SDONE (WG0 arrives), FULL (WG1 arrives)
// EMPTY: every thread of both warpgroups arrives after its P V wait, WG1 then waits: WG1's own four warps
// must all be past their P V reads of the buffer as well (each warp's slice of the m64n256 wgmma reads all
// of V) before any WG1 thread overwrites it; the bar.sync of the former named barrier gave that implicitly.
constexpr int MB_EMPTY_ARRIVALS = THREADS;
static_assert(MB_PREADY >= 0 && MB_FULL > MB_PREADY && MB_EMPTY > MB_FULL && MB_SDONE >= MB_EMPTY + STAGES &&
                  MB_HANDOFF_ARRIVALS == WG_THREADS &&
                  MB_EMPTY_ARRIVALS == 2 * WG_THREADS,
              "WG_PIPE: distinct mbarriers; arrival count = threads that arrive on each (see above)");
static_assert(!WG_PIPE || (WG_S && WG_PV && THREADS == 2 * WG_THREADS && PIPE_NT == 8 && P_BLK == 8 &&
                           KV_T == PAGE && (P_BLK + 1) * 64 == DQK && STAGES == 2),
              "WG_PIPE: two warpgroups, 64-key tiles (one page), P in the rope column block");

constexpr int Q_BYTES = ROWS * ROW_BYTES;
constexpr int KV_TILE_BYTES = KV_T * ROW_BYTES;
constexpr int P_BYTES = ROWS * P_ROW_BYTES;
constexpr int OFF_Q = 0;
constexpr int OFF_KV = OFF_Q + Q_BYTES;
constexpr int OFF_P = OFF_KV + STAGES * KV_TILE_BYTES;
constexpr int OFF_REDMAX = OFF_P + P_BYTES;              // float [ROWS][S_WN]
constexpr int OFF_REDL = OFF_REDMAX + ROWS * S_WN * 4;  // float [ROWS][S_WN]
constexpr int OFF_ALPHA = OFF_REDL + ROWS * S_WN * 4;   // float [ROWS]
constexpr int OFF_INVL = OFF_ALPHA + ROWS * 4;          // float [ROWS]
constexpr int OFF_BAR = OFF_INVL + ROWS * 4;            // WG_PIPE only: uint64 mbarrier [PIPE_MBARS]
constexpr int BAR_BYTES = WG_PIPE ? PIPE_MBARS * 8 : 0; // other paths: no mbarrier, smem size unchanged
constexpr int SMEM_BYTES = OFF_BAR + BAR_BYTES;
static_assert(OFF_BAR % 8 == 0, "mbarrier objects are 8-byte aligned");

constexpr int COMBINE_THREADS = 256;
constexpr int COMBINE_WARPS_PER_ROW = 4;                // each warp: DV / 4 value columns, a float4 per lane
constexpr int COMBINE_ROWS = COMBINE_THREADS / 32 / COMBINE_WARPS_PER_ROW;   // output rows per block
constexpr int COMBINE_UNROLL = 8;                       // partial-row loads in flight per lane
static_assert(DV == 4 * 32 * COMBINE_WARPS_PER_ROW, "combine: a float4 per lane covers the value row");
static_assert(COMBINE_THREADS % (32 * COMBINE_WARPS_PER_ROW) == 0, "combine: whole rows per block");

static_assert(!WG_S || (ROWS == 64 && KV_T == 64 && TW == 32 && WARPS == 8 && OFF_KV % 1024 == 0 &&
                        KV_TILE_BYTES % 1024 == 0), "wgmma S: two warpgroups x (64 rows x 32 keys), 1 KB atoms");
static_assert(DV_W == 64, "PV warp = one 64-column block of V");
static_assert(O_NT == 32, "O = 128 fp32 registers per thread");
static_assert(!WG_PV || (WG_S && PV_WG_N == 256 && PV_WG_N % 64 == 0 && P_CHUNKS == 8 && P_ROW_BYTES == 128 &&
                         OFF_P % 1024 == 0 && BLK == 8192 && TROW == 128),
              "wgmma P V: two warpgroups x m64n256, P = one 64 x 128 B swizzle block, V = 64-column blocks");
static_assert(SPLIT_D ? (ROWS == 64 && TW == 32 && WARPS == 8) : (WARPS / S_WN) * 16 == ROWS,
              "S warps must cover the query rows");
static_assert(!SPLIT_D || P_BYTES >= (WARPS / 2) * 2048, "split-D exchange lives in the P buffer");
static_assert(!SPLIT_D || (DQK / 16) % 2 == 0, "split-D: even number of k16 steps");
static_assert(NT == 1 || NT % 2 == 0, "S n-tiles: one, or pairs for ldmatrix.x4");
static_assert(PAGE % KV_T == 0 && KV_T % 16 == 0, "a key tile lies in one page and is k16-aligned");
static_assert(DQK % 64 == 0, "S loop runs in groups of 4 k16 steps");
static_assert(DV % (WARPS * 16) == 0, "value columns split in 16-column pairs per warp");
static_assert(P_CHUNKS == 2 || P_CHUNKS == 4 || P_CHUNKS == 8, "P swizzle");
static_assert(ROW_CHUNKS % 8 == 0, "key/query swizzle works on groups of 8 chunks");
static_assert(THREADS % KV_T == 0 && THREADS % ROWS == 0, "loader: whole threads per row");
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 1200 || __CUDA_ARCH__ < 900)
static_assert(SMEM_BYTES <= 101376, "sm_120 / sm_8x: 99 KB of dynamic smem per block");
#else
static_assert(SMEM_BYTES <= 232448, "sm_90 / sm_100: 227 KB of dynamic smem per block");
#endif

constexpr float NEG_INF = -__builtin_huge_valf();
constexpr float LN2 = 0.693147180559945309f;

// Key / query tiles: row-major rows of 1152 B; 16-byte chunk c of row r lives at chunk c ^ (r & 7), so
// the 8 rows of an ldmatrix 8x8 matrix (same logical chunk) hit 8 different bank groups.

// P tile: ROWS x KV_T bf16, rows of P_CHUNKS chunks; chunk c of row r lives at c ^ pswz(r).
__device__ __forceinline__ int pswz(int row) { return (row / (8 / P_CHUNKS)) & (P_CHUNKS - 1); }

// Load TROWS rows of 576 bf16 into a swizzled smem tile. Thread tid copies row tid / TPR, chunks
// tid % TPR + TPR*i. `src_row` is that row in global memory; valid == false zero-fills it (src-size 0: the
// address is not read). Every copy is one cp.async with immediate offsets from two or three base registers:
//   TPR % 8 == 0: chunk lc + TPR*i lives at (lc ^ r7) + TPR*i;
//   TPR == 4:     chunk lc + 4*(2m + b) lives at 8m + ((4b + lc) ^ r7).
template <int TROWS>
__device__ __forceinline__ void load_rows(uint32_t s_tile, const uint16_t* src_row, bool valid) {
    const int tid = static_cast<int>(thread_x());  // re-read per call: cheaper than holding the offsets live
    constexpr int TPR = THREADS / TROWS;
    constexpr int CPT = (ROW_CHUNKS + TPR - 1) / TPR;
    static_assert(TPR % 8 == 0 || TPR == 4, "loader swizzle cases");
    const int row = tid / TPR;
    const int lc = tid % TPR;
    const int r7 = row & 7;
    const uint32_t dst_row = s_tile + static_cast<uint32_t>(row * TROW);
    const char* src = reinterpret_cast<const char*>(src_row) + lc * 16;
    const uint32_t nbytes = valid ? 16u : 0u;
    if constexpr (TPR % 8 == 0) {
        static_assert(TPR % 8 != 0 || !WG_S, "TPR % 8 == 0 loader: mma.sync layout only");
        const uint32_t dst = dst_row + static_cast<uint32_t>((lc ^ r7) << 4);
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
            if (ROW_CHUNKS % TPR == 0 || lc + TPR * i < ROW_CHUNKS)
                cp_async16(dst + TPR * 16 * i, src + TPR * 16 * i, nbytes);
        }
    } else {
        const uint32_t dst0 = dst_row + static_cast<uint32_t>((lc ^ r7) << 4);
        const uint32_t dst1 = dst_row + static_cast<uint32_t>(((lc + 4) ^ r7) << 4);
#pragma unroll
        for (int i = 0; i < CPT; ++i) cp_async16(((i & 1) ? dst1 : dst0) + BLK * (i >> 1), src + 64 * i, nbytes);
    }
}

// Row `row` of key tile k of a request: prefix tiles first (k < n_pref; `page` = block_table entry of the tile,
// read ahead by the caller), then tree tiles. valid = false past the prefix / past N (the row is zero-filled,
// never NaN; the returned pointer is then any in-bounds row).
__device__ __forceinline__ const uint16_t* kv_row_source(int k, int row, int page, int n_pref, int plen, int N, int g,
                                                         const uint16_t* __restrict__ kv_cache,
                                                         const uint16_t* __restrict__ kv_tree, bool& valid) {
    if (k < n_pref) {
        const int tok0 = k * KV_T;
        valid = tok0 + row < plen;
        return valid ? kv_cache + (static_cast<size_t>(page) * PAGE + (tok0 % PAGE) + row) * DQK : kv_cache;
    }
    const int j = (k - n_pref) * KV_T + row;
    valid = j < N;
    return valid ? kv_tree + (static_cast<size_t>(g) * N + j) * DQK : kv_cache;
}

// Key tile k of a request, loaded by the whole CTA.
__device__ __forceinline__ void load_kv_tile(uint32_t s_tile, int k, int page, int n_pref, int plen, int N, int g,
                                             const uint16_t* __restrict__ kv_cache,
                                             const uint16_t* __restrict__ kv_tree) {
    constexpr int TPR = THREADS / KV_T;
    const int row = static_cast<int>(thread_x()) / TPR;
    bool valid;
    const uint16_t* src = kv_row_source(k, row, page, n_pref, plen, N, g, kv_cache, kv_tree, valid);
    load_rows<KV_T>(s_tile, src, valid);
}

// WG_PIPE: key tile k loaded by warpgroup 1 alone (128 threads, wgmma 128-byte swizzle layout). Thread t copies
// chunks t % 8 + 8i (i = 0..8, i.e. chunk t % 8 of column block i) of rows t / 8 + 16p (p = 0..3): 8 threads
// cover 128 contiguous bytes of a row, and the four rows share row & 7, so one lane offset serves all 36
// copies (the rest are immediates: p * 16 rows, i * BLK).
__device__ __forceinline__ void load_kv_tile_wg1(uint32_t s_tile, int k, int page, int n_pref, int plen, int N,
                                                 int g, const uint16_t* __restrict__ kv_cache,
                                                 const uint16_t* __restrict__ kv_tree) {
    static_assert(!WG_PIPE || (KV_T == 64 && ROW_CHUNKS == 8 * (DQK / 64) && WG_THREADS == 128), "WG1 loader: 64 rows x 9 blocks");
    const int t = static_cast<int>(thread_x()) - WG_THREADS;
    const int lc = t & 7;
    const int row0 = t >> 3;  // 0..15
    const uint32_t dst = s_tile + static_cast<uint32_t>(row0 * TROW + ((lc ^ (row0 & 7)) << 4));
#pragma unroll
    for (int p = 0; p < KV_T / 16; ++p) {
        bool valid;
        const uint16_t* src = kv_row_source(k, row0 + 16 * p, page, n_pref, plen, N, g, kv_cache, kv_tree, valid);
        const char* s8 = reinterpret_cast<const char*>(src) + lc * 16;
        const uint32_t nbytes = valid ? 16u : 0u;
#pragma unroll
        for (int i = 0; i < DQK / 64; ++i) cp_async16(dst + 16 * TROW * p + BLK * i, s8 + 128 * i, nbytes);
    }
}

// Entry (nt, e) of a score fragment, flat (wgmma: d[4 nt + e]) or per n8 tile (s[nt][e]); e < 2: row rowA,
// else rowB; column 8 nt + 2 cq + (e & 1).
template <int N>
__device__ __forceinline__ float& frag_at(float (&f)[N], int nt, int e) { return f[4 * nt + e]; }
template <int N>
__device__ __forceinline__ float& frag_at(float (&f)[N][4], int nt, int e) { return f[nt][e]; }

// Scale, mask, row max of NTILES n8 tiles of scores of rows rowA / rowB (this thread: columns 8 nt + 2 cq + {0, 1}):
// s *= scale_log2e, or -inf at columns >= lim and, on a tree tile, where bit c of the row's mask word wA / wB
// is clear; mxA / mxB get the quad's row maxima (a quad holds the fragment's whole row).
template <int NTILES, typename Frag, typename Word>
__device__ __forceinline__ void scale_mask_rowmax(Frag& f, int cq, int lim, bool tree, Word wA, Word wB,
                                                  float scale_log2e, float& mxA, float& mxB) {
    mxA = NEG_INF;
    mxB = NEG_INF;
#pragma unroll
    for (int nt = 0; nt < NTILES; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int c = 8 * nt + 2 * cq + e;
            bool okA = c < lim, okB = c < lim;
            if (tree) {
                okA = okA && ((wA >> c) & 1u);
                okB = okB && ((wB >> c) & 1u);
            }
            float& a = frag_at(f, nt, e);
            float& b = frag_at(f, nt, 2 + e);
            a = okA ? a * scale_log2e : NEG_INF;
            b = okB ? b * scale_log2e : NEG_INF;
            mxA = fmaxf(mxA, a);
            mxB = fmaxf(mxB, b);
        }
    }
    mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 1));
    mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 2));
    mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 1));
    mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 2));
}

// Online softmax, one row: the running max m (log2 units) moves to max(m, mx), the tile's row max; returns alpha =
// exp2(old m - new m), the factor for the row's earlier sums, and sets mu, the base of the tile's exp2(s - mu)
// (0 while the row has no admissible key: p = 0, alpha = 0).
__device__ __forceinline__ float move_max(float& m, float mx, float& mu) {
    const float mn = fmaxf(m, mx);
    mu = mn == NEG_INF ? 0.f : mn;
    const float alpha = ex2(m - mu);
    m = mn;
    return alpha;
}

// O *= alpha per row (rowA: o[j][0..1], rowB: o[j][2..3] of the m64n256 fragment) after a running-max move; the
// max rarely moves after the first tiles, so the 128 multiplies are skipped when alpha == 1 for the whole warp.
__device__ __forceinline__ void rescale_rows(float (&o)[O_NT][4], float alA, float alB) {
    if (__any_sync(0xffffffffu, (alA != 1.f) | (alB != 1.f))) {
#pragma unroll
        for (int j = 0; j < O_NT; ++j) {
            o[j][0] *= alA;
            o[j][1] *= alA;
            o[j][2] *= alB;
            o[j][3] *= alB;
        }
    }
}

// The end of a query row's softmax: invl_s[row] = 1 / L (0 for a row past n_nodes or with no admissible key,
// whose output is then +0) and its natural-log lse (m in log2 units; -inf for such a row) to part_lse (split
// s of a flash-decoding split) or lse, for rows gr < R.
__device__ __forceinline__ void finish_row(int row, int gr, bool act, float m, float L, float* invl_s, int R, int g,
                                           int G, int Rpad, int split, bool split_mode, float* lse, float* part_lse) {
    const bool ok = act && L > 0.f;
    invl_s[row] = ok ? 1.f / L : 0.f;
    const float lse_v = ok ? (m + log2f(L)) * LN2 : NEG_INF;
    if (gr < R) {
        if (split_mode)
            part_lse[(static_cast<size_t>(split) * G + g) * Rpad + gr] = lse_v;
        else
            lse[static_cast<size_t>(g) * R + gr] = lse_v;
    }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// O (m64n256 fragment) += P V of one key tile on wgmma, issued and committed, not waited (wgmma_retire):
// A = P at p_addr (K-major 128-byte swizzle, k16 step kk at +32*kk bytes inside the 128-byte row), B = V at
// v_addr, this warpgroup's 256 value columns (MN-major: LBO = BLK to the next 64 value columns, SBO = 8*TROW to
// the next 8 keys, k16 step kk at +16*TROW bytes).
__device__ __forceinline__ void pv_wgmma(float (&o)[O_NT][4], uint32_t p_addr, uint32_t v_addr) {
    const uint64_t dp = wgmma_desc_sw128(p_addr);
    const uint64_t dv = wgmma_desc_sw128_mn(v_addr, BLK, 8 * TROW);
    reg_fence_all(o);  // a rescale of o is done before the fence
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KSTEPS_PV; ++kk)
        wgmma_m64n256k16_tb(o, dp + static_cast<uint64_t>((32 * kk) >> 4),
                            dv + static_cast<uint64_t>((16 * TROW * kk) >> 4));
    wgmma_commit();
    reg_fence_all(o);
}

// S (64 rows x 2*NF keys) = Q K^T over all of Dqk on wgmma, into d (zeroed first): the DQK/64 column blocks m x 4
// k16 steps kk, both operands K-major 128-byte swizzle, step (m, kk) at +m*BLK + 32*kk bytes from the
// descriptors dq / dk; committed and retired. NF = 32: m64n64 (all keys of a tile), 16: m64n32 (half).
template <int NF>
__device__ __forceinline__ void s_wgmma(float (&d)[NF], uint64_t dq, uint64_t dk) {
    static_assert(NF == 32 || NF == 16, "m64n64 or m64n32");
#pragma unroll
    for (int e = 0; e < NF; ++e) d[e] = 0.f;
    reg_fence_all(d);
    wgmma_fence();
#pragma unroll
    for (int m = 0; m < DQK / 64; ++m)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const uint64_t off = static_cast<uint64_t>((m * BLK + 32 * kk) >> 4);
            if constexpr (NF == 32) wgmma_m64n64k16(d, dq + off, dk + off);
            else wgmma_m64n32k16(d, dq + off, dk + off);
        }
    wgmma_commit();
    reg_fence_all(d);
    wgmma_retire(d);
}
#endif

}  // namespace va

// Launch constants, read by kdt/launch/verify_attn.py through module.get_global.
extern "C" __constant__ int kdt_verify_attn_threads = va::THREADS;
extern "C" __constant__ int kdt_verify_attn_rows = va::ROWS;
extern "C" __constant__ int kdt_verify_attn_kv_tile = va::KV_T;
extern "C" __constant__ int kdt_verify_attn_smem_bytes = va::SMEM_BYTES;
extern "C" __constant__ int kdt_verify_attn_dqk = va::DQK;
extern "C" __constant__ int kdt_verify_attn_dv = va::DV;
extern "C" __constant__ int kdt_verify_attn_page = va::PAGE;
extern "C" __constant__ int kdt_verify_attn_combine_threads = va::COMBINE_THREADS;
extern "C" __constant__ int kdt_verify_attn_combine_rows = va::COMBINE_ROWS;
// 1 when S = Q K^T (and, with WG_PV, P V) runs on wgmma (a cubin built for sm_90a), else 0 (mma.sync);
// informational only: both paths have the same entry points, launch shape and smem size.
extern "C" __constant__ int kdt_verify_attn_wgmma = va::WG_S ? 1 : 0;

// ---------------------------------------------------------------------------------------------------------
// Main kernel. grid (ceil(N*H/64), G, num_splits), block 256, dynamic smem kdt_verify_attn_smem_bytes.
// num_splits == 1: writes out / lse. num_splits > 1: writes part_o [S][G][Rpad][512] (normalised) and
// part_lse [S][G][Rpad] (natural log, -inf = no contribution), Rpad = gridDim.x * 64.
extern "C" __global__ void __launch_bounds__(va::THREADS, 1)
    kdt_verify_attn_fwd(const uint16_t* __restrict__ q, const uint16_t* __restrict__ kv_cache,
                        const int* __restrict__ block_table, const int* __restrict__ prefix_len,
                        const uint16_t* __restrict__ kv_tree, const uint32_t* __restrict__ mask,
                        const int* __restrict__ n_nodes, int G, int N, int H, int max_pages, int W,
                        float scale_log2e, int num_splits, int out_bf16, void* __restrict__ out,
                        float* __restrict__ lse, float* __restrict__ part_o, float* __restrict__ part_lse) {
    using namespace va;
    extern __shared__ __align__(1024) unsigned char smem[];  // 1 KB: wgmma swizzle atoms

    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int g = blockIdx.y;
    const int split = blockIdx.z;
    const int R = N * H;                                   // query rows of the request
    const int r0 = blockIdx.x * ROWS;                      // first row of this CTA
    const int Rpad = gridDim.x * ROWS;
    const int live = max(n_nodes[g] + 1, 0);
    const int active = min(live, N) * H;                   // rows r < active are computed
    const int plen = prefix_len[g];
    const int n_pref = (plen + KV_T - 1) / KV_T;           // prefix key tiles
    const int n_tiles = n_pref + (N + KV_T - 1) / KV_T;    // + tree key tiles
    const int per = (n_tiles + num_splits - 1) / num_splits;
    const int kb = split * per;
    const int ke = min(n_tiles, kb + per);

    if (r0 >= active || kb >= ke) {
        if (num_splits == 1) {
            // whole tile past n_nodes: out 0, lse -inf
            const int nrows = min(ROWS, R - r0);
            const size_t base = (static_cast<size_t>(g) * R + r0) * DV;
            if (out_bf16) {
                uint4* o = reinterpret_cast<uint4*>(static_cast<uint16_t*>(out) + base);
                for (int i = tid; i < nrows * (DV / 8); i += THREADS) o[i] = make_uint4(0u, 0u, 0u, 0u);
            } else {
                float4* o = reinterpret_cast<float4*>(static_cast<float*>(out) + base);
                for (int i = tid; i < nrows * (DV / 4); i += THREADS) o[i] = make_float4(0.f, 0.f, 0.f, 0.f);
            }
            if (tid < nrows) lse[static_cast<size_t>(g) * R + r0 + tid] = NEG_INF;
        } else if (r0 < active) {
            // this split has no key tile of the request: no contribution (the combine skips -inf)
            if (tid < ROWS && r0 + tid < R)
                part_lse[(static_cast<size_t>(split) * G + g) * Rpad + r0 + tid] = NEG_INF;
        }
        return;  // (inactive tiles with num_splits > 1: the combine kernel writes them)
    }

    const uint32_t sQ = smem_u32(smem);
    const uint32_t sKV = sQ + OFF_KV;
    const uint32_t sP = sQ + OFF_P;
    float* redmax = reinterpret_cast<float*>(smem + OFF_REDMAX);
    float* redl = reinterpret_cast<float*>(smem + OFF_REDL);
    float* alpha_s = reinterpret_cast<float*>(smem + OFF_ALPHA);
    float* invl_s = reinterpret_cast<float*>(smem + OFF_INVL);
    const int* bt_row = block_table + static_cast<size_t>(g) * max_pages;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (WG_PIPE) {
        // ================= sm_90a warp-specialised tile loop (see "WG_PIPE" in the header comment) =========
        const int gq = lane >> 2, cq = lane & 3;
        const int wg = warp >> 2;                     // 0: S + softmax + P V cols 0..255; 1: loads + P V 256..511
        const int rowA = 16 * (warp & 3) + gq;        // D-fragment rows of this thread (S and P V alike)
        const int rowB = rowA + 8;
        const int grA = r0 + rowA, grB = r0 + rowB;
        const bool split_mode = num_splits > 1;
        // mbarrier i at sBar + 8 i (MB_*); initialised here, published by the prologue's __syncthreads
        const uint32_t sBar = sQ + OFF_BAR;
        const uint32_t mb_pready = sBar + 8 * MB_PREADY, mb_full = sBar + 8 * MB_FULL, mb_sdone = sBar + 8 * MB_SDONE;
        if (tid == 0) {
#pragma unroll
            for (int i = 0; i < PIPE_MBARS; ++i)
                mbar_init(sBar + 8 * i, (i >= MB_EMPTY && i < MB_SDONE) ? MB_EMPTY_ARRIVALS : MB_HANDOFF_ARRIVALS);
        }

        // ---- prologue: Q + tile kb (all threads), tile kb+1 (WG1, its own cp.async group, left in flight)
        {
            constexpr int TPR = THREADS / ROWS;
            const int row = tid / TPR;
            const bool valid = r0 + row < active;
            const uint16_t* src = valid ? q + (static_cast<size_t>(g) * R + r0 + row) * DQK : q;
            load_rows<ROWS>(sQ, src, valid);
        }
        load_kv_tile(sKV, kb, kb < n_pref ? __ldg(bt_row + (kb * KV_T) / PAGE) : 0, n_pref, plen, N, g, kv_cache,
                     kv_tree);
        cp_async_commit();
        if (wg == 1 && kb + 1 < ke) {
            load_kv_tile_wg1(sKV + KV_TILE_BYTES, kb + 1, kb + 1 < n_pref ? __ldg(bt_row + ((kb + 1) * KV_T) / PAGE) : 0,
                             n_pref, plen, N, g, kv_cache, kv_tree);
            cp_async_commit();
            cp_async_wait_1();
        } else {
            cp_async_wait_all();
        }
        fence_proxy_async();  // this thread's cp.async writes (Q, tile kb) -> visible to wgmma (async proxy)
        __syncthreads();      // Q and tile kb in smem for everyone; the mbarriers are initialised

        float o[O_NT][4];     // m64n256 D fragment: o[j][e] = row rowA (e < 2) / rowB, column 256 wg + 8j + 2cq + (e&1)
#pragma unroll
        for (int j = 0; j < O_NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
        // P V of tile k for this warpgroup's 256 value columns: A = P_k (column block P_BLK of the tile), B = V
        // = column blocks 4wg..4wg+3 of the tile. Synchronous per warpgroup (pv_wait).
        auto pv_tile = [&](uint32_t tile) {
            pv_wgmma(o, tile + static_cast<uint32_t>(P_BLK * BLK),
                     tile + static_cast<uint32_t>(wg * (PV_WG_N / 64) * BLK));
        };
        auto pv_wait = [&]() { wgmma_retire(o); };

        if (wg == 0) {
            // ---- WG0: S = Q K^T (m64n64, all keys, all of Dqk), online softmax, P, its half of P V
            const bool actA = grA < active, actB = grB < active;
            float mA = NEG_INF, mB = NEG_INF;  // running max (scaled, log2 units)
            float lA = 0.f, lB = 0.f;          // partial row sums over this thread's columns
            const uint64_t dq = wgmma_desc_sw128(sQ);
            for (int k = kb; k < ke; ++k) {
                const int it = k - kb;
                const uint32_t tile = sKV + static_cast<uint32_t>((it & 1) * KV_TILE_BYTES);
                // tile k landed (WG1 waited + fenced its cp.async): FULL phase it-1 (WG1 arrives in each of its
                // iterations with k + 1 < ke, i.e. 0..n-2 of the split's n tiles: phase j in iteration j)
                if (it > 0) mbar_wait(mb_full, (it - 1) & 1);

                // tree tile: mask bits of keys j0..j0+63 for rows rowA / rowB (issued before S: latency hidden)
                const bool tree = k >= n_pref;
                const int j0 = (k - n_pref) * KV_T;
                uint64_t wA = 0u, wB = 0u;
                if (tree && j0 < N) {
                    const uint32_t* mrow = mask + static_cast<size_t>(g) * N * W + (j0 >> 5);
                    const bool two = (j0 >> 5) + 1 < W;  // keys j0+32.. exist (W = ceil(N / 32))
                    if (actA) {
                        const uint32_t* m = mrow + (grA / H) * W;
                        wA = __ldg(m) | (two ? static_cast<uint64_t>(__ldg(m + 1)) << 32 : 0u);
                    }
                    if (actB) {
                        const uint32_t* m = mrow + (grB / H) * W;
                        wB = __ldg(m) | (two ? static_cast<uint64_t>(__ldg(m + 1)) << 32 : 0u);
                    }
                }

                // S (64 rows x 64 keys): 36 wgmma.m64n64k16 over the 9 column blocks x 4 k16 steps; Q and K both
                // K-major 128-byte swizzle. d[4nt + e] = row rowA (e < 2) / rowB, key 8nt + 2cq + (e & 1).
                float d[4 * PIPE_NT];
                s_wgmma(d, dq, wgmma_desc_sw128(tile));
                // P_k overwrites the rope block of tile k, which every warp's share of the S wgmma reads (all 64
                // key rows): all four warps must be past their wait first.
                mbar_arrive(mb_sdone);
                mbar_wait(mb_sdone, it & 1);

                // scale, mask, row max: a thread holds 16 keys of each of its two rows, a quad holds the whole
                // row (no cross-warp exchange); valid keys c < lim (+ mask bit on tree)
                float mxA, mxB;
                scale_mask_rowmax<PIPE_NT>(d, cq, tree ? N - j0 : plen - k * KV_T, tree, wA, wB, scale_log2e, mxA,
                                           mxB);
                float muA, muB;
                const float alA = move_max(mA, mxA, muA), alB = move_max(mB, mxB, muB);

                // P = exp2(s - m) -> bf16 into the rope block of tile k (64 rows x 128 B, chunk c of row r at
                // c ^ (r & 7): the K-major 128-byte swizzle atom layout the P V wgmma reads); row sums in fp32
                const uint32_t pst = tile + static_cast<uint32_t>(P_BLK * BLK + rowA * TROW + 4 * cq);
                const int pz = rowA & 7;  // rowB = rowA + 8: same swizzle
                float sumA = 0.f, sumB = 0.f;
#pragma unroll
                for (int nt = 0; nt < PIPE_NT; ++nt) {
                    const float p0 = ex2(d[4 * nt + 0] - muA), p1 = ex2(d[4 * nt + 1] - muA);
                    const float p2 = ex2(d[4 * nt + 2] - muB), p3 = ex2(d[4 * nt + 3] - muB);
                    sumA += p0 + p1;
                    sumB += p2 + p3;
                    const uint32_t pa = pst + static_cast<uint32_t>((nt ^ pz) << 4);
                    sts32(pa, pack_bf16(p0, p1));
                    sts32(pa + 8 * TROW, pack_bf16(p2, p3));
                }
                lA = lA * alA + sumA;
                lB = lB * alB + sumB;
                if (cq == 0) {  // WG1 rescales its O columns with the same alpha (read after PREADY)
                    alpha_s[rowA] = alA;
                    alpha_s[rowB] = alB;
                }
                fence_proxy_async();  // this thread's P stores (generic proxy) -> visible to P V wgmma (async)
                mbar_arrive(mb_pready);  // release: P_k and alpha_k (PREADY phase it)

                rescale_rows(o, alA, alB);  // this warpgroup's previous P V has retired (pv_wait below)
                pv_tile(tile);
                pv_wait();
                // WG1 refills this buffer with tile k+2 once both warpgroups' P V of tile k retired (release:
                // also orders this thread's P_k stores before the cp.async overwrite of the rope block)
                if (k + 2 < ke) mbar_arrive(sBar + 8 * (MB_EMPTY + (it & 1)));
            }
            // row sums -> 1 / l and lse (WG0 alone holds the running max and every tile's row sums)
            lA += __shfl_xor_sync(0xffffffffu, lA, 1);
            lA += __shfl_xor_sync(0xffffffffu, lA, 2);
            lB += __shfl_xor_sync(0xffffffffu, lB, 1);
            lB += __shfl_xor_sync(0xffffffffu, lB, 2);
            if (cq == 0) {
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int row = half ? rowB : rowA;
                    const int gr = half ? grB : grA;
                    const bool act = half ? actB : actA;
                    const float m = half ? mB : mA;
                    const float L = half ? lB : lA;
                    finish_row(row, gr, act, m, L, invl_s, R, g, G, Rpad, split, split_mode, lse, part_lse);
                }
            }
        } else {
            // ---- WG1: key tile loads (tile k+2 into tile k's buffer), its half of P V
            int page2 = kb + 2 < n_pref ? __ldg(bt_row + ((kb + 2) * KV_T) / PAGE) : 0;
            for (int k = kb; k < ke; ++k) {
                const int it = k - kb;
                const uint32_t tile = sKV + static_cast<uint32_t>((it & 1) * KV_TILE_BYTES);
                mbar_wait(mb_pready, it & 1);  // P_k, alpha_k in smem (WG0 fenced its P stores)
                // read alpha before the FULL arrive below: WG0 writes alpha_{k+1} only after its FULL wait
                rescale_rows(o, alpha_s[rowA], alpha_s[rowB]);
                pv_tile(tile);
                if (k + 1 < ke) {
                    // tile k+1 (the only cp.async group in flight) -> visible to WG0's S wgmma; waited while
                    // this warpgroup's P V runs
                    cp_async_wait_all();
                    fence_proxy_async();
                    mbar_arrive(mb_full);  // release: tile k+1, and this thread's alpha_k read (FULL phase it)
                }
                pv_wait();
                if (k + 2 < ke) {
                    // every P V read of tile k retired (this thread's just now, the other WG1 warps' and WG0's
                    // when EMPTY[it & 1] completes); it completes once per use of the buffer, i.e. for the
                    // (it >> 1)-th time at tile it
                    const uint32_t mb_empty = sBar + 8 * (MB_EMPTY + (it & 1));
                    mbar_arrive(mb_empty);
                    mbar_wait(mb_empty, (it >> 1) & 1);
                    load_kv_tile_wg1(tile, k + 2, page2, n_pref, plen, N, g, kv_cache, kv_tree);
                    cp_async_commit();
                    page2 = k + 3 < n_pref ? __ldg(bt_row + ((k + 3) * KV_T) / PAGE) : 0;
                }
            }
        }
        __syncthreads();  // invl_s (WG0) -> both warpgroups

        // ---- store O / l: this thread's rows rowA / rowB, columns 256 wg + 8j + 2cq (+1)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = half ? rowB : rowA;
            const int gr = r0 + row;
            if (gr >= R) continue;
            const float inv = invl_s[row];
            const size_t obase = split_mode ? ((static_cast<size_t>(split) * G + g) * Rpad + gr) * DV
                                            : (static_cast<size_t>(g) * R + gr) * DV;
#pragma unroll
            for (int j = 0; j < O_NT; ++j) {
                const int col = PV_WG_N * wg + 8 * j + 2 * cq;
                // inv == 0 (row past n_nodes / no key): +0, never -0 (the contract's zero rows)
                const float v0 = inv != 0.f ? o[j][2 * half] * inv : 0.f;
                const float v1 = inv != 0.f ? o[j][2 * half + 1] * inv : 0.f;
                if (split_mode) {
                    *reinterpret_cast<float2*>(part_o + obase + col) = make_float2(v0, v1);
                } else if (out_bf16) {
                    *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(out) + obase + col) = pack_bf16(v0, v1);
                } else {
                    *reinterpret_cast<float2*>(static_cast<float*>(out) + obase + col) = make_float2(v0, v1);
                }
            }
        }
        return;
    }
#endif

    // ---- prologue: Q tile + first key tile in one cp.async group
    {
        constexpr int TPR = THREADS / ROWS;
        const int row = tid / TPR;
        const bool valid = r0 + row < active;
        const uint16_t* src = valid ? q + (static_cast<size_t>(g) * R + r0 + row) * DQK : q;
        load_rows<ROWS>(sQ, src, valid);
    }
    int page_next = kb < n_pref ? __ldg(bt_row + (kb * KV_T) / PAGE) : 0;
    load_kv_tile(sKV, kb, page_next, n_pref, plen, N, g, kv_cache, kv_tree);
    cp_async_commit();
    page_next = kb + 1 < n_pref ? __ldg(bt_row + ((kb + 1) * KV_T) / PAGE) : 0;

    // ---- per-lane roles and ldmatrix addresses
    const int gq = lane >> 2;         // mma group id: fragment rows gq, gq+8
    const int cq = lane & 3;          // thread in group: fragment columns 2cq, 2cq+1
    const int r7 = lane & 7;          // row & 7 of the ldmatrix row this lane addresses (all bases are 8-aligned)
    const int hi16 = lane >> 4;       // lanes 16..31 address matrices 2,3
    const int hi8 = (lane >> 3) & 1;  // lanes 8..15 / 24..31 address matrices 1,3

    // S role: after S (and the split-D exchange) this warp owns rows own0..own0+15, keys TW*s_cg..+TW
    //   WG_S: warpgroup s_cg = warp / 4 computes keys 32*s_cg..+32 for all 64 rows; the wgmma D fragment
    //   gives warp w rows 16*(w % 4)..+16 (no split-D exchange).
    const int s_cg = WG_S ? warp >> 2 : warp % S_WN;
    const int s_dh = warp >> 2;                    // SPLIT_D: which half of the k16 steps
    const int s_rg = SPLIT_D ? (warp >> 1) & 1 : WG_S ? (warp & 3) : warp / S_WN;  // 32-row / 16-row group
    const int own0 = SPLIT_D ? 32 * s_rg + 16 * s_dh : 16 * s_rg;
    const int rowA = own0 + gq;       // fragment rows of this thread in the CTA tile
    const int rowB = rowA + 8;
    const int grA = r0 + rowA, grB = r0 + rowB;
    const bool actA = grA < active, actB = grB < active;

    // A (Q, 16 rows x k16): matrix 0 rows 0-7 / k 0-7, 1 rows 8-15 / k 0-7, 2 rows 0-7 / k 8-15, 3 rows 8-15 / k 8-15
    // -> lane addresses row (lane & 15), chunk 2*ks + hi16. With ks = 4*m + u the swizzled chunk is
    //    8*m + ((2u + hi16) ^ r7): per-lane offsets for u = 0..3, + 128*m bytes as an immediate.
    // B (K, keys as n, dims as k; non-transposed): matrices (ntile 0, k 0-7), (ntile 0, k 8-15),
    //    (ntile 1, k 0-7), (ntile 1, k 8-15) -> lane addresses key 8*hi16 + r7, chunk 2*ks + hi8.
    //    SPLIT_D: ks = 2j + dh, so chunk 2ks + hi = 4j + 2dh + hi and the swizzled chunk is
    //    8*(j>>1) + ((4*(j&1) + 2dh) ^ (hi ^ r7)): two per-lane offsets (j even / odd), + 128*(j>>1) immediate.
    uint32_t qaddr[4], kaddr[4];
    if constexpr (WG_S) {
#pragma unroll
        for (int v = 0; v < 4; ++v) qaddr[v] = kaddr[v] = 0u;  // S by wgmma descriptors (see the S phase)
    } else if constexpr (SPLIT_D) {
#pragma unroll
        for (int v = 0; v < 2; ++v) {
            qaddr[v] = sQ + static_cast<uint32_t>((32 * s_rg + (lane & 15)) * ROW_BYTES +
                                                  (((4 * v + 2 * s_dh) ^ (hi16 ^ r7)) << 4));
            kaddr[v] = sKV + static_cast<uint32_t>((TW * s_cg + 8 * hi16 + r7) * ROW_BYTES +
                                                   (((4 * v + 2 * s_dh) ^ (hi8 ^ r7)) << 4));
            qaddr[v + 2] = kaddr[v + 2] = 0u;
        }
    } else {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            qaddr[u] = sQ + static_cast<uint32_t>((16 * s_rg + (lane & 15)) * ROW_BYTES + (((2 * u + hi16) ^ r7) << 4));
            const int key = TW * s_cg + (NT >= 2 ? 8 * hi16 : 0) + r7;
            kaddr[u] = sKV + static_cast<uint32_t>(key * ROW_BYTES + (((2 * u + hi8) ^ r7) << 4));
        }
    }
    // PV role (mma.sync P V; WG_PV reads P and V through descriptors instead): warp owns value columns
    //    DV_W*warp.., all ROWS rows.
    // A (P, 16 rows x k16 keys): lane addresses row 16*mt + (lane & 15), chunk 2*kk + hi16 (swizzled by pswz,
    //    which depends on lane & 15 only). B (V, keys as k, value columns as n; transposed): matrices
    //    (keys 0-7, ntile 0), (keys 8-15, ntile 0), (keys 0-7, ntile 1), (keys 8-15, ntile 1) -> lane addresses
    //    key 8*hi8 + r7, chunk DV_W/8*warp + 2*np + hi16, swizzled by key & 7 = r7.
    //    Both use the lane offsets xo[v] = ((2v + hi16) ^ r7) * 16 (P: v = kk, when P rows are 8 chunks).
    static_assert(PV_NP <= 4 && KSTEPS_PV <= 4, "lane offset table");
    uint32_t xo[4];
#pragma unroll
    for (int v = 0; v < 4; ++v) xo[v] = static_cast<uint32_t>(((2 * v + hi16) ^ r7) << 4);
    const uint32_t pbase = sP + static_cast<uint32_t>((lane & 15) * P_ROW_BYTES);
    const uint32_t vbase = sKV + static_cast<uint32_t>((8 * hi8 + r7) * TROW + warp * BLK);
    // P stores of the S role: row rowA (rowB = rowA + 8 has the same swizzle), column TW*s_cg + 8*nt + 2*cq
    // -> chunk (TW/8)*s_cg + nt
    const uint32_t pst = sP + static_cast<uint32_t>(rowA * P_ROW_BYTES + 4 * cq);
    const int pz = pswz(rowA);

    float o[O_NT][4];  // see O_NT for the (row, column) of each register on either P V path
#pragma unroll
    for (int j = 0; j < O_NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
    float mA = NEG_INF, mB = NEG_INF;  // running max (scaled, log2 units) of rows rowA / rowB
    float lA = 0.f, lB = 0.f;          // partial row sums over this warp's columns

    for (int k = kb; k < ke; ++k) {
        const int it = k - kb;
        const int buf = STAGES == 2 ? (it & 1) : 0;
        if (STAGES == 1 && it > 0) {
            __syncthreads();  // everyone is done with the previous tile
            load_kv_tile(sKV, k, page_next, n_pref, plen, N, g, kv_cache, kv_tree);
            cp_async_commit();
            page_next = k + 1 < n_pref ? __ldg(bt_row + ((k + 1) * KV_T) / PAGE) : 0;
        }
        cp_async_wait_all();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        fence_proxy_async();  // this thread's cp.async writes (Q, tile k) -> visible to wgmma (async proxy)
#endif
        __syncthreads();  // B0: tile k visible to all; all warps are past tile k-1
        if (STAGES == 2 && k + 1 < ke) {
            load_kv_tile(sKV + static_cast<uint32_t>((buf ^ 1) * KV_TILE_BYTES), k + 1, page_next, n_pref, plen, N,
                         g, kv_cache, kv_tree);
            cp_async_commit();
            page_next = k + 2 < n_pref ? __ldg(bt_row + ((k + 2) * KV_T) / PAGE) : 0;
        }
        const uint32_t kvoff = static_cast<uint32_t>(buf * KV_TILE_BYTES);

        // tree tile: this warp's mask word for its two rows (issued before the S loop to hide latency)
        const bool tree = k >= n_pref;
        const int j0 = (k - n_pref) * KV_T + TW * s_cg;  // first tree slot of this warp's keys
        uint32_t wA = 0u, wB = 0u;
        if (tree && j0 < N) {
            const uint32_t* mrow = mask + static_cast<size_t>(g) * N * W + (j0 >> 5);
            if (actA) wA = __ldg(mrow + (grA / H) * W) >> (j0 & 31);
            if (actB) wB = __ldg(mrow + (grB / H) * W) >> (j0 & 31);
        }

        // ---- S = Q K^T (fp32): s[nt][*] = rows rowA / rowB x keys TW*s_cg + 8*nt + 2*cq + {0,1}
        float s[NT][4];
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        if constexpr (WG_S) {
            // warpgroup s_cg: D (64 rows x keys 32*s_cg..+32) = sum over the 9 column blocks m and k16 steps kk
            // of Q[:, 64m + 16kk..] K[32 s_cg.., 64m + 16kk..]^T; both operands K-major 128-byte swizzle.
            float d[16];
            s_wgmma(d, wgmma_desc_sw128(sQ), wgmma_desc_sw128(sKV + kvoff + static_cast<uint32_t>(32 * s_cg * 128)));
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = d[4 * nt + e];
        } else
#endif
        if constexpr (SPLIT_D) {
            float acc[2][NT][4];  // 32 rows (m-tiles 0,1) x 32 keys, partial over this warp's k16 steps
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
#pragma unroll
            for (int j = 0; j < DQK / 32; ++j) {
                uint32_t a[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
                    ldsm_x4(qaddr[j & 1] + (j >> 1) * 128 + mt * 16 * ROW_BYTES, a[mt][0], a[mt][1], a[mt][2],
                            a[mt][3]);
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4(kaddr[j & 1] + kvoff + (j >> 1) * 128 + np * 16 * ROW_BYTES, b0, b1, b2, b3);
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) {
                        mma_bf16(acc[mt][2 * np], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
                        mma_bf16(acc[mt][2 * np + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
                    }
                }
            }
            // Exchange with warp w ^ 4 (same rows and keys, other half of the dims) through 2 KB of the P
            // buffer (free: every warp is past PV of the previous tile). Slot (nt, lane) holds one lane's 4
            // accumulators of an n-tile: the partner lane holds the same (row, key) elements, so slots are
            // lane-private (no bank conflicts, read-then-overwrite in place needs no barrier).
            float4* xch = reinterpret_cast<float4*>(smem + OFF_P + (warp & 3) * 2048) + lane;
            const int pair_bar = 1 + (warp & 3);
            if (s_dh == 1) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    xch[32 * nt] = make_float4(acc[0][nt][0], acc[0][nt][1], acc[0][nt][2], acc[0][nt][3]);
            }
            named_barrier(pair_bar, 64);
            if (s_dh == 0) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const float4 v = xch[32 * nt];
                    acc[0][nt][0] += v.x;
                    acc[0][nt][1] += v.y;
                    acc[0][nt][2] += v.z;
                    acc[0][nt][3] += v.w;
                    xch[32 * nt] = make_float4(acc[1][nt][0], acc[1][nt][1], acc[1][nt][2], acc[1][nt][3]);
                }
            }
            named_barrier(pair_bar, 64);
            if (s_dh == 1) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const float4 v = xch[32 * nt];
                    acc[1][nt][0] += v.x;
                    acc[1][nt][1] += v.y;
                    acc[1][nt][2] += v.z;
                    acc[1][nt][3] += v.w;
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = s_dh ? acc[1][nt][e] : acc[0][nt][e];
        } else {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
            for (int m = 0; m < DQK / 64; ++m) {
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    uint32_t a0, a1, a2, a3;
                    ldsm_x4(qaddr[u] + m * 128, a0, a1, a2, a3);
                    if constexpr (NT == 1) {
                        uint32_t b0, b1;
                        ldsm_x2(kaddr[u] + kvoff + m * 128, b0, b1);
                        mma_bf16(s[0], a0, a1, a2, a3, b0, b1);
                    } else {
#pragma unroll
                        for (int np = 0; np < NT / 2; ++np) {
                            uint32_t b0, b1, b2, b3;
                            ldsm_x4(kaddr[u] + kvoff + np * 16 * ROW_BYTES + m * 128, b0, b1, b2, b3);
                            mma_bf16(s[2 * np], a0, a1, a2, a3, b0, b1);
                            mma_bf16(s[2 * np + 1], a0, a1, a2, a3, b2, b3);
                        }
                    }
                }
            }
        }

        // ---- scale, mask, row max: valid columns c (0..TW-1 of this warp): prefix c < lim; tree c < lim and
        // mask bit c
        float mxA, mxB;
        scale_mask_rowmax<NT>(s, cq, tree ? N - j0 : plen - k * KV_T - TW * s_cg, tree, wA, wB, scale_log2e, mxA,
                              mxB);
        if (cq == 0) {
            redmax[rowA * S_WN + s_cg] = mxA;
            redmax[rowB * S_WN + s_cg] = mxB;
        }
        if constexpr (SPLIT_D)
            __syncthreads();  // B1: row maxima; also every exchange is read before P overwrites the buffer
        else if constexpr (WG_S)
            named_barrier(1 + s_rg, 64);  // B1: warps w and w + 4 share rows 16*(w % 4)..+16
        else
            named_barrier(1 + s_rg, S_WN * 32);  // B1: the S_WN warps sharing rows 16*s_rg..+16
#pragma unroll
        for (int w = 0; w < S_WN; ++w) {
            mxA = fmaxf(mxA, redmax[rowA * S_WN + w]);
            mxB = fmaxf(mxB, redmax[rowB * S_WN + w]);
        }
        float muA, muB;
        const float alA = move_max(mA, mxA, muA), alB = move_max(mB, mxB, muB);

        // ---- P = exp2(s - m) -> bf16 smem; partial row sums in fp32
        float sumA = 0.f, sumB = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const float p0 = ex2(s[nt][0] - muA), p1 = ex2(s[nt][1] - muA);
            const float p2 = ex2(s[nt][2] - muB), p3 = ex2(s[nt][3] - muB);
            sumA += p0 + p1;
            sumB += p2 + p3;
            const int chunk = (TW / 8) * s_cg + nt;
            const uint32_t pa = pst + static_cast<uint32_t>((chunk ^ pz) << 4);
            sts32(pa, pack_bf16(p0, p1));
            sts32(pa + 8 * P_ROW_BYTES, pack_bf16(p2, p3));
        }
        lA = lA * alA + sumA;
        lB = lB * alB + sumB;
        if constexpr (WG_PV) {
            // O rows of this thread = rowA / rowB (the D fragment of m64n256 and of the S wgmma agree), so alpha
            // is already in registers. The previous P V wgmma has retired (wgmma_wait0 below), so the
            // accumulators can be scaled here, before B2.
            rescale_rows(o, alA, alB);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
            fence_proxy_async();  // this thread's P stores (generic proxy) -> visible to the P V wgmma (async proxy)
#endif
        } else if (s_cg == 0 && cq == 0) {
            alpha_s[rowA] = alA;
            alpha_s[rowB] = alB;
        }
        __syncthreads();  // B2: P (and alpha) of tile k visible to every warp

        // ---- O += P V
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        if constexpr (WG_PV) {
            // warpgroup s_cg: O[:, PV_WG_N*s_cg..+PV_WG_N] += P (64 x KV_T) V (KV_T x PV_WG_N), KV_T/16 k16 steps.
            //   A = P: K-major 128-byte swizzle (the layout of the P stores above: row r at 128r, chunk c at
            //     c ^ (r & 7)); k16 step kk at +32*kk bytes (inside the 128-byte row, as for Q / K in S).
            //   B = V: column blocks 4*s_cg..+4 of the key tile, MN-major: LBO = BLK (8192 B, next 64 value
            //     columns), SBO = 8*TROW (1024 B, next 8 keys); k16 step kk at +16*TROW = 2048 bytes.
            pv_wgmma(o, sP, sKV + kvoff + static_cast<uint32_t>(s_cg * (PV_WG_N / 64) * BLK));
            // retire before B0 of the next tile: after it, tile k's buffer is refilled (cp.async) and P is
            // overwritten by the other warpgroup, both read by this wgmma
            wgmma_retire(o);
        } else
#endif
        {
            // ---- mma.sync: O = O * alpha + P V (64 rows x DV_W columns per warp)
            // the running max rarely moves after the first tiles: skip the 128 multiplies when alpha == 1
            float aA[MT], aB[MT];
            bool rescale = false;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                aA[mt] = alpha_s[16 * mt + gq];
                aB[mt] = alpha_s[16 * mt + gq + 8];
                rescale |= (aA[mt] != 1.f) | (aB[mt] != 1.f);
            }
            if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                    for (int nt = 0; nt < 2 * PV_NP; ++nt) {
                        o[2 * PV_NP * mt + nt][0] *= aA[mt];
                        o[2 * PV_NP * mt + nt][1] *= aA[mt];
                        o[2 * PV_NP * mt + nt][2] *= aB[mt];
                        o[2 * PV_NP * mt + nt][3] *= aB[mt];
                    }
                }
            }
#pragma unroll
            for (int kk = 0; kk < KSTEPS_PV; ++kk) {
                uint32_t a[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    ldsm_x4(pbase + mt * 16 * P_ROW_BYTES +
                                (P_CHUNKS == 8 ? xo[kk]
                                               : static_cast<uint32_t>(((2 * kk + hi16) ^ pswz(lane & 15)) << 4)),
                            a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
#pragma unroll
                for (int np = 0; np < PV_NP; ++np) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4_t(vbase + xo[np] + kvoff + kk * 16 * TROW, b0, b1, b2, b3);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        mma_bf16(o[2 * PV_NP * mt + 2 * np], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
                        mma_bf16(o[2 * PV_NP * mt + 2 * np + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
                    }
                }
            }
        }
    }

    // ---- epilogue: full row sums, 1/l, lse
    lA += __shfl_xor_sync(0xffffffffu, lA, 1);
    lA += __shfl_xor_sync(0xffffffffu, lA, 2);
    lB += __shfl_xor_sync(0xffffffffu, lB, 1);
    lB += __shfl_xor_sync(0xffffffffu, lB, 2);
    if (cq == 0) {
        redl[rowA * S_WN + s_cg] = lA;
        redl[rowB * S_WN + s_cg] = lB;
    }
    __syncthreads();
    const bool split_mode = num_splits > 1;
    if (s_cg == 0 && cq == 0) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = half ? rowB : rowA;
            const int gr = half ? grB : grA;
            const bool act = half ? actB : actA;
            const float m = half ? mB : mA;
            float L = 0.f;
#pragma unroll
            for (int w = 0; w < S_WN; ++w) L += redl[row * S_WN + w];
            finish_row(row, gr, act, m, L, invl_s, R, g, G, Rpad, split, split_mode, lse, part_lse);
        }
    }
    __syncthreads();

    // ---- store O / l
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = (WG_PV ? own0 : 16 * mt) + gq + 8 * half;
            const int gr = r0 + row;
            if (gr >= R) continue;
            const float inv = invl_s[row];
            const size_t obase = split_mode ? ((static_cast<size_t>(split) * G + g) * Rpad + gr) * DV
                                            : (static_cast<size_t>(g) * R + gr) * DV;
#pragma unroll
            for (int nt = 0; nt < 2 * PV_NP; ++nt) {
                const int j = 2 * PV_NP * mt + nt;  // O tile (see O_NT)
                const int col = (WG_PV ? PV_WG_N * s_cg + 8 * j : DV_W * warp + 8 * nt) + 2 * cq;
                // inv == 0 (row past n_nodes / no key): +0, never -0 (the contract's zero rows)
                const float v0 = inv != 0.f ? o[j][2 * half] * inv : 0.f;
                const float v1 = inv != 0.f ? o[j][2 * half + 1] * inv : 0.f;
                if (split_mode) {
                    *reinterpret_cast<float2*>(part_o + obase + col) = make_float2(v0, v1);
                } else if (out_bf16) {
                    *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(out) + obase + col) = pack_bf16(v0, v1);
                } else {
                    *reinterpret_cast<float2*>(static_cast<float*>(out) + obase + col) = make_float2(v0, v1);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Split combine. grid (ceil(N*H/COMBINE_ROWS), G), block 256: COMBINE_WARPS_PER_ROW warps per query row, each
// owning DV / COMBINE_WARPS_PER_ROW value columns (one float4 per lane).  The split weights are computed
// first, so the loads of the partial rows are independent of each other and COMBINE_UNROLL of them are in
// flight per lane: the partials were just written by the main kernel and mostly come from L2, where a
// one-load-at-a-time loop would be latency-bound.  Every workspace word read here was written by this
// launch's main kernel (partial O only where its lse is finite), so nothing needs zeroing afterwards.
extern "C" __global__ void __launch_bounds__(va::COMBINE_THREADS)
    kdt_verify_attn_combine(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                            const int* __restrict__ n_nodes, int G, int N, int H, int num_splits, int Rpad,
                            int out_bf16, void* __restrict__ out, float* __restrict__ lse) {
    using namespace va;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int g = blockIdx.y;
    const int r = blockIdx.x * COMBINE_ROWS + warp / COMBINE_WARPS_PER_ROW;
    const int col = 4 * (lane + 32 * (warp % COMBINE_WARPS_PER_ROW));
    const int R = N * H;
    if (r >= R) return;
    const int active = min(max(n_nodes[g] + 1, 0), N) * H;
    const size_t split_stride = static_cast<size_t>(G) * Rpad;    // rows between two splits of one row
    const float* row_lse = part_lse + static_cast<size_t>(g) * Rpad + r;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float lse_out = NEG_INF;
    if (r < active) {
        float mx = NEG_INF;
        for (int s = lane; s < num_splits; s += 32) mx = fmaxf(mx, row_lse[s * split_stride]);
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
        if (mx != NEG_INF) {
            float den = 0.f;
            for (int s = lane; s < num_splits; s += 32) den += expf(row_lse[s * split_stride] - mx);
#pragma unroll
            for (int d = 16; d > 0; d >>= 1) den += __shfl_xor_sync(0xffffffffu, den, d);
            const float inv_den = 1.f / den;
            const float4* src = reinterpret_cast<const float4*>(part_o + (static_cast<size_t>(g) * Rpad + r) * DV + col);
            const size_t src_stride = split_stride * (DV / 4);
            for (int s0 = 0; s0 < num_splits; s0 += 32) {
                // lane j holds the weight of split s0 + j; 0 for an empty split (lse -inf), whose partial O
                // was never written this launch: it is still loaded (in bounds), but the select drops it
                const int s_lane = s0 + lane;
                const float ls = s_lane < num_splits ? row_lse[s_lane * split_stride] : NEG_INF;
                const float w_lane = ls != NEG_INF ? expf(ls - mx) * inv_den : 0.f;
                const int count = min(32, num_splits - s0);
                for (int j0 = 0; j0 < count; j0 += COMBINE_UNROLL) {
                    float4 v[COMBINE_UNROLL];
#pragma unroll
                    for (int u = 0; u < COMBINE_UNROLL; ++u)     // all loads first: COMBINE_UNROLL in flight
                        v[u] = j0 + u < count ? __ldcs(src + (s0 + j0 + u) * src_stride) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                    for (int u = 0; u < COMBINE_UNROLL; ++u) {
                        const float w = __shfl_sync(0xffffffffu, w_lane, (j0 + u) & 31);
                        if (j0 + u < count && w != 0.f) {
                            acc.x = fmaf(w, v[u].x, acc.x);
                            acc.y = fmaf(w, v[u].y, acc.y);
                            acc.z = fmaf(w, v[u].z, acc.z);
                            acc.w = fmaf(w, v[u].w, acc.w);
                        }
                    }
                }
            }
            lse_out = mx + logf(den);
        }
    }
    const size_t orow = static_cast<size_t>(g) * R + r;
    if (out_bf16) {
        uint2 v;
        v.x = pack_bf16(acc.x, acc.y);
        v.y = pack_bf16(acc.z, acc.w);
        *reinterpret_cast<uint2*>(static_cast<uint16_t*>(out) + orow * DV + col) = v;
    } else {
        *reinterpret_cast<float4*>(static_cast<float*>(out) + orow * DV + col) = acc;
    }
    if (lane == 0 && warp % COMBINE_WARPS_PER_ROW == 0) lse[orow] = lse_out;
}
