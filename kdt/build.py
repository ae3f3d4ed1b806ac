"""`kdt build`: nvcc to one cubin per kernel and arch, cached by everything that shapes the binary.

The cache key covers the kernel source, every header it includes from kernels/ (recursively), the flags,
the arch and nvcc's version, so an unchanged kernel is never compiled twice. Cubins, not PTX: PTX from a
newer nvcc does not load on an older driver. Warnings are errors.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kdt import toolkit
from kdt.spec import StageSpec

# KDT_KERNELS_DIR points kdt at another tree of kernel sources (a fork under test, a broken one in tests).
KERNELS_DIR = Path(os.environ.get("KDT_KERNELS_DIR") or Path(__file__).resolve().parents[1] / "kernels")
NVCC_FLAGS = ("-cubin", "-O3", "-std=c++17", "-lineinfo", "-Werror", "all-warnings", "-Xptxas", "-v")
COMPILE_TIMEOUT_S = 600
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


class BuildError(Exception):
    """A kernel that does not compile (exit code 2): nvcc's messages, with file and line."""

    def __init__(self, kernel: str, arch: str, log: str):
        self.kernel, self.arch, self.log = kernel, arch, log
        super().__init__(f"{kernel} ({arch}) does not compile:\n{log}")


@dataclass(frozen=True)
class FunctionResources:
    function: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int


@dataclass
class BuildResult:
    kernel: str
    arch: str
    cubin: Path
    cached: bool
    resources: list[FunctionResources] = field(default_factory=list)


def cache_dir() -> Path:
    root = os.environ.get("KDT_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kdt"
    return Path(root) / "cubins"


def source_path(spec: StageSpec) -> Path:
    return KERNELS_DIR / f"{spec.module_name}.cu"


def _included_files(source: Path, seen: set[Path] | None = None) -> list[Path]:
    """Headers reached through #include "..." from kernels/ or next to the including file."""
    seen = set() if seen is None else seen
    found = []
    for name in INCLUDE.findall(source.read_text()):
        for base in (source.parent, KERNELS_DIR):
            candidate = (base / name).resolve()
            if candidate.is_file() and candidate not in seen:
                seen.add(candidate)
                found.append(candidate)
                found.extend(_included_files(candidate, seen))
                break
    return found


def cache_key(source: Path, arch: str, nvcc_version: str, flags: tuple[str, ...] = NVCC_FLAGS) -> str:
    digest = hashlib.sha256()
    for part in (source.name, source.read_bytes(), arch, nvcc_version, " ".join(flags)):
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    for header in sorted(_included_files(source)):
        digest.update(header.name.encode() + b"\0" + header.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_PROPS = re.compile(r"Function properties for (\w+)\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                    r"(\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas(log: str) -> list[FunctionResources]:
    """Registers, shared memory, stack and spills per entry function from `-Xptxas -v` output."""
    stack = {m.group(1): (int(m.group(2)), int(m.group(3)), int(m.group(4))) for m in _PROPS.finditer(log)}
    out = []
    lines = log.splitlines()
    for i, line in enumerate(lines):
        entry = _ENTRY.search(line)
        if not entry:
            continue
        name = entry.group(1)
        registers = shared = 0
        for follow in lines[i + 1: i + 6]:
            used = _USED.search(follow)
            if used:
                registers = int(used.group(1))
                shared = int(used.group(2) or 0)
                break
        frame, spill_st, spill_ld = stack.get(name, (0, 0, 0))
        out.append(FunctionResources(name, registers, shared, frame, spill_st, spill_ld))
    return out


def build(spec: StageSpec, arch: str, nvcc: toolkit.Nvcc | None = None, force: bool = False) -> BuildResult:
    source = source_path(spec)
    if not source.is_file():
        raise BuildError(spec.name, arch, f"no kernel source at {source}")
    nvcc = nvcc or toolkit.find_nvcc()
    if nvcc is None:
        raise toolkit.ToolkitMissing("nvcc not found (PATH, CUDA_HOME, cuda-pathfinder): cannot build kernels")
    key = cache_key(source, arch, nvcc.version)
    directory = cache_dir()
    cubin = directory / f"{spec.module_name}.{arch}.{key}.cubin"
    report = cubin.with_suffix(".json")
    if cubin.is_file() and report.is_file() and not force:
        resources = [FunctionResources(**item) for item in json.loads(report.read_text())]
        return BuildResult(spec.name, arch, cubin, True, resources)
    directory.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{cubin.name}.", dir=directory)
    os.close(handle)
    command = [str(nvcc.path), *NVCC_FLAGS, toolkit.arch_flag(arch), "-I", str(KERNELS_DIR), str(source),
               "-o", temporary]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        log = done.stdout + done.stderr
        if done.returncode != 0:
            messages = [line for line in log.splitlines() if "ptxas info" not in line and "bytes stack frame" not in line]
            raise BuildError(spec.name, arch, "\n".join(messages).strip())
        resources = parse_ptxas(log)
        report.write_text(json.dumps([asdict(r) for r in resources]))
        os.replace(temporary, cubin)
    finally:
        Path(temporary).unlink(missing_ok=True)
    return BuildResult(spec.name, arch, cubin, False, resources)
