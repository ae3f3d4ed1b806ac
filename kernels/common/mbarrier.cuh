// kernels/common/mbarrier.cuh -- shared-memory mbarriers, the one set of wrappers the kernels share (verify-attn's
// warpgroup handoffs, topk's bulk-copy completions). Device-only; every barrier is named by its shared-window
// address (__cvta_generic_to_shared).
//
// An mbarrier is an 8-byte object; a phase completes when `count` arrivals were made on it and, where arrivals
// announced bytes (expect_tx), when those bytes have landed too; its phase bit then flips (the first phase has
// parity 0). Unlike bar.arrive / bar.sync they carry explicit release / acquire semantics that
// compute-sanitizer's racecheck models (a bar.arrive producer is reported as racing with its consumer).
// One thread initialises; a __syncthreads() then publishes the init to the CTA.
#pragma once

#include <stdint.h>

namespace kdt {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// one arrival; release: this thread's earlier memory accesses are performed before a waiter's acquire of
// the phase this arrival completes
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// one arrival that also announces `bytes` still to land on the barrier (an async copy's complete_tx)
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// block until the phase of parity `parity` has completed (acquire). Correct only if the barrier is at most
// one phase ahead of the waiter (a phase two ahead has the same parity and would look pending).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "MBAR_WAIT:\n"
        "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra MBAR_WAIT;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

}  // namespace kdt
