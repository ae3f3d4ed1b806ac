"""The GPU side of kdt: CuPy, the current device, and the kernels' modules loaded from their cubins.

Nothing here is imported until a command needs a GPU, so the CPU-only parts of kdt never need CuPy.
"""

from __future__ import annotations

import importlib
import os
from functools import cache

from kdt import build, toolkit
from kdt.launch.plan import Target
from kdt.spec import StageSpec


class GpuMissing(Exception):
    """No CuPy, no GPU, or a GPU kdt cannot build for: the environment cannot run kernels (exit code 2)."""


@cache
def cupy():
    try:
        module = importlib.import_module("cupy")
    except Exception as error:  # ImportError, or a CuPy built for another CUDA failing to load its libraries
        raise GpuMissing(f"CuPy is not importable ({type(error).__name__}: {error}); "
                         "install it with `python3 -m pip install -e '.[gpu]'`") from None
    try:
        count = module.cuda.runtime.getDeviceCount()
    except Exception as error:
        raise GpuMissing(f"no usable GPU ({type(error).__name__}: {error})") from None
    if count < 1:
        raise GpuMissing("no GPU: CUDA reports no device")
    return module


# Hopper's own instructions (wgmma) exist only in the arch-specific target; a cubin for sm_90a runs on
# every 9.0 GPU, so kdt builds that for H100/H200 and kernels guard such code with __CUDA_ARCH_FEAT_SM90_ALL.
ARCH_SPECIFIC = {"sm_90": "sm_90a"}


def gpu_arch() -> str:
    """The current GPU's compute capability as an arch name (sm_90 for 9.0)."""
    return f"sm_{cupy().cuda.Device().compute_capability}"  # CuPy gives "90" for 9.0


def device_arch() -> str:
    """The arch kdt builds for the current GPU (KDT_ARCH overrides it, e.g. sm_90 for the portable path); a GPU
    of an arch kdt does not build for is GpuMissing."""
    base = gpu_arch()
    arch = os.environ.get("KDT_ARCH") or ARCH_SPECIFIC.get(base, base)
    if arch not in toolkit.SUPPORTED_ARCHES:
        raise GpuMissing(f"this GPU is {arch}; kdt builds its kernels for {', '.join(toolkit.SUPPORTED_ARCHES)} "
                         "only (--arch builds for another)")
    return arch


def default_arches() -> list[str]:
    """The arch of the GPU present (GpuMissing for one kdt cannot build for), else sm_120 (the primary target)."""
    try:
        cupy()
    except GpuMissing:
        return [toolkit.DEFAULT_ARCH]
    return [device_arch()]


def multiprocessors() -> int:
    return int(cupy().cuda.Device().attributes["MultiProcessorCount"])


@cache
def _module_for(kernel: str, arch: str, cubin: str):
    return cupy().RawModule(path=cubin)


@cache
def load(kernel: str):
    """The kernel source's module for the current device (a stage's name, or another source under kernels/),
    built (or found in the cache) for its arch once per process, so a launch costs no file hashing."""
    result = build.build(kernel, device_arch())
    try:
        return _module_for(kernel, result.arch, str(result.cubin))
    except Exception as error:  # a cubin the driver refuses: wrong arch, too new a toolkit
        raise GpuMissing(f"the {kernel} cubin for {result.arch} does not load on this GPU/driver: {error}") from None


@cache
def target(kernel: str) -> Target:
    """What launch plans for `kernel` on the current device are made for."""
    result = build.build(kernel, device_arch())
    return Target.make(result.arch, multiprocessors(), result.constants)


def launcher(spec: StageSpec):
    """kdt/launch/<stage>.py: the stage's `Knobs` and `plan`."""
    return importlib.import_module(f"kdt.launch.{spec.module_name}")
