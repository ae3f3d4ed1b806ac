"""The machine's own ceilings, measured once per GPU and cached: device copy bandwidth (bytes read plus
bytes written by a large device-to-device copy) and the bf16 tensor-core matmul rate."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from kdt import runtime

COPY_BYTES = 2 * 2**30
MATMUL_SIZE = 8192
REPEATS = 20


@dataclass(frozen=True)
class Peaks:
    gpu: str
    copy_gbps: float          # GB/s, read + write
    matmul_tflops: float      # bf16 (fp16 via cuBLAS where PyTorch is absent: same tensor-core rate)
    matmul_how: str


def roofline_times(bytes_moved: int, flops: int, copy_gbps: float, matmul_tflops: float) -> tuple[float, float]:
    """(memory us, compute us) of a shape's byte and flop model: its bytes at the copy bandwidth, its flops at the
    matmul rate (0 for a stage without a flop model). The roofline bound is the larger."""
    return bytes_moved / (copy_gbps * 1e3), (flops / (matmul_tflops * 1e6) if flops else 0.0)


def roofline_bound(bytes_moved: int, flops: int, measured_us: float, peaks: Peaks) -> tuple[float, float]:
    """(bound us, % of bound) of a shape's byte and flop model against one measured time: bound = the larger of
    roofline_times, the least time the model allows on this machine; % of bound = 100 * bound / measured, so 100 is
    at the roofline."""
    bound_us = max(roofline_times(bytes_moved, flops, peaks.copy_gbps, peaks.matmul_tflops))
    return bound_us, (100.0 * bound_us / measured_us if measured_us > 0 else 0.0)


def _cache_path(gpu: str) -> Path:
    root = os.environ.get("KDT_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kdt"
    return Path(root) / f"peaks-{''.join(c if c.isalnum() else '_' for c in gpu)}.json"


def _median_ms(cp, work, repeats=REPEATS) -> float:
    for _ in range(3):
        work()
    times = []
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        work()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    times.sort()
    return times[len(times) // 2]


def measure() -> Peaks:
    cp = runtime.cupy()
    gpu = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    gpu = gpu.decode() if isinstance(gpu, bytes) else str(gpu)
    source = cp.random.random(COPY_BYTES // 4, dtype=cp.float32)
    target = cp.empty_like(source)
    copy_ms = _median_ms(cp, lambda: target.data.copy_from_device_async(source.data, COPY_BYTES))
    source = target = None  # release the copy buffers before the matmul
    flops = 2 * MATMUL_SIZE**3
    try:
        import torch

        a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device="cuda", dtype=torch.bfloat16)
        stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        with stream:
            matmul_ms = _median_ms(cp, lambda: torch.matmul(a, b))
        how = "torch bf16 8192^3"
    except Exception:
        a = cp.random.standard_normal((MATMUL_SIZE, MATMUL_SIZE), dtype=cp.float32).astype(cp.float16)
        b = cp.random.standard_normal((MATMUL_SIZE, MATMUL_SIZE), dtype=cp.float32).astype(cp.float16)
        matmul_ms = _median_ms(cp, lambda: cp.matmul(a, b))
        how = "cuBLAS fp16 8192^3 (PyTorch absent)"
    return Peaks(gpu, 2 * COPY_BYTES / copy_ms / 1e6, flops / matmul_ms / 1e9, how)


def get(refresh: bool = False) -> Peaks:
    cp = runtime.cupy()
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    path = _cache_path(name.decode() if isinstance(name, bytes) else str(name))
    if path.is_file() and not refresh:
        try:
            return Peaks(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            pass  # a stale or damaged cache is measured again
    peaks = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(peaks)))
    return peaks
