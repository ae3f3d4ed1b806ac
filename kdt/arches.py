"""The targets kdt builds for, as plain data: what nvcc is told, which GPUs run the cubins, and the limits every
function of a cubin is held to (`kdt build` checks them: kdt/limits.py).

`sm_120-emu` is the emulation target: the sm_120 configuration (KDT_SM120_CONFIG in kernels/common/arch.cuh:
99 KB of shared memory per block, clusters of at most 8, mma.sync) compiled for plain sm_90 so that it runs, and
is verified, fuzzed, sanitized and timed, on an H200. Plans for it are made for an sm_120 GPU's multiprocessor
count (`--sms 70` for an RTX 5070 Ti, 188 for an RTX PRO 6000), so the grids and splits verified are the user's.
"""

from __future__ import annotations

from dataclasses import dataclass

KB = 1024


@dataclass(frozen=True)
class Arch:
    name: str                       # what kdt calls it: sm_90a, sm_120, sm_120-emu
    code: str                       # the nvcc target (compute_XX / sm_XX)
    runs_on: tuple[str, ...]        # compute capabilities of the GPUs that run its cubins
    smem_per_sm: int                # shared memory of a multiprocessor, for all its resident blocks, bytes
    threads_per_sm: int             # resident threads of a multiprocessor
    max_cluster: int                # blocks per cluster (above 8: the non-portable opt-in)
    multiprocessors: int            # a typical GPU's, for plans made without one
    gpus: str                       # which GPUs, in words
    defines: tuple[str, ...] = ()   # extra -D flags
    emulates: str | None = None     # the arch whose configuration this target runs elsewhere
    max_threads: int = 1024
    max_registers: int = 255
    registers_per_sm: int = 65536
    smem_reserved_per_block: int = 1024  # what the driver keeps of the multiprocessor's shared memory per block

    @property
    def smem_per_block(self) -> int:
        """Dynamic + static shared memory one block may use, bytes: the multiprocessor's less the driver's share."""
        return self.smem_per_sm - self.smem_reserved_per_block

    def nvcc_flags(self) -> list[str]:
        number = self.code.removeprefix("sm_")
        return [f"-gencode=arch=compute_{number},code=sm_{number}", *(f"-D{d}" for d in self.defines)]


_HOPPER = dict(smem_per_sm=228 * KB, threads_per_sm=2048, max_cluster=16, multiprocessors=132, gpus="H100, H200")
_BLACKWELL_DC = dict(smem_per_sm=228 * KB, threads_per_sm=2048, max_cluster=16, multiprocessors=148, gpus="B200")
_BLACKWELL_RTX = dict(smem_per_sm=100 * KB, threads_per_sm=1536, max_cluster=8, multiprocessors=188,
                      gpus="RTX PRO 6000 Blackwell (188 SMs), RTX 5070 Ti (70 SMs)")

ARCHES: dict[str, Arch] = {arch.name: arch for arch in (
    Arch("sm_90", "sm_90", ("sm_90",), **_HOPPER),
    Arch("sm_90a", "sm_90a", ("sm_90",), **_HOPPER),
    Arch("sm_100", "sm_100", ("sm_100",), **_BLACKWELL_DC),
    Arch("sm_100a", "sm_100a", ("sm_100",), **_BLACKWELL_DC),
    Arch("sm_120", "sm_120", ("sm_120",), **_BLACKWELL_RTX),
    Arch("sm_120a", "sm_120a", ("sm_120",), **_BLACKWELL_RTX),
    Arch("sm_120-emu", "sm_90", ("sm_90",), defines=("KDT_EMULATE_SM120",), emulates="sm_120", **_BLACKWELL_RTX),
)}

DEFAULT = "sm_120"                  # the project's primary target
# the arch kdt builds for a GPU of this compute capability: Hopper gets its arch-specific target (wgmma)
NATIVE = {"sm_90": "sm_90a", "sm_100": "sm_100a", "sm_120": "sm_120"}


def get(name: str) -> Arch:
    """The arch named `name` (ValueError naming the known ones otherwise)."""
    if name not in ARCHES:
        raise ValueError(f"arch: expected one of {', '.join(ARCHES)}, got {name!r}")
    return ARCHES[name]


def names() -> tuple[str, ...]:
    return tuple(ARCHES)


def emulations_for(gpu: str) -> list[str]:
    """The emulation targets a GPU of compute capability `gpu` runs."""
    return [arch.name for arch in ARCHES.values() if arch.emulates and gpu in arch.runs_on]
