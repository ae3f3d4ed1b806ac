// kernels/common/wgmma.cuh -- Hopper's warpgroup MMA (wgmma, sm_90a only: neither sm_90 nor sm_120 has it):
// shared-memory matrix descriptors (128-byte swizzle, K-major and MN-major), the fence / commit / wait of the
// async groups, register fences for accumulator fragments, and the two shapes verify-attn issues (m64n64k16 for
// S = Q K^T, m64n256k16 with a transposed B for O += P V). Device-only, header-only; empty unless
// the target is sm_90a (__CUDA_ARCH_FEAT_SM90_ALL).
#pragma once

#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace kdt {
// ---- sm_90a only: wgmma (warpgroup = 4 consecutive warps, 128 threads, all execute each call convergently).
// Shared-memory matrix descriptor, K-major operand with the 128-byte swizzle: 8-row x 128-byte atoms
// (1024 B, 1024-aligned), row r of an atom at +128*r with 16-byte chunk u stored at u ^ (r & 7) (the hardware
// XORs address bits [4:6] with bits [7:9]); consecutive 8-row atoms SBO = 1024 B apart; LBO unused (1).
// The k16 step kk inside a 64-element (128-byte) block is addressed by start address + 32*kk bytes.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t address) {
    return static_cast<uint64_t>((address & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(1u) << 16) |
           (static_cast<uint64_t>(1024u >> 4) << 32) | (static_cast<uint64_t>(1u) << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void reg_fence(float& x) { asm volatile("" : "+f"(x)::"memory"); }
// reg_fence on every register of a wgmma accumulator fragment (flat or [n8 tile][4]): the compiler may not move
// the fragment's reads or writes across the point (wgmma issue, commit or wait) where this is called.
template <int N>
__device__ __forceinline__ void reg_fence_all(float (&x)[N]) {
#pragma unroll
    for (int e = 0; e < N; ++e) reg_fence(x[e]);
}
template <int N, int M>
__device__ __forceinline__ void reg_fence_all(float (&x)[N][M]) {
#pragma unroll
    for (int j = 0; j < N; ++j) reg_fence_all(x[j]);
}
// Wait for this thread's committed wgmma groups, then fence the accumulator they wrote.
template <typename Fragment>
__device__ __forceinline__ void wgmma_retire(Fragment& d) {
    wgmma_wait0();
    reg_fence_all(d);
}

// D (64 x 64 f32) += A (64 x k16, smem desc, K-major) * B (64 x k16, smem desc, K-major)^T: the mma.sync m16n8
// C layout repeated over 8 n8 tiles: d[4j + e] = row 16i + gq + 8*(e/2), column 8j + 2cq + (e&1), j = 0..7
// (thread t of the warpgroup: warp i = t/32, lane = 4*gq + cq).
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db));
}

// Shared-memory matrix descriptor, MN-major ("transposed") operand with the 128-byte swizzle, 16-bit types only.
// Canonical layout (CuTe's Layout_MN_SW128_Atom tiled; PTX ISA "matrix descriptor", MN-major swizzled):
// atoms of 8 K-rows x 128 bytes (64 elements along M/N), row r of an atom at +128*r, 16-byte chunk u of it at
// u ^ (r & 7), atoms 1024-aligned. The two strides the hardware needs:
//   LBO (bits 16-29, >> 4) = bytes between two 64-element blocks along M/N (the "leading" = contiguous dim),
//   SBO (bits 32-45, >> 4) = bytes between two 8-row groups along K.
// (For the K-major descriptor above LBO is unused and SBO is the 8-row step along M/N.) A k16 step = two
// 8-row groups, so the k16 step kk of a tile is addressed by start address + kk * 2 * SBO.
__device__ __forceinline__ uint64_t wgmma_desc_sw128_mn(uint32_t address, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    return static_cast<uint64_t>((address & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(lbo_bytes >> 4) << 16) |
           (static_cast<uint64_t>(sbo_bytes >> 4) << 32) | (static_cast<uint64_t>(1u) << 62);
}

// D (64 x 256 f32) += A (64 x k16, smem desc, K-major) * B (k16 x 256, smem desc, MN-major: imm-trans-b = 1).
// Used for O += P V: A = P (rows x keys, key-contiguous), B = V (keys x value columns, column-contiguous).
// D fragment of thread t of the warpgroup (warp i = t/32, lane = 4*gq + cq): d[j][e] = row 16i + gq + 8*(e/2),
// column 8j + 2cq + (e&1), j = 0..31 (the same per-n8-tile layout as m64n64 above, repeated 32 times).
// 128 accumulator registers: the caller must not touch d between wgmma_fence() and wgmma_wait0() (the asm
// below only tells the compiler that d is read and written at the issue point).
__device__ __forceinline__ void wgmma_m64n256k16_tb(float (&d)[32][4], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
        " %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
        " %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
        " %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
        " %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
          "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
          "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]),
          "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]),
          "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),
          "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]),
          "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]),
          "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]),
          "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]),
          "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]),
          "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]),
          "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]),
          "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]),
          "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]),
          "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]),
          "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]),
          "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]),
          "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]),
          "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
        : "l"(da), "l"(db));
}
}  // namespace kdt
#endif
