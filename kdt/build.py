"""`kdt build`: nvcc to one cubin per kernel source and arch, cached by everything that shapes the binary.

A kernel source is `kernels/<name with _>.cu`: one per stage (named like the stage) and the pipeline's synthetic
models (`synthetic-target`). The cache key covers the source, every header it includes from kernels/
(recursively), the flags, the arch and nvcc's version, so an unchanged kernel is never compiled twice. Cubins, not
PTX: PTX from a newer nvcc does not load on an older driver. Warnings are errors.

Next to each cubin its report (JSON): the resources ptxas gave each entry function, the byte size of each of its
parameters and the launch constants the source exports (`extern "C" __constant__ int kdt_*`), the last two read
from the cubin's ELF sections on the CPU, so launch plans can be made, printed and checked against the entry points
they call without a GPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kdt import arches, paths, toolkit

KERNELS_DIR = paths.KERNELS
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
    parameters: tuple[int, ...]    # the byte size of each parameter, in order (from the cubin: kernel_parameters)


@dataclass
class BuildResult:
    kernel: str
    arch: str
    cubin: Path
    cached: bool
    resources: list[FunctionResources] = field(default_factory=list)
    constants: dict[str, int] = field(default_factory=dict)   # the cubin's exported kdt_* launch constants


def cache_dir() -> Path:
    root = os.environ.get("KDT_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kdt"
    return Path(root) / "cubins"


def kernel_name(kernel) -> str:
    """A kernel source's name: a stage spec's name, or the name itself."""
    return kernel if isinstance(kernel, str) else kernel.name


def source_path(kernel, kernels_dir: Path | None = None) -> Path:
    return (kernels_dir or KERNELS_DIR) / f"{kernel_name(kernel).replace('-', '_')}.cu"


def kernel_names() -> list[str]:
    """Every kernel source under kernels/, by name (`tree_build.cu` -> `tree-build`)."""
    return sorted(path.stem.replace("_", "-") for path in KERNELS_DIR.glob("*.cu"))


def _included_files(source: Path, seen: set[Path] | None = None, root: Path | None = None) -> list[Path]:
    """Headers reached through #include "..." from the kernels directory or next to the including file."""
    seen = set() if seen is None else seen
    root = root or KERNELS_DIR
    found = []
    for name in INCLUDE.findall(source.read_text()):
        for base in (source.parent, root):
            candidate = (base / name).resolve()
            if candidate.is_file() and candidate not in seen:
                seen.add(candidate)
                found.append(candidate)
                found.extend(_included_files(candidate, seen, root))
                break
    return found


def cache_key(source: Path, arch: str, nvcc_version: str, flags: tuple[str, ...] = NVCC_FLAGS,
              kernels_dir: Path | None = None) -> str:
    digest = hashlib.sha256()
    for part in (source.name, source.read_bytes(), arch, nvcc_version, " ".join(flags)):
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    for header in sorted(_included_files(source, root=kernels_dir or KERNELS_DIR)):
        digest.update(header.name.encode() + b"\0" + header.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_PROPS = re.compile(r"Function properties for (\w+)\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                    r"(\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas(log: str, parameters: dict[str, tuple[int, ...]]) -> list[FunctionResources]:
    """Registers, shared memory, stack and spills per entry function from `-Xptxas -v` output, with the function's
    parameter sizes from `parameters` (kernel_parameters of the cubin; a function absent there takes none)."""
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
        out.append(FunctionResources(name, registers, shared, frame, spill_st, spill_ld, parameters.get(name, ())))
    return out


def elf_reader():
    """pyelftools' ELFFile, which reads a new cubin's records. It is one of kdt's dependencies; a checkout run where
    it is missing (a bare GPU image) gets ToolkitMissing (exit 2) before nvcc runs, not a traceback after it."""
    try:
        from elftools.elf.elffile import ELFFile
    except ModuleNotFoundError:
        raise toolkit.ToolkitMissing("pyelftools is not installed, and kdt build reads each new cubin's parameter "
                                     "records and constants with it: python3 -m pip install pyelftools (or install "
                                     "kdt, which depends on it); cubins already in the cache need no build") from None
    return ELFFile


def exported_constants(cubin: Path) -> dict[str, int]:
    """`extern "C" __constant__ int kdt_*` of a cubin: name -> value, from its ELF symbol table."""
    ELFFile = elf_reader()
    constants = {}
    with open(cubin, "rb") as handle:
        elf = ELFFile(handle)
        symbols = elf.get_section_by_name(".symtab")
        for symbol in symbols.iter_symbols() if symbols else ():
            if not symbol.name.startswith("kdt_") or symbol["st_size"] != 4:
                continue
            section = elf.get_section(symbol["st_shndx"]) if isinstance(symbol["st_shndx"], int) else None
            if section is None or not section.name.startswith(".nv.constant"):
                continue
            start = symbol["st_value"]
            constants[symbol.name] = int.from_bytes(section.data()[start:start + 4], "little", signed=True)
    return constants


EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4   # the formats of an .nv.info attribute's value
EIATTR_KPARAM_INFO = 0x17


def kernel_parameters(cubin: Path) -> dict[str, tuple[int, ...]]:
    """Entry function -> the byte size of each of its parameters, in order, from the cubin's `.nv.info.<function>`
    sections: what the driver copies from a launch's argument array, so a launch can be checked against it on the
    CPU. ValueError for a section kdt cannot read."""
    ELFFile = elf_reader()
    prefix = ".nv.info."
    with open(cubin, "rb") as handle:
        return {section.name[len(prefix):]: _parameter_sizes(section.data(), section.name)
                for section in ELFFile(handle).iter_sections() if section.name.startswith(prefix)}


def _parameter_sizes(info: bytes, section: str) -> tuple[int, ...]:
    """The sizes in the EIATTR_KPARAM_INFO attributes of an `.nv.info.<function>` section, by ordinal. Each attribute
    is a format byte, an attribute byte and its value: none (NVAL), 2 bytes (BVAL, HVAL), or a little-endian u16
    size and that many bytes (SVAL). KPARAM_INFO's 12 are u32 index, u16 ordinal, u16 offset and u32 flags whose
    bits 18..31 are the size."""
    sizes, at = {}, 0
    while at + 2 <= len(info) and info[at] != 0:
        form, attribute = info[at], info[at + 1]
        if form == EIFMT_NVAL:
            at += 2
        elif form in (EIFMT_BVAL, EIFMT_HVAL):
            at += 4
        elif form == EIFMT_SVAL:
            size = int.from_bytes(info[at + 2:at + 4], "little")
            if at + 4 + size > len(info):
                raise ValueError(f"{section}: an attribute at byte {at} runs past the section's end")
            value = info[at + 4:at + 4 + size]
            if attribute == EIATTR_KPARAM_INFO:
                sizes[int.from_bytes(value[4:6], "little")] = int.from_bytes(value[8:12], "little") >> 18
            at += 4 + size
        else:
            raise ValueError(f"{section}: an attribute of unknown format {form:#x} at byte {at}")
    if sorted(sizes) != list(range(len(sizes))):   # a gap: some parameter's record was not read
        raise ValueError(f"{section}: parameter ordinals {sorted(sizes)} are not 0..{len(sizes) - 1}")
    return tuple(sizes[ordinal] for ordinal in range(len(sizes)))


def _read_report(path: Path) -> dict | None:
    """A cached build's report, or None where it is missing or from an older kdt (then the kernel is rebuilt)."""
    try:
        report = json.loads(path.read_text())
        report["resources"] = [FunctionResources(**{**item, "parameters": tuple(item["parameters"])})
                               for item in report["resources"]]
        report["constants"] = dict(report["constants"])
        str(report["sha256"])
        return report
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _shared_mode() -> int:
    """Cubins and reports are readable by the group and others whatever the umask (a cache shared between CI users);
    writable as the umask allows."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o644 | (0o666 & ~mask)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _say(message: str) -> None:
    from kdt.console import errors

    errors.print(message, markup=False, highlight=False, soft_wrap=True)


def build(kernel, arch: str, nvcc: toolkit.Nvcc | None = None, force: bool = False,
          kernels_dir: Path | None = None) -> BuildResult:
    """The cubin of `kernel` (a stage, or the name of another source under kernels/) for `arch`, from the cache
    (checked against the digest recorded when it was built) or from nvcc. `kernels_dir` builds another tree of
    sources (another revision's, for kdt bench --against)."""
    name = kernel_name(kernel)
    source = source_path(name, kernels_dir)
    if not source.is_file():
        raise BuildError(name, arch, f"no kernel source at {source}")
    nvcc = nvcc or toolkit.find_nvcc()
    if nvcc is None:
        raise toolkit.ToolkitMissing("nvcc not found (PATH, CUDA_HOME, cuda-pathfinder): cannot build kernels")
    key = cache_key(source, arch, nvcc.version, kernels_dir=kernels_dir)
    directory = cache_dir()
    cubin = directory / f"{source.stem}.{arch}.{key}.cubin"
    report = cubin.with_suffix(".json")
    cached = _read_report(report) if cubin.is_file() and not force else None
    if cached is not None:
        if _digest(cubin) == cached["sha256"]:
            return BuildResult(name, arch, cubin, True, cached["resources"], cached["constants"])
        _say(f"kdt build: the cached {cubin.name} does not match the digest recorded when it was built (truncated or "
             "overwritten): rebuilding it")
    elf_reader()   # before a minute of nvcc whose cubin could not be read
    directory.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{cubin.name}.", dir=directory)
    os.close(handle)
    command = [str(nvcc.path), *NVCC_FLAGS, *arches.get(arch).nvcc_flags(), "-I", str(source.parent), str(source),
               "-o", temporary]
    _say(f"kdt build: compiling {name} for {arch} (nvcc; up to a minute for the largest kernels) ...")
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        log = done.stdout + done.stderr
        if done.returncode != 0:
            messages = [line for line in log.splitlines() if "ptxas info" not in line and "bytes stack frame" not in line]
            raise BuildError(name, arch, "\n".join(messages).strip())
        try:
            resources = parse_ptxas(log, kernel_parameters(Path(temporary)))
        except ValueError as error:
            raise BuildError(name, arch, f"its cubin's parameter records cannot be read: {error}") from None
        constants = exported_constants(Path(temporary))
        digest = _digest(Path(temporary))
        os.chmod(temporary, _shared_mode())
        os.replace(temporary, cubin)
        _write_atomically(report, json.dumps({"resources": [asdict(r) for r in resources], "constants": constants,
                                              "sha256": digest}))
    finally:
        Path(temporary).unlink(missing_ok=True)
    _say(f"kdt build: compiled {name} for {arch} in {time.perf_counter() - started:.0f} s")
    return BuildResult(name, arch, cubin, False, resources, constants)


def _write_atomically(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.chmod(temporary, _shared_mode())
        os.replace(temporary, path)
    finally:
        Path(temporary).unlink(missing_ok=True)
