// kernels/common/mma.cuh -- warp-level tensor-core primitives every arch from sm_80 on has (sm_90, sm_120):
// ldmatrix and mma.sync m16n8k16 bf16 with float32 accumulation. Device-only, header-only.
#pragma once

#include <stdint.h>

namespace kdt {

// ldmatrix: four (x4) or two (x2) 8x8 b16 matrices from shared memory (addresses by lane: lanes 8i..8i+7 give
// the rows of matrix i); .trans transposes each matrix on the way.
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

// D += A B, m16n8k16, A row-major bf16 (4 regs), B col-major bf16 (2 regs), D float32 (4 regs).
// Fragments (lane = 4*gq + cq): a0 (row gq, k 2cq..+1), a1 (row gq+8, k 2cq..+1), a2 (row gq, k 2cq+8..+9),
// a3 (row gq+8, k 2cq+8..+9); b0 (k 2cq..+1, n gq), b1 (k 2cq+8..+9, n gq); d0,d1 (row gq, n 2cq..+1),
// d2,d3 (row gq+8, n 2cq..+1).
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace kdt
