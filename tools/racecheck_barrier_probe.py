"""Which block-internal handoffs does compute-sanitizer racecheck model? One small probe kernel per pattern.

Every probe is correct by the PTX ISA; each checks its values, so a plain run proves the handoff works and a
racecheck run shows whether the tool understands it. Run one probe per process (racecheck reports per run):

    python3 tools/racecheck_barrier_probe.py arrive_sync
    compute-sanitizer --tool racecheck --racecheck-report all python3 tools/racecheck_barrier_probe.py arrive_sync

Probes (threads 0..127 are group 0, 128..255 group 1):
  arrive_sync     group 0 stores a value per iteration then `bar.arrive 1, 256`; group 1 waits with `bar.sync 1`,
                  loads it and `bar.arrive 2` to hand the buffer back (group 0 `bar.sync 2` before the next
                  store). "barrier.cta.sync or barrier.cta.arrive guarantees that when the barrier completes,
                  prior memory accesses requested by this thread are performed relative to all threads
                  participating in the barrier".
  mbarrier        the same handoff through two shared-memory mbarriers: every producer thread arrives
                  (mbarrier.arrive.release.cta), every consumer waits (try_wait.parity.acquire.cta).
  group_sync      each group runs its own `bar.sync 5 + group, 128` per iteration (like a warpgroup-only
                  barrier), then group 0 stores, __syncthreads, group 1 loads: the store and the load are
                  ordered by the __syncthreads that all 256 threads execute.
  group_mbarrier  the same, with the group-only barrier an mbarrier of 128 arrivals (arrive, then wait).
H200, 2026-11-30, all four: values correct. racecheck: arrive_sync 1,539 WAR hazards; mbarrier, group_sync and
group_mbarrier 0. So racecheck does not treat bar.arrive as releasing the arriving thread's accesses, while
mbarrier arrive (release) / try_wait (acquire) pairs are modelled. verify-attn's warp-specialised loop reported
hazards with bar.arrive handoffs, still reported invl_s with mbarrier handoffs plus one WG0-only bar.sync (a
pattern group_sync alone does not reproduce), and is racecheck-clean with every handoff on mbarriers.
"""
import sys

import cupy as cp

GROUP = 128
THREADS = 2 * GROUP
ITERS = 4

PRELUDE = r'''
__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile("{\n.reg .pred done;\nWAIT:\n"
                 "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n}" :: "r"(bar), "r"(parity) : "memory");
}
'''

# out[k][t'] = value handed over in iteration k to consumer thread t' (k < ITERS); out[ITERS][t'] = the epilogue.
# Every probe is this frame around its own handoff loop.
FRAME = r"""
extern "C" __global__ void probe(int* out, int iters) {
    __shared__ int box[128];     // the value handed over in each iteration
    __shared__ int fin[128];     // the epilogue's value, ordered by a __syncthreads that every thread executes
    const int t = threadIdx.x;
%s
    if (t < 128) fin[t] = t + 7;
    __syncthreads();
    if (t >= 128) out[iters * 128 + t - 128] = fin[t - 128];
}
"""

HANDOFFS = {
    "arrive_sync": r"""
    for (int k = 0; k < iters; ++k) {
        if (t < 128) {
            if (k > 0) asm volatile("bar.sync 2, 256;" ::: "memory");
            box[t] = k * 1000 + t;
            asm volatile("bar.arrive 1, 256;" ::: "memory");
        } else {
            asm volatile("bar.sync 1, 256;" ::: "memory");
            out[k * 128 + t - 128] = box[t - 128];
            if (k + 1 < iters) asm volatile("bar.arrive 2, 256;" ::: "memory");
        }
    }""",
    "mbarrier": r"""
    __shared__ unsigned long long bars[2];      // 0: full (producers arrive), 1: empty (consumers arrive)
    if (t == 0) { mbar_init(smem_u32(&bars[0]), 128); mbar_init(smem_u32(&bars[1]), 128); }
    __syncthreads();
    for (int k = 0; k < iters; ++k) {
        if (t < 128) {
            if (k > 0) mbar_wait(smem_u32(&bars[1]), (k - 1) & 1);
            box[t] = k * 1000 + t;
            mbar_arrive(smem_u32(&bars[0]));
        } else {
            mbar_wait(smem_u32(&bars[0]), k & 1);
            out[k * 128 + t - 128] = box[t - 128];
            if (k + 1 < iters) mbar_arrive(smem_u32(&bars[1]));
        }
    }""",
    "group_sync": r"""
    for (int k = 0; k < iters; ++k) {
        if (t < 128) asm volatile("bar.sync 5, 128;" ::: "memory");
        else asm volatile("bar.sync 6, 128;" ::: "memory");
        if (t < 128) box[t] = k * 1000 + t;
        __syncthreads();
        if (t >= 128) out[k * 128 + t - 128] = box[t - 128];
        __syncthreads();
    }""",
    "group_mbarrier": r"""
    __shared__ unsigned long long bars[2];      // one per group, 128 arrivals each
    if (t < 2) mbar_init(smem_u32(&bars[t]), 128);
    __syncthreads();
    const unsigned mine = smem_u32(&bars[t / 128]);
    for (int k = 0; k < iters; ++k) {
        mbar_arrive(mine);
        mbar_wait(mine, k & 1);
        if (t < 128) box[t] = k * 1000 + t;
        __syncthreads();
        if (t >= 128) out[k * 128 + t - 128] = box[t - 128];
        __syncthreads();
    }""",
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in HANDOFFS:
        print(f"usage: racecheck_barrier_probe.py {{{','.join(HANDOFFS)}}} (got {argv!r})", file=sys.stderr)
        return 2
    kernel = cp.RawKernel(PRELUDE + FRAME % HANDOFFS[argv[0]], "probe")
    out = cp.full((ITERS + 1) * GROUP, -1, cp.int32)
    kernel((1,), (THREADS,), (out, cp.int32(ITERS)))
    got = out.get().reshape(ITERS + 1, GROUP)
    lanes = cp.arange(GROUP).get()
    correct = all((got[k] == k * 1000 + lanes).all() for k in range(ITERS)) and (got[ITERS] == lanes + 7).all()
    print(f"{argv[0]}: values correct: {bool(correct)}")
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
