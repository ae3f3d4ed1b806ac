"""Finding the CUDA toolkit (nvcc) and the GPU, without ever raising for their absence."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kdt import arches


PROBE_SOURCE = 'extern "C" __global__ void kdt_probe(int* out) { out[threadIdx.x] = threadIdx.x; }\n'
PROBE_TIMEOUT_S = 120


@dataclass(frozen=True)
class Nvcc:
    path: Path
    found_by: str          # "PATH", "CUDA_HOME", "cuda-pathfinder"
    version: str           # "13.0.88"


class ToolkitMissing(Exception):
    """No nvcc: the environment cannot build kernels (exit code 2)."""


def find_nvcc() -> Nvcc | None:
    """nvcc on PATH, else under $CUDA_HOME / $CUDA_PATH, else where cuda-pathfinder finds it."""
    candidates: list[tuple[str | None, str]] = [(shutil.which("nvcc"), "PATH")]
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(variable):
            candidates.append((str(Path(os.environ[variable]) / "bin" / "nvcc"), variable))
    try:
        from cuda.pathfinder import find_nvidia_binary_utility

        candidates.append((find_nvidia_binary_utility("nvcc"), "cuda-pathfinder"))
    except Exception:  # cuda-pathfinder missing or unable to look: the other routes still count
        pass
    for location, how in candidates:
        if location and Path(location).is_file() and os.access(location, os.X_OK):
            version = nvcc_version(Path(location))
            if version:
                return Nvcc(Path(location), how, version)
    return None


def find_cuda_tool(name: str, folders: tuple[str, ...] = (), elsewhere: tuple[str, ...] = ()) -> Path | None:
    """A CUDA toolkit executable (compute-sanitizer, ncu): in the bin/ next to nvcc or in the `folders` (glob
    patterns, newest first) of that toolkit, on PATH, under CUDA_HOME / CUDA_PATH or /usr/local/cuda likewise, at
    the `elsewhere` globs (a standalone install), or where cuda-pathfinder finds it. None where it is nowhere."""
    def inside(root: Path) -> list[Path]:
        found = [root / "bin" / name, root / name]
        for folder in folders:
            found += sorted((Path(p) for p in glob.glob(str(root / folder / name))), reverse=True)
        return found

    nvcc = find_nvcc()
    roots = list(dict.fromkeys([nvcc.path.parent.parent, nvcc.path.resolve().parent.parent])) if nvcc else []
    candidates = [path for root in roots for path in inside(root)]
    on_path = shutil.which(name)
    if on_path:
        candidates.append(Path(on_path))
    roots = [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)] + [Path("/usr/local/cuda")]
    candidates += [path for root in roots for path in inside(root)]
    for pattern in elsewhere:
        candidates += sorted((Path(p) for p in glob.glob(pattern)), reverse=True)
    try:
        from cuda.pathfinder import find_nvidia_binary_utility

        found = find_nvidia_binary_utility(name)
        if found:
            candidates.append(Path(found))
    except Exception:  # cuda-pathfinder missing, or unable to look
        pass
    for candidate in dict.fromkeys(candidates):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def nvcc_version(path: Path) -> str | None:
    try:
        text = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release [\d.]+, V([\d.]+)", text)
    return match.group(1) if match else None


def probe_compile(nvcc: Nvcc, arch: str) -> tuple[bool, str]:
    """Compile a one-line kernel to a cubin for `arch`: the only real proof that nvcc can target it."""
    with tempfile.TemporaryDirectory(prefix="kdt-probe-") as work:
        source = Path(work) / "probe.cu"
        source.write_text(PROBE_SOURCE)
        command = [str(nvcc.path), "-cubin", *arches.get(arch).nvcc_flags(), str(source), "-o",
                   str(Path(work) / "probe.cubin")]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as error:
            return False, str(error)
        return done.returncode == 0, (done.stderr or done.stdout).strip()


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    arch: str               # "sm_90"
    memory_gib: float
    multiprocessors: int


@dataclass(frozen=True)
class GpuReport:
    cupy_version: str | None
    cupy_error: str | None
    driver_version: str | None
    runtime_version: str | None
    gpus: list[Gpu]
    error: str | None


def _cuda_version(number: int) -> str:
    return f"{number // 1000}.{number % 1000 // 10}"


def gpu_report() -> GpuReport:
    try:
        import cupy
    except Exception as error:  # ImportError, or a CuPy built for another CUDA failing to load
        return GpuReport(None, f"{type(error).__name__}: {error}", None, None, [], None)
    runtime = cupy.cuda.runtime
    try:
        driver = _cuda_version(runtime.driverGetVersion())
        runtime_version = _cuda_version(runtime.runtimeGetVersion())
        count = runtime.getDeviceCount()
    except Exception as error:
        return GpuReport(cupy.__version__, None, None, None, [], f"{type(error).__name__}: {error}")
    gpus = []
    for index in range(count):
        props = runtime.getDeviceProperties(index)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        gpus.append(Gpu(index, name, f"sm_{props['major']}{props['minor']}", props["totalGlobalMem"] / 2**30,
                        props["multiProcessorCount"]))
    return GpuReport(cupy.__version__, None, driver, runtime_version, gpus, None)


def device_arch() -> str | None:
    """The arch of the current GPU, or None when there is none."""
    report = gpu_report()
    return report.gpus[0].arch if report.gpus else None
