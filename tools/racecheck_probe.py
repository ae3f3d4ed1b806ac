"""Does compute-sanitizer racecheck preserve warp collectives? Run plainly and under racecheck; compare.

    python3 tools/racecheck_probe.py
    compute-sanitizer --tool racecheck python3 tools/racecheck_probe.py
"""
import cupy as cp

SOURCE = r'''
extern "C" __global__ void probe(const unsigned* in, unsigned* out) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned v = in[threadIdx.x];
    const unsigned mx = __reduce_max_sync(0xffffffffu, v);
    const unsigned mn = __reduce_min_sync(0xffffffffu, v);
    const unsigned bal = __ballot_sync(0xffffffffu, v == mx);
    const unsigned sh = __shfl_sync(0xffffffffu, v, 7);
    if (lane == 0) { out[0] = mx; out[1] = mn; out[2] = bal; out[3] = sh; }
}
'''
kernel = cp.RawKernel(SOURCE, "probe", options=("-arch=sm_90",))
values = cp.asarray([(i * 2654435761) % 1000 for i in range(32)], dtype=cp.uint32)
out = cp.full(4, 0xDEADBEEF, dtype=cp.uint32)
kernel((1,), (32,), (values, out))
host = values.get()
expected = [host.max(), host.min(), sum(1 << i for i in range(32) if host[i] == host.max()), host[7]]
print("got     ", [hex(int(x)) for x in out.get()])
print("expected", [hex(int(x)) for x in expected])
print("redux/ballot/shfl", "OK" if list(out.get()) == [int(x) for x in expected] else "WRONG")
