// kernels/verify_attn/config.cuh -- verify-attn's compile-time configuration: the MLA dims, the per-arch path and
// tile choice (ROWS query rows per CTA, KV_T keys per tile, STAGES key buffers), the smem layout (Q, key tiles,
// the S exchange, P, row stats, mbarriers), the warp layouts of the three mainloops, the mbarrier ids of the
// sm_90a pipeline, the combine's shape, and the static_asserts the code relies on. Used by both entry points
// (kdt_verify_attn_fwd, kdt_verify_attn_combine) and every header of the stage. Why each choice:
// plans/kernels/verify-attn.md, "Configuration".
#pragma once

#include <stdint.h>

#include "common/arch.cuh"

namespace va {

// ---- shapes (the launcher rejects others: kdt_verify_attn_dqk / kdt_verify_attn_dv)
constexpr int DQK = 576;                      // key dim (512 latent + 64 rope)
constexpr int DV = 512;                       // value dim (first DV columns of a key row)
constexpr int PAGE = 64;                      // kv_cache page size in tokens
constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int ROW_BYTES = DQK * 2;            // 1152 B per key / query row
constexpr int ROW_CHUNKS = ROW_BYTES / 16;    // 72 16-byte chunks per row

// ---- the path of each build (kdt_verify_attn_fwd; see the entry's header)
//   sm_90a: the warp-specialised wgmma pipeline (mainloop_wgmma.cuh), Q resident in smem, two 64-key buffers.
//   99 KB parts (sm_120, sm_8x): Q in registers, warp-specialised (mainloop_qreg.cuh): 32 query rows per CTA, a
//     ring of four 16-key buffers; a 64-row Q tile alone (72 KB) would leave room for one 16-key buffer.
//   other 227 KB parts (sm_90, sm_100): mma.sync with Q resident (mainloop_mma.cuh), two 64-key buffers.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr bool WGMMA = true;
#else
constexpr bool WGMMA = false;
#endif
#if defined(KDT_SMEM_99KB)
constexpr bool QREG = true;
constexpr int ROWS = 32;                      // query rows (slot, head) per CTA
constexpr int KV_T = 16;                      // keys per tile
constexpr int STAGES = 4;                     // key buffers: S on tile k+1, P V on tile k, tiles k+2, k+3 landing
#else
constexpr bool QREG = false;
constexpr int ROWS = 64;
constexpr int KV_T = 64;                      // one page
constexpr int STAGES = 2;                     // key buffers: tile k+1 lands while tile k is computed
#endif

// Q / key tile layout in smem. mma.sync: row-major rows of 1152 B (TROW), 16-byte chunk c of row r at chunk
// c ^ (r & 7) inside its group of 8 (BLK = 128 B between 64-column blocks). wgmma: the 128-byte swizzle layout,
// 64-column block m of a 64-row tile at m * 8192 B, row r at +128 r, chunk u at u ^ (r & 7) (TROW = 128,
// BLK = 8192). Both: byte offset of (row r, column block m, chunk u) = m*BLK + r*TROW + 16*(u^(r&7)).
constexpr int TROW = WGMMA ? 128 : ROW_BYTES;
constexpr int BLK = WGMMA ? 64 * 128 : 128;

// ---- mma.sync warp layouts (mainloop_mma.cuh and mainloop_qreg.cuh; see the note's "mma.sync mainloop" and
// "Q in registers")
// S = Q K^T. mainloop_mma (SPLIT_D, 64-key tiles): warp w = 4*dh + 2*rg + cg computes 32 rows x 32 keys over half
// the k16 steps (ks = 2j + dh) and adds the partner's half through smem. mainloop_qreg: S warp ds (warps 0-3)
// holds the Q fragments of all 32 rows for the k16 steps 4j + ds (QREG_KSTEPS of them) and computes the whole
// 32 x 16 tile over them, handing its partials to the P V warps 4-7 through the exchange buffer; P V warp 4 + mt
// sums m-tile mt (16 rows x 16 keys) and runs its softmax; every P V warp owns 128 value columns.
constexpr int S_WN = QREG ? 1 : 2;            // warps along the keys of a tile in the softmax (they share a row)
constexpr int TW = KV_T / S_WN;               // keys per softmax warp
constexpr bool SPLIT_D = KV_T == 64 && !WGMMA;
constexpr int NT = TW / 8;                    // 8-key n-tiles per S warp
constexpr int QREG_SLICES = 4;                // mainloop_qreg: k16 steps dealt round-robin to its 4 S warps
constexpr int QREG_KSTEPS = DQK / 16 / QREG_SLICES;   // 9: Q fragments per m-tile and warp (72 registers)
constexpr int S_WARPS = QREG ? QREG_SLICES : WARPS;   // warps computing S (mainloop_qreg: warps 0-3)
constexpr int PV_WARPS = WARPS - (QREG ? S_WARPS : 0);  // warps computing P V (mainloop_qreg: warps 4-7)
constexpr int MT = ROWS / 16;                 // 16-row m-tiles per PV warp (all rows)
constexpr int DV_W = DV / PV_WARPS;           // value columns per PV warp
constexpr int PV_NP = DV_W / 16;              // pairs of 8-column n-tiles per PV warp
constexpr int KSTEPS_PV = KV_T / 16;          // k16 steps of P V per tile
constexpr int P_ROW_BYTES = KV_T * 2;         // P buffer (mma.sync paths): ROWS rows of KV_T bf16
constexpr int P_CHUNKS = KV_T / 8;            // 16-byte chunks per P row
// O accumulators per PV thread: O_NT n8-tiles x 4 fp32 = 128 registers on every path.
//   mma.sync P V: tile j = 2*PV_NP*mt + nt holds rows 16mt + gq (+8) x columns DV_W*warp + 8nt + 2cq (+1).
//   wgmma P V: the m64n256k16 D fragment, tile j holds rows 16(warp%4) + gq (+8) x columns PV_WG_N*wg + 8j + 2cq (+1).
constexpr int O_NT = MT * 2 * PV_NP;

// ---- sm_90a pipeline (mainloop_wgmma.cuh; see the note's "sm_90a pipeline")
constexpr int WG_THREADS = 128;               // one warpgroup
constexpr int PV_WG_N = DV / 2;               // value columns per warpgroup (the n of m64n256k16)
// Value split (the plan's value_split = 2, sm_90a only): two CTAs share a query tile and a split's key tiles; each
// computes S and the softmax (WG0) and P V of one half of the value columns (WG1, PV_WG_N columns), so a CTA's
// partial is half as wide and its P V runs under the next tile's S. The other paths take value_split = 1.
constexpr int VALUE_SPLIT_MAX = WGMMA ? DV / PV_WG_N : 1;
constexpr int PIPE_NT = KV_T / 8;             // n8 tiles of the m64n64 S fragment (all keys of a tile)
constexpr int P_BLK = DQK / 64 - 1;           // P_k lives in column block 8 (rope, 64 x 128 B) of tile k
constexpr int MAX_SLACK = 8;                  // the running max moves only past m + 8 (log2 units): move_max
// Handoffs between the warpgroups: shared-memory mbarriers (index into the OFF_BAR array of 8-byte words).
// Every producing thread arrives (release), every thread of the consuming warpgroup waits on the phase
// parity (acquire); the parities are derived in the note ("Handoffs").
constexpr int MB_PREADY = 0;                  // WG0 -> WG1: P_k and alpha_k are in smem (one phase per tile)
constexpr int MB_FULL = 1;                    // WG1 -> WG0: tile k+1 has landed (WG1 waited its copies)
constexpr int MB_EMPTY = 2;                   // + buffer k & 1: both warpgroups' P V of tile k has retired
constexpr int MB_SDONE = MB_EMPTY + STAGES;   // WG0 -> WG0: every warp's S wgmma of tile k has retired
constexpr int MB_LANDED = MB_SDONE + 1;       // + buffer: a key tile by tensor copy has landed (its bytes complete it)
constexpr int MB_INBOX = MB_LANDED + STAGES;  // pair merge: the partner's half of O and its lse have landed (bytes)
constexpr int PIPE_MBARS = MB_INBOX + 1;     // PREADY, FULL, EMPTY[0], EMPTY[1], SDONE, LANDED[0], LANDED[1], INBOX
constexpr int MB_HANDOFF_ARRIVALS = WG_THREADS;  // PREADY, SDONE (WG0 arrives), FULL (WG1 arrives)
// EMPTY: every thread of both warpgroups arrives after its P V wait, WG1 then waits: WG1's own four warps
// must all be past their P V reads of the buffer as well (each warp's slice of the m64n256 wgmma reads all
// of V) before any WG1 thread overwrites it.
constexpr int MB_EMPTY_ARRIVALS = THREADS;

// ---- shared memory (dynamic, 1 KB aligned). The sm_90a pipeline leaves P, REDMAX and REDL unused (P lives in
// the key tile's rope block) but keeps the layout, so kdt_verify_attn_smem_bytes differs only by the mbarriers.
// mainloop_qreg keeps no Q tile: Q is staged in key buffer 1 until its fragments are in registers.
constexpr int Q_BYTES = ROWS * ROW_BYTES;
constexpr int KV_TILE_BYTES = KV_T * ROW_BYTES;
constexpr int P_BUFS = QREG ? 2 : 1;          // mainloop_qreg: P of tile k+1 is written while P V reads tile k's
constexpr int P_BYTES = ROWS * P_ROW_BYTES;
// mainloop_qreg's exchange of S partials, two buffers: slot (buffer, S warp, tile t = 2 m-tile + n-tile) holds
// one lane's 4 accumulators
constexpr int XCH_BYTES = QREG ? 2 * S_WARPS * 4 * 32 * 16 : 0;
constexpr int OFF_Q = 0;
constexpr int OFF_KV = OFF_Q + (QREG ? 0 : Q_BYTES);     // STAGES key tiles
constexpr int OFF_XCH = OFF_KV + STAGES * KV_TILE_BYTES;
constexpr int OFF_P = OFF_XCH + XCH_BYTES;               // mma.sync: P (bf16) [P_BUFS] and the split-D exchange
constexpr int OFF_REDMAX = OFF_P + P_BUFS * P_BYTES;     // float [ROWS][S_WN]
constexpr int OFF_REDL = OFF_REDMAX + ROWS * S_WN * 4;  // float [ROWS][S_WN]
constexpr int OFF_ALPHA = OFF_REDL + ROWS * S_WN * 4;   // float [P_BUFS][ROWS]
constexpr int OFF_INVL = OFF_ALPHA + P_BUFS * ROWS * 4; // float [ROWS]
constexpr int OFF_BAR = OFF_INVL + ROWS * 4;            // uint64 mbarrier [PIPE_MBARS] (sm_90a), [QREG_MBARS]
// sm_90a pair merge (pair_merge_store): the rows' lse and the partner's, in the REDMAX / REDL arrays the pipeline
// leaves unused
constexpr int OFF_PAIR_LSE = OFF_REDMAX;                // float [ROWS]
constexpr int OFF_PEER_LSE = OFF_REDL;                  // float [ROWS]
constexpr int QREG_MBARS = 4;                           // mainloop_qreg: READY[2], FREE[2]
constexpr int BAR_BYTES = WGMMA ? PIPE_MBARS * 8 : QREG ? QREG_MBARS * 8 : 0;  // mainloop_mma: none
constexpr int SMEM_BYTES = OFF_BAR + BAR_BYTES;

// ---- combine (kdt_verify_attn_combine): one row per block, in 1..COMBINE_MAX_GROUPS groups of warps (the plan's
// choice, one group per COMBINE_UNROLL splits), each group covering the row and taking its own batches of splits
constexpr int COMBINE_WARPS_PER_ROW = 4;                // a group: DV / 4 columns a warp, a float4 a lane
constexpr int COMBINE_GROUP_THREADS = 32 * COMBINE_WARPS_PER_ROW;
constexpr int COMBINE_MAX_GROUPS = 4;
constexpr int COMBINE_UNROLL = 8;                       // partial-row loads in flight per lane
// a row's split lse in registers, 32 splits a chunk (the row's lanes hold 64; three chunks spill on sm_120)
constexpr int COMBINE_LSE_CHUNKS = 2;

constexpr float NEG_INF = -__builtin_huge_valf();
constexpr float LN2 = 0.693147180559945309f;

// ---- what the code relies on
static_assert(OFF_BAR % 8 == 0, "mbarrier objects are 8-byte aligned");
static_assert(MB_PREADY >= 0 && MB_FULL > MB_PREADY && MB_EMPTY > MB_FULL && MB_SDONE >= MB_EMPTY + STAGES &&
                  MB_LANDED > MB_SDONE && MB_HANDOFF_ARRIVALS == WG_THREADS &&
                  MB_EMPTY_ARRIVALS == 2 * WG_THREADS,
              "sm_90a pipeline: distinct mbarriers; arrival count = threads that arrive on each");
static_assert(!WGMMA || (THREADS == 2 * WG_THREADS && PIPE_NT == 8 && P_BLK == 8 && KV_T == PAGE &&
                         (P_BLK + 1) * 64 == DQK && STAGES == 2),
              "sm_90a pipeline: two warpgroups, 64-key tiles (one page), P in the rope column block");
static_assert(!WGMMA || (ROWS == 64 && KV_T == 64 && WARPS == 8 && OFF_KV % 1024 == 0 &&
                         KV_TILE_BYTES % 1024 == 0), "wgmma: 64-row x 64-key tiles, 1 KB swizzle atoms");
static_assert(!WGMMA || (PV_WG_N == 256 && O_NT * 8 == PV_WG_N && BLK == 8192 && TROW == 128),
              "wgmma P V: two warpgroups x m64n256, P = one 64 x 128 B swizzle block, V = 64-column blocks");
static_assert(DV == 4 * 32 * COMBINE_WARPS_PER_ROW, "combine: a float4 per lane covers the value row");
static_assert(COMBINE_GROUP_THREADS * COMBINE_MAX_GROUPS <= 1024, "combine: a block of at most 1024 threads");
static_assert(DV_W % 64 == 0 && PV_NP % 4 == 0, "PV warp = whole 64-column blocks of V");
static_assert(O_NT == 32, "O = 128 fp32 registers per PV thread");
static_assert(!SPLIT_D || (ROWS == 64 && TW == 32 && WARPS == 8), "split-D S warps cover 64 rows x 64 keys");
static_assert(!QREG || (ROWS == 32 && KV_T == 16 && S_WARPS == 4 && PV_WARPS == 4 && NT == 2 && STAGES == 4 &&
                        QREG_KSTEPS * QREG_SLICES * 16 == DQK && Q_BYTES == 2 * KV_TILE_BYTES),
              "Q in registers: 4 S warps (slices of the k16 steps) x 32 rows x 16 keys, 4 P V warps, Q staged in "
              "key buffers 2 and 3");
static_assert(QREG || SPLIT_D || WGMMA, "every build has a mainloop");
static_assert(!SPLIT_D || P_BYTES >= (WARPS / 2) * 2048, "split-D exchange lives in the P buffer");
static_assert(!SPLIT_D || (DQK / 16) % 2 == 0, "split-D: even number of k16 steps");
static_assert(PAGE % KV_T == 0 && KV_T % 16 == 0, "a key tile lies in one page and is k16-aligned");
static_assert(DQK % 64 == 0, "S loop runs in groups of 4 k16 steps");
static_assert(DV % (WARPS * 16) == 0, "value columns split in 16-column pairs per warp");
static_assert(P_CHUNKS == 2 || P_CHUNKS == 4 || P_CHUNKS == 8, "P swizzle");
static_assert(ROW_CHUNKS % 8 == 0, "key/query swizzle works on groups of 8 chunks");
static_assert(THREADS % KV_T == 0 && THREADS % ROWS == 0, "loader: whole threads per row");
#if defined(KDT_SMEM_99KB)
static_assert(SMEM_BYTES <= 101376, "sm_120 / sm_8x: 99 KB of dynamic smem per block");
#else
static_assert(SMEM_BYTES <= 232448, "sm_90 / sm_100: 227 KB of dynamic smem per block");
#endif

}  // namespace va
