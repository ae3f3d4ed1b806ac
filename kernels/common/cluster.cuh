// kernels/common/cluster.cuh -- thread-block clusters (sm_90+): the cluster-wide barrier halves, the address in
// block `rank`'s shared memory of what `local` is in this block (distributed shared memory), loads and stores there,
// the whole-cluster barrier, and the fence that publishes mbarrier inits to the cluster. Device-only, header-only.
//
// Cluster shapes are a launch decision: sm_90 runs up to 16 blocks per cluster with the non-portable opt-in,
// sm_120 at most 8 (the portable size).
#pragma once

#include <stdint.h>

#include "common/ptx.cuh"

namespace kdt {

__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_arrive_release() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait_acquire() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

__device__ __forceinline__ uint32_t cluster_addr(uint32_t local, uint32_t rank) {  // local: a shared-window address
    uint32_t there;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(there) : "r"(local), "r"(rank));
    return there;
}
__device__ __forceinline__ uint32_t cluster_addr(const void* local, uint32_t rank) {
    return cluster_addr(smem_addr(local), rank);
}
// st.async: stores into block `rank`'s shared memory that, once performed there, complete their bytes on that
// block's mbarrier `bar` (a shared::cluster address: cluster_addr of the barrier). Nothing waits here: the
// receiver waits on its barrier for the bytes it announced (mbar_arrive_expect_tx), so no cluster barrier is
// needed between the stores and its reads.
__device__ __forceinline__ void store_async_to_block(uint32_t there, uint32_t value, uint32_t bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n"
                 ::"r"(there), "r"(value), "r"(bar) : "memory");
}
__device__ __forceinline__ void store_async_to_block(uint32_t there, uint4 value, uint32_t bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n"
                 ::"r"(there), "r"(value.x), "r"(value.y), "r"(value.z), "r"(value.w), "r"(bar) : "memory");
}
__device__ __forceinline__ void store_to_block(const void* local, uint32_t rank, uint32_t value) {
    asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(cluster_addr(local, rank)), "r"(value) : "memory");
}
__device__ __forceinline__ void store_to_block(const void* local, uint32_t rank, uint2 value) {
    asm volatile("st.shared::cluster.v2.u32 [%0], {%1, %2};\n" ::"r"(cluster_addr(local, rank)), "r"(value.x),
                 "r"(value.y) : "memory");
}
__device__ __forceinline__ void store_to_block(const void* local, uint32_t rank, uint4 value) {
    asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(cluster_addr(local, rank)), "r"(value.x),
                 "r"(value.y), "r"(value.z), "r"(value.w) : "memory");
}

__device__ __forceinline__ uint32_t load_from_block(const uint32_t* local, uint32_t rank) {
    uint32_t value;
    asm volatile("ld.shared::cluster.u32 %0, [%1];\n" : "=r"(value) : "r"(cluster_addr(local, rank)) : "memory");
    return value;
}
__device__ __forceinline__ float load_from_block(const float* local, uint32_t rank) {
    float value;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(value) : "r"(cluster_addr(local, rank)) : "memory");
    return value;
}
__device__ __forceinline__ unsigned long long load_from_block(const unsigned long long* local, uint32_t rank) {
    unsigned long long value;
    asm volatile("ld.shared::cluster.u64 %0, [%1];\n" : "=l"(value) : "r"(cluster_addr(local, rank)) : "memory");
    return value;
}
__device__ __forceinline__ void store_to_block(const unsigned long long* local, uint32_t rank,
                                               unsigned long long value) {
    asm volatile("st.shared::cluster.u64 [%0], %1;\n" ::"r"(cluster_addr(local, rank)), "l"(value) : "memory");
}

// Every thread of every block of the cluster: what each wrote to shared memory before is visible to all after.
__device__ __forceinline__ void cluster_sync() {
    cluster_arrive_release();
    cluster_wait_acquire();
}

// mbarrier.init of this block -> visible to the whole cluster (and to the async proxy with fence_proxy_async)
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

}  // namespace kdt
