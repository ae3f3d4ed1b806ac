// kernels/common/ptx.cuh -- the PTX wrappers the kernels share: shared-window addresses, async copies into shared
// memory (per-thread cp.async and the bulk-copy engine) and bulk L2 prefetches, shared-memory loads, stores and
// atomics, block and named barriers, the fast exponential, packed bf16 arithmetic and compares. Device-only,
// header-only, __forceinline__.
//
// Every inline `asm` of the kernels lives in kernels/common/ (this file, cluster.cuh, mbarrier.cuh, mma.cuh,
// wgmma.cuh), so each instruction's contract is written down once.
#pragma once

#include <stdint.h>

namespace kdt {

// Programmatic dependent launch (sm_90 on). launch_dependents: this block no longer holds back the next launch in
// the stream, where that one was made with programmatic stream serialization (a no-op otherwise). Its blocks may
// then start before this launch ends, so they must wait_for_prior_launches() before reading what it writes.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// Waits until the launches this one depends on have completed and their writes are visible: at once where it was
// not launched with programmatic stream serialization.
__device__ __forceinline__ void wait_for_prior_launches() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Every entry point's first statement (the launch knob `overlap_previous`): the launch before this one done and its
// writes visible, then the next launch's blocks let in. In this order a launch's dependents start only after it has
// waited itself, so a chain of overlapping launches stays in stream order for memory: only block launch and the
// work before each wait overlap.
__device__ __forceinline__ void after_previous_launch() {
    wait_for_prior_launches();
    launch_dependents();
}

// The shared-window address of a shared-memory object (what PTX's shared-state operands take).
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 2^x by MUFU.EX2 (max rel. error 2 ulp; flushes subnormals; 2^-inf = +0).
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Elementwise maximum of two bf16 pairs (HMNMX2.BF16). max.bf16x2 has no .ftz form: subnormals are kept; it
// returns one of its inputs (no rounding), -inf is the smallest value, and of -0.0 / +0.0 either may come back.
// NaN must never reach it.
__device__ __forceinline__ uint32_t bf16x2_max(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// Elementwise compares of two bf16 pairs (HSET2.BF16): each half of the result is 0xffff where the compare holds,
// else 0. No .ftz form: subnormals compare as themselves; -0.0 == +0.0; a NaN compares false.
__device__ __forceinline__ uint32_t bf16x2_gt_mask(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("set.gt.u32.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ uint32_t bf16x2_ge_mask(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("set.ge.u32.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// Two floats -> bf16x2 (round to nearest even), `lo` in the low half (the lower address / column).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// lop3.b32 with the truth table `table` (an immediate).
template <uint32_t table>
__device__ __forceinline__ uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(table));
    return d;
}

// if_nonzero where flag != 0, else otherwise, as one setp + selp the compiler cannot fold into what computes flag
// (it would otherwise merge the select into a predicate combine, one more step on a dependency chain).
__device__ __forceinline__ uint32_t select_nonzero(uint32_t flag, uint32_t if_nonzero, uint32_t otherwise) {
    uint32_t out;
    asm("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %1, 0;\n\tselp.b32 %0, %2, %3, p;\n\t}"
        : "=r"(out) : "r"(flag), "r"(if_nonzero), "r"(otherwise));
    return out;
}

// An empty asm that "changes" a pointer: the compiler must take its value as it is there (it cannot rebuild it
// from an induction variable that it would then have to advance in every step of a loop).
template <typename T>
__device__ __forceinline__ void opaque(T*& p) { asm("" : "+l"(p)); }

// threadIdx.x through a volatile read: the compiler cannot hoist values derived from it out of a loop (where
// recomputing a few lane offsets per tile is cheaper than keeping them in registers).
__device__ __forceinline__ uint32_t thread_x() {
    uint32_t t;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
    return t;
}

// ---- per-thread async copies (cp.async, sm_80+), 16 bytes global -> shared, bypassing L1 (.cg)
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// the same, reading only `src_bytes` (0 or 16) of src: 0 zero-fills the 16 bytes without reading src
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}
// ... with an L2 cache `policy` (l2_policy) for the lines it brings into L2
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, uint32_t src_bytes, uint64_t policy) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes), "l"(policy) : "memory");
}
// An L2 cache policy for a copy's lines: evicted before any others (data no one reads again: streamed keys do not
// push out what will be), or the default priority.
__device__ __forceinline__ uint64_t l2_policy(bool evict_first) {
    uint64_t policy;
    if (evict_first)
        asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    else
        asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}
// 4 bytes global -> shared, through L1 (.ca: the only form below 16 bytes)
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// all but the PENDING most recent committed groups of this thread have landed
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory"); }

// ---- bulk copies (cp.async.bulk, the TMA engine, sm_90+): one instruction moves `bytes` (a multiple of 16,
// both addresses 16-byte aligned) from global memory into this block's shared memory and completes them on the
// block's mbarrier `bar` (common/mbarrier.cuh), which an arrive_expect_tx of the same bytes has armed.
__device__ __forceinline__ void bulk_copy_to_shared(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
// A tensor map (the driver's CUtensorMap: 128 bytes, 64-byte aligned), made on the host (kdt/launch/tensor_map.py)
// and passed by value as a __grid_constant__ parameter, whose address the tensor copies take.
struct alignas(64) TensorMap {
    unsigned long long words[16];
};
// The box at coordinates (x innermost, y) of the 2D tensor that `map` describes, copied by the tensor-copy engine
// into this block's shared memory at `dst` (laid out and swizzled as the map says) and completed on mbarrier `bar`
// like bulk_copy_to_shared; its lines enter L2 with the cache `policy` (l2_policy).
__device__ __forceinline__ void tensor_copy_2d_to_shared(uint32_t dst, const TensorMap* map, int x, int y,
                                                         uint32_t bar, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3}], [%4], %5;\n"
        ::"r"(dst), "l"(map), "r"(x), "r"(y), "r"(bar), "l"(policy) : "memory");
}
// `bytes` (a multiple of 16, `src` 16-byte aligned) of global memory fetched into L2 by the bulk-copy engine, no
// completion to wait for: a later load of them hits L2. A hint: it orders nothing, so no "memory" clobber.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes));
}
// The 128-byte line of global memory at `line` (128-byte aligned) dropped from L2 without being written back: for
// scratch read for the last time, whose dirty lines would otherwise cost DRAM writes when evicted. Its contents
// are undefined afterwards.
__device__ __forceinline__ void discard_l2_line(const void* line) {
    asm volatile("discard.global.L2 [%0], 128;\n" ::"l"(line) : "memory");
}
// generic-proxy shared-memory writes (cp.async, st.shared, mbarrier.init) -> visible to the async proxy (bulk
// copies, wgmma operand reads)
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- shared memory by shared-window address (volatile + memory: never moved across a cp.async wait)
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
    uint4 r;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(addr) : "memory");
    return r;
}
__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
// *counter += value, returning the old value, without the compiler's warp aggregation (a shuffle scan per call):
// the few lanes that reserve slots at once are serialised by the hardware instead.
__device__ __forceinline__ uint32_t shared_add(uint32_t* counter, uint32_t value) {
    uint32_t old;
    asm volatile("atom.shared.add.u32 %0, [%1], %2;\n"
                 : "=r"(old) : "r"(smem_addr(counter)), "r"(value) : "memory");
    return old;
}
// Global memory at GPU scope without ordering (relaxed): for values that carry their own validity (a reader polls
// until it sees one), so that no fence waits for earlier writes.
__device__ __forceinline__ uint32_t global_add_relaxed(uint32_t* counter, uint32_t value) {
    uint32_t old;
    asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(counter), "r"(value) : "memory");
    return old;
}
__device__ __forceinline__ unsigned long long global_load_relaxed(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void global_store_relaxed(unsigned long long* p, unsigned long long v) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" ::"l"(p), "l"(v) : "memory");
}
// *address += 1 when `add` (a shared-window address): one predicated reduction, so a warp's items need no branch.
__device__ __forceinline__ void shared_add_if(uint32_t address, bool add) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %1, 0;\n\t@p red.shared.add.u32 [%0], 1;\n\t}"
                 :: "r"(address), "r"((uint32_t)add) : "memory");
}
// *p = value when `store` (p in shared memory), as one predicated store: the compiler branches around a plain
// `if`, which costs a branch and a convergence barrier per item.
__device__ __forceinline__ void shared_store_if(const void* p, uint32_t value, bool store) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %2, 0;\n\t@p st.shared.u32 [%0], %1;\n\t}"
                 :: "r"((uint32_t)__cvta_generic_to_shared(p)), "r"(value), "r"((uint32_t)store) : "memory");
}

// ---- block barrier 0 for threads that reach it from different places (barrier.sync without .aligned: every
// thread of the block counts, wherever it arrives from; __syncthreads is bar.sync, the aligned kind)
__device__ __forceinline__ void block_barrier_divergent() { asm volatile("barrier.sync 0;\n" ::: "memory"); }

// ---- named barriers: `count` threads (a multiple of 32) of the block meet at barrier `id` (1..15; 0 is
// __syncthreads)
__device__ __forceinline__ void named_barrier(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// The same for warps that reach it from different places (barrier.sync without .aligned).
__device__ __forceinline__ void named_barrier_divergent(int id, int count) {
    asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

}  // namespace kdt
