"""`kdt env-check`: what this machine can do for kdt, one row a check, each with a fix where it fails."""

from __future__ import annotations

import importlib.metadata
from dataclasses import asdict, dataclass

from kdt import arches, paths, toolkit

REQUIRED_PACKAGES = ("numpy", "h5py", "ml_dtypes", "typer", "rich", "pyelftools")   # pyelftools: a new build
OPTIONAL_PACKAGES = {"cuda-pathfinder": "finds nvcc in pip-installed CUDA toolkits",
                     "hypothesis": "property tests (extra `test`)", "pytest": "the test suite (extra `test`)",
                     "nvidia-ml-py": "kdt bench reads the SM clock while it times (extra `gpu`)"}
PROBE_ARCHES = ("sm_90", "sm_120")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    required: bool
    finding: str
    fix: str = ""


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def default_arch() -> str:
    """The arch kdt builds for the first GPU present (sm_90a on an H200), else sm_120 (the primary target)."""
    report = toolkit.gpu_report()
    if report.gpus:
        return arches.NATIVE.get(report.gpus[0].arch, report.gpus[0].arch)
    return arches.DEFAULT


def run_checks(arch: str = arches.DEFAULT, require_gpu: bool = False) -> list[Check]:
    checks = []
    for name in REQUIRED_PACKAGES:
        version = _package_version(name)
        checks.append(Check(f"package {name}", version is not None, True, version or "not installed",
                            "" if version else paths.install_command()))
    for name, why in OPTIONAL_PACKAGES.items():
        version = _package_version(name)
        checks.append(Check(f"package {name}", version is not None, False, version or f"not installed ({why})",
                            "" if version else f"python3 -m pip install {name}"))

    nvcc = toolkit.find_nvcc()
    checks.append(Check("nvcc", nvcc is not None, True,
                        f"{nvcc.path} (found on {nvcc.found_by}), CUDA {nvcc.version}" if nvcc else "not found",
                        "" if nvcc else "install the CUDA toolkit (13.x) and put its bin/ on PATH or set CUDA_HOME"))
    if nvcc:
        for target in dict.fromkeys((*PROBE_ARCHES, arch)):
            ok, message = toolkit.probe_compile(nvcc, target)
            checks.append(Check(f"compile {target}", ok, target == arch,
                                "a probe kernel compiled to a cubin" if ok else f"failed: {message[:300]}",
                                "" if ok else f"use an nvcc that supports {target} (CUDA 12.8+ for sm_120)"))

    report = toolkit.gpu_report()
    cupy_ok = report.cupy_version is not None
    checks.append(Check("cupy", cupy_ok, require_gpu,
                        f"{report.cupy_version}" if cupy_ok else f"not importable ({report.cupy_error})",
                        "" if cupy_ok else paths.install_command("gpu")))
    if cupy_ok:
        if report.error:
            checks.append(Check("gpu", False, require_gpu, f"no usable GPU: {report.error}",
                                "run on a machine with an NVIDIA GPU and driver"))
        elif not report.gpus:
            checks.append(Check("gpu", False, require_gpu, "no GPU found", "run on a machine with an NVIDIA GPU"))
        else:
            checks.append(Check("cuda driver / runtime", True, False,
                                f"driver supports CUDA {report.driver_version}, runtime {report.runtime_version}"))
            for gpu in report.gpus:
                checks.append(Check(f"gpu {gpu.index}", True, require_gpu,
                                    f"{gpu.name}, {gpu.arch}, {gpu.memory_gib:.0f} GiB, {gpu.multiprocessors} SMs"))
            target = arches.get(arch)
            matches = any(gpu.arch in target.runs_on for gpu in report.gpus)
            checks.append(Check(f"gpu arch {arch}", matches, require_gpu,
                                ("a GPU that runs " + (f"the {target.emulates} configuration (emulated)"
                                                       if target.emulates else "its cubins")) if matches
                                else f"GPUs are {', '.join(sorted({g.arch for g in report.gpus}))}",
                                "" if matches else _arch_fix(arch, report.gpus[0].arch)))
    else:
        checks.append(Check("gpu", False, require_gpu, "not looked for: kdt finds GPUs through CuPy",
                            "install CuPy first"))
    return checks


def _arch_fix(arch: str, gpu: str) -> str:
    """What to do on a GPU of another arch than --arch: emulate it where an emulation target exists, else target
    the GPU present."""
    emulation = [name for name in arches.emulations_for(gpu) if arches.get(name).emulates == arch.removesuffix("a")]
    native = arches.NATIVE.get(gpu, gpu)
    if emulation:
        sms = arches.get(emulation[0]).multiprocessors
        return (f"this {gpu} GPU cannot run {arch} cubins, but it runs the {arch} configuration: pass --arch "
                f"{emulation[0]} to kdt verify / bench / fuzz / sanitize / pipeline (with --sms 70 for an RTX 5070 "
                f"Ti, {sms} for an RTX PRO 6000), or --arch {native} to target this GPU")
    return f"pass --arch {native} to target this GPU"


def passed(checks: list[Check]) -> bool:
    return all(check.ok for check in checks if check.required)


def as_json(checks: list[Check]) -> dict:
    return {"ok": passed(checks), "checks": [asdict(check) for check in checks]}
