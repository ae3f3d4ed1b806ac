"""The GPU side of kdt: CuPy, the current device, and the kernels' modules loaded from their cubins.

Nothing here is imported until a command needs a GPU, so the CPU-only parts of kdt never need CuPy.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from kdt import arches, build, paths
from kdt.launch.plan import Target
from kdt.spec import StageSpec
from kdt.refs.errors import BadInput


class GpuMissing(Exception):
    """No CuPy, no GPU, or a GPU kdt cannot build for: the environment cannot run kernels (exit code 2)."""


@cache
def cupy():
    try:
        module = importlib.import_module("cupy")
    except Exception as error:  # ImportError, or a CuPy built for another CUDA failing to load its libraries
        raise GpuMissing(f"CuPy is not importable ({type(error).__name__}: {error}); "
                         f"install it with `{paths.install_command('gpu')}`") from None
    try:
        count = module.cuda.runtime.getDeviceCount()
    except Exception as error:
        raise GpuMissing(f"no usable GPU ({type(error).__name__}: {error})") from None
    if count < 1:
        raise GpuMissing("no GPU: CUDA reports no device")
    return module


@dataclass(frozen=True)
class Selection:
    """What this process runs on the GPU: an arch other than the GPU's own (an emulation target such as
    sm_120-emu, or sm_90 for Hopper's portable build), the multiprocessor count plans are made for (an emulated
    GPU's), and the kernel sources (another revision's, for kdt bench --against). None: the GPU's own, kdt's own."""

    arch: str | None = None
    multiprocessors: int | None = None
    kernels_dir: Path | None = None


_selection = Selection()


def select(arch: str | None = None, multiprocessors: int | None = None, kernels_dir: Path | None = None) -> None:
    """Run the kernels built for `arch` (it must run on this GPU) from the sources in `kernels_dir`, with plans made
    for `multiprocessors` SMs, for the rest of the process (the commands' --arch and --sms). BadInput for an unknown
    arch or a count below 1."""
    global _selection
    if arch is not None and arch not in arches.ARCHES:
        raise BadInput("--arch", "one of " + ", ".join(arches.names()), arch)
    if multiprocessors is not None and multiprocessors < 1:
        raise BadInput("--sms", "a multiprocessor count >= 1", multiprocessors)
    _selection = Selection(arch, multiprocessors, kernels_dir)


@contextmanager
def selected(arch: str | None = None, multiprocessors: int | None = None, kernels_dir: Path | None = None):
    """`select` for the body of a with-statement (kdt bench times one shape on several arches, or two builds, this
    way)."""
    before = _selection
    select(arch, multiprocessors, kernels_dir)
    try:
        yield
    finally:
        select(before.arch, before.multiprocessors, before.kernels_dir)


def current() -> Selection:
    return _selection


@contextmanager
def sources(kernels_dir: Path | None):
    """The current selection with the kernels built from `kernels_dir` (another revision's, for kdt bench
    --against), for the body of a with-statement."""
    with selected(_selection.arch, _selection.multiprocessors, kernels_dir):
        yield


@cache
def _gpu(device_id: int) -> tuple[str, int]:
    """(compute capability as an arch name, multiprocessors) of a device: asked once, as every launch needs them."""
    device = cupy().cuda.Device(device_id)
    return f"sm_{device.compute_capability}", int(device.attributes["MultiProcessorCount"])  # CuPy: "90" for 9.0


def gpu_arch() -> str:
    """The current GPU's compute capability as an arch name (sm_90 for 9.0)."""
    return _gpu(cupy().cuda.get_device_id())[0]


def device_arch() -> str:
    """The arch whose cubins this process runs: the selected one, else the one kdt builds for this GPU (sm_90a on
    Hopper). GpuMissing where that cannot run here, with what can."""
    gpu = gpu_arch()
    if _selection.arch is not None:
        chosen = arches.get(_selection.arch)
        if gpu not in chosen.runs_on:
            emulation = [name for name in arches.emulations_for(gpu) if arches.get(name).emulates == chosen.name]
            hint = f"; --arch {emulation[0]} runs its configuration here" if emulation else ""
            raise GpuMissing(f"this GPU is {gpu}: {chosen.name} cubins run on {', '.join(chosen.runs_on)} only{hint}")
        return chosen.name
    native = arches.NATIVE.get(gpu, gpu)
    if native not in arches.ARCHES:
        raise GpuMissing(f"this GPU is {gpu}; kdt builds its kernels for {', '.join(arches.names())} only "
                         "(--arch builds for another)")
    return native


def default_arches() -> list[str]:
    """The arch of the GPU present (GpuMissing for one kdt cannot build for), else sm_120 (the primary target)."""
    try:
        cupy()
    except GpuMissing:
        return [arches.DEFAULT]
    return [device_arch()]


def multiprocessors() -> int:
    """The multiprocessor count plans are made for: the selected one, else the GPU's."""
    if _selection.multiprocessors is not None:
        return _selection.multiprocessors
    return _gpu(cupy().cuda.get_device_id())[1]


@cache
def _module_for(kernel: str, arch: str, cubin: str):
    return cupy().RawModule(path=cubin)


def load(kernel: str):
    """The kernel source's module for the current device and selection (a stage's name, or another source under
    kernels/), built (or found in the cache) once per process, arch and source tree, so a launch costs no file
    hashing."""
    return _load(kernel, device_arch(), _selection.kernels_dir)


@cache
def _load(kernel: str, arch: str, kernels_dir: Path | None = None):
    result = build.build(kernel, arch, kernels_dir=kernels_dir)
    try:
        return _module_for(kernel, result.arch, str(result.cubin))
    except Exception as error:  # a cubin the driver refuses: wrong arch, too new a toolkit
        raise GpuMissing(f"the {kernel} cubin for {result.arch} does not load on this GPU/driver: {error}") from None


def target(kernel: str) -> Target:
    """What launch plans for `kernel` on the current device and selection are made for."""
    return _target(kernel, device_arch(), multiprocessors(), _selection.kernels_dir)


@cache
def _target(kernel: str, arch: str, count: int, kernels_dir: Path | None = None) -> Target:
    return Target.make(arch, count, build.build(kernel, arch, kernels_dir=kernels_dir).constants)


def launcher(spec: StageSpec):
    """kdt/launch/<stage>.py: the stage's `Knobs` and `plan`."""
    return importlib.import_module(f"kdt.launch.{spec.module_name}")
