// kernels/common/arch.cuh -- the hardware configuration a cubin is built for, named, so that a source says what it
// depends on rather than which __CUDA_ARCH__ values have it, and so that kdt's emulation target takes exactly the
// configuration of the GPU it stands for.
//
//   KDT_SM120_CONFIG   the RTX Blackwell configuration (sm_120: RTX PRO 6000, RTX 5070 Ti): 99 KB of shared memory
//                      per block, clusters of at most 8 blocks, mma.sync tensor cores (no wgmma). Set for sm_120
//                      cubins and for the emulation build `sm_120-emu` (nvcc -arch sm_90 -DKDT_EMULATE_SM120),
//                      which runs that configuration on an H200: same paths, tiles, pipeline depth, cluster
//                      shapes, launch constants and shared-memory budget, and nothing sm_120 lacks (plain sm_90
//                      code: no wgmma).
//   KDT_SMEM_99KB      99 KB of shared memory per block: KDT_SM120_CONFIG, and the sm_8x parts.
#pragma once

#if defined(KDT_EMULATE_SM120) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200)
#define KDT_SM120_CONFIG 1
#endif

#if defined(KDT_SM120_CONFIG) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900)
#define KDT_SMEM_99KB 1
#endif

#if defined(KDT_EMULATE_SM120) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "the sm_120 emulation is built for plain sm_90: sm_90a's wgmma does not exist on sm_120"
#endif
