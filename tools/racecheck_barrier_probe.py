"""Does compute-sanitizer racecheck model named-barrier producer/consumer handoffs (bar.arrive -> bar.sync)?

Threads 0..127 produce a value per iteration (store, bar.arrive 1) and wait for the consumer to have taken the
previous one (bar.sync 2); threads 128..255 consume (bar.sync 1, load, bar.arrive 2). The PTX ISA orders this:
"barrier.cta.sync or barrier.cta.arrive guarantees that when the barrier completes, prior memory accesses
requested by this thread are performed relative to all threads participating in the barrier". The values are
checked; run it plainly and under racecheck and compare (on the H200, 2026-11-30: values correct, racecheck
reports 1,539 WAR hazards, i.e. it does not treat bar.arrive as ordering the arriving thread's loads).

    python3 tools/racecheck_barrier_probe.py
    compute-sanitizer --tool racecheck --racecheck-report all python3 tools/racecheck_barrier_probe.py
"""
import cupy as cp

SOURCE = r'''
extern "C" __global__ void probe(int* out, int iters) {
    __shared__ int box[128];
    __shared__ int fin[128];
    const int t = threadIdx.x;
    for (int k = 0; k < iters; ++k) {
        if (t < 128) {                       // producer: wait until the consumer took the previous value
            if (k > 0) asm volatile("bar.sync 2, 256;" ::: "memory");
            box[t] = k * 1000 + t;
            asm volatile("bar.arrive 1, 256;" ::: "memory");
        } else {                             // consumer
            asm volatile("bar.sync 1, 256;" ::: "memory");
            out[k * 128 + t - 128] = box[t - 128];
            if (k + 1 < iters) asm volatile("bar.arrive 2, 256;" ::: "memory");
        }
    }
    if (t < 128) fin[t] = t + 7;
    __syncthreads();
    if (t >= 128) out[iters * 128 + t - 128] = fin[t - 128];
}
'''
ITERS = 4
kernel = cp.RawKernel(SOURCE, "probe")
out = cp.full((ITERS + 1) * 128, -1, cp.int32)
kernel((1,), (256,), (out, cp.int32(ITERS)))
got = out.get().reshape(ITERS + 1, 128)
lanes = cp.arange(128).get()
correct = all((got[k] == k * 1000 + lanes).all() for k in range(ITERS)) and (got[ITERS] == lanes + 7).all()
print("values correct:", bool(correct))
