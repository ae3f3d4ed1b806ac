"""Sweep the topk launcher's split knobs on the GPU (performance only: any split gives the same result).

    python3 tools/topk_sweep.py
"""
import itertools

from kdt import bench, peaks, stages
import kdt.launch.topk as launcher

spec = stages.get("topk")
machine = peaks.get()
shapes = {s.name: s for s in spec.bench_shapes(False)}
few = [shapes[n] for n in ("G1_K7_vocab163840_V8_f32", "G1_K15_vocab163840_V8_bf16", "G1_K15_vocab163840_V8_f32")]
many = [shapes[n] for n in ("G64_K15_vocab163840_V8_f32", "G64_K15_vocab163840_V8_bf16")]
print("BLOCKS_PER_SM MIN_CHUNK | " + " | ".join(s.name for s in few))
for blocks, chunk in itertools.product((1, 2, 3, 4, 6, 8), (1024, 2048, 8192)):
    launcher.BLOCKS_PER_SM, launcher.MIN_CHUNK = blocks, chunk
    times = [bench.bench_shape(spec, s, machine, baselines=False).headline_us for s in few]
    print(f"{blocks:13d} {chunk:9d} | " + " | ".join(f"{t:8.2f}" for t in times), flush=True)
launcher.BLOCKS_PER_SM, launcher.MIN_CHUNK = 3, 2048
print("BLOCKS_PER_SM MANY_ROWS_WAVES | " + " | ".join(s.name for s in many))
for blocks, waves in itertools.product((2, 3, 4), (1, 2, 4, 8)):
    launcher.BLOCKS_PER_SM, launcher.MANY_ROWS_WAVES = blocks, waves
    times = [bench.bench_shape(spec, s, machine, baselines=False).headline_us for s in many]
    print(f"{blocks:13d} {waves:15d} | " + " | ".join(f"{t:8.2f}" for t in times), flush=True)
