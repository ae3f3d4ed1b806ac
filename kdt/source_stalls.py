"""`kdt profile --lines`: where a kernel's warps stall, by source line, with the calls inlined on the way there.

Nsight Compute samples the state of the warps every few cycles; with its SourceCounters section it keeps the
samples per SASS instruction, and `ncu -i REPORT --page source --csv --print-source sass` prints them: per kernel a
`"Kernel Name","<function>"` line, a header, then one row per instruction (its address, the samples, the samples
per stall reason). nvdisasm's line table (`nvdisasm -gi CUBIN`; kdt builds with -lineinfo) gives each instruction
its source line and the chain of calls inlined into it. Summed per chain, the samples say where the warps wait and
through which calls they got there: a cluster barrier reached from three call sites is three rows.

Samples are per warp: a line where 15 warps of a block wait while one works gets 15 times the samples of the work.
A warp waiting at a barrier is sampled at the instruction after it, so the row names the line issued next and its
reason (barrier) says what it waits for. Both runs (ncu's, then nvdisasm on the same cubin) are the child's
`kdt bench` or `kdt verify` under ncu, as for the rest of `kdt profile`.
"""

from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

SECTIONS = ("SourceCounters", "WarpStateStats")
SAMPLES = "Warp Stall Sampling (All Samples)"
REASON = re.compile(r"^stall_(\w+)$")          # per-reason columns; their "(Not Issued)" twins are left out
LOCATION = re.compile(r'"([^"]+)", line (\d+)')


@dataclass
class InstructionSamples:
    offset: int                                  # bytes from the function's first instruction
    samples: int
    reasons: dict[str, int] = field(default_factory=dict)


@dataclass
class LineStalls:
    chain: tuple[str, ...]                       # "file:line" frames, the kernel's outermost first
    samples: int
    share: float                                 # of the function's samples
    reasons: dict[str, int] = field(default_factory=dict)

    def top_reasons(self, count: int = 2) -> list[tuple[str, int]]:
        return sorted(((r, n) for r, n in self.reasons.items() if n > 0), key=lambda item: (-item[1], item[0]))[:count]


def frame(path: str, line: str | int) -> str:
    """A location as the table shows it: the path below kernels/ (or the file name), and the line."""
    parts = Path(path).parts
    inside = parts[len(parts) - 1 - parts[::-1].index("kernels") + 1:] if "kernels" in parts else parts[-1:]
    return f"{'/'.join(inside)}:{line}"


def instruction_chains(disassembly: str, function: str) -> dict[int, tuple[str, ...]]:
    """nvdisasm -gi output -> {offset of each instruction of `function`: its chain, outermost frame first}. A run
    of `//## File "A", line 3 inlined at "B", line 7` comments (innermost first) applies to the instructions that
    follow it, up to the next run."""
    chains: dict[int, tuple[str, ...]] = {}
    pending: list[str] = []
    current: tuple[str, ...] = ()
    inside = False
    for text in disassembly.splitlines():
        if text.lstrip().startswith(".section"):   # .section .text.<function>,"ax",@progbits
            inside = f".text.{function}," in text
            continue
        if text.lstrip().startswith("//## File"):
            pending.append(text)
            continue
        match = re.match(r"\s+/\*([0-9a-f]{4,})\*/", text)
        if not match:
            continue
        if pending:
            current = tuple(frame(*LOCATION.search(line).groups()) for line in reversed(pending))
            pending = []
        if inside:
            chains[int(match.group(1), 16)] = current
    return chains


def source_page(text: str) -> dict[str, list[InstructionSamples]]:
    """ncu's source page (--csv --print-source sass) -> {function: its instructions' samples}; offsets are from
    the first instruction listed (the function's entry). Lines that are not the page's CSV are passed over."""
    pages: dict[str, list[InstructionSamples]] = {}
    function, header, base = None, None, None
    for line in text.splitlines():
        if not line.startswith('"'):
            continue
        cells = next(csv.reader([line]))
        if cells[:1] == ["Kernel Name"]:
            function, header, base = cells[1], None, None
            pages[function] = []
            continue
        if function is None:
            continue
        if cells[:1] == ["Address"]:
            header = cells
            continue
        if header is None or len(cells) != len(header) or not cells[0].startswith("0x"):
            continue
        address = int(cells[0], 16)
        base = address if base is None else base
        row = dict(zip(header, cells))
        reasons = {m.group(1): _count(row[name]) for name in header if (m := REASON.match(name))}
        pages[function].append(InstructionSamples(address - base, _count(row.get(SAMPLES, "")), reasons))
    return pages


def _count(cell: str) -> int:
    try:
        return int(float(cell.replace(",", "")))
    except ValueError:
        return 0


def by_chain(instructions: Sequence[InstructionSamples], chains: dict[int, tuple[str, ...]]) -> list[LineStalls]:
    """The samples summed per chain, most first (ties by chain); an instruction the line table does not cover
    counts as chain ()."""
    total = sum(item.samples for item in instructions)
    summed: dict[tuple[str, ...], LineStalls] = {}
    for item in instructions:
        if not item.samples:
            continue
        chain = chains.get(item.offset, ())
        row = summed.setdefault(chain, LineStalls(chain, 0, 0.0))
        row.samples += item.samples
        for reason, count in item.reasons.items():
            row.reasons[reason] = row.reasons.get(reason, 0) + count
    for row in summed.values():
        row.share = row.samples / total if total else 0.0
    return sorted(summed.values(), key=lambda row: (-row.samples, row.chain))


def ncu_command(ncu: Path | str, kernel_regex: str, launch_skip: int, launch_count: int, report: Path | str,
                child: Sequence[str]) -> list[str]:
    """ncu around `child`, keeping the source counters of the same launches as kdt profile's first run in
    `report` (ncu adds .ncu-rep)."""
    line = [str(ncu), "--clock-control", "none", "--kernel-name", kernel_regex, "--launch-skip", str(launch_skip),
            "--launch-count", str(launch_count), "--export", str(report), "--force-overwrite"]
    for section in SECTIONS:
        line += ["--section", section]
    return line + list(child)


def import_command(ncu: Path | str, report: Path | str) -> list[str]:
    return [str(ncu), "--import", str(report), "--page", "source", "--csv", "--print-source", "sass"]


def source_text(chain: tuple[str, ...], kernels_dir: Path) -> str:
    """The innermost frame's source line (stripped), where it is a file under `kernels_dir`."""
    if not chain:
        return ""
    name, _, line = chain[-1].rpartition(":")
    try:
        return _source_lines(kernels_dir / name)[int(line) - 1].strip()
    except (OSError, IndexError, ValueError):
        return ""


@functools.lru_cache(maxsize=64)
def _source_lines(path: Path) -> tuple[str, ...]:
    """A kernel source's lines, read once however many rows name it."""
    return tuple(path.read_text(errors="replace").splitlines())


@dataclass
class SourceStalls:
    """The second run under ncu: per profiled function its samples by chain (empty: the run gave none)."""

    command: list[str]
    returncode: int | None
    output: str
    functions: dict[str, list[LineStalls]] = field(default_factory=dict)


def run(child: Sequence[str], functions: Sequence[str], *, ncu: Path | str, nvdisasm: Path | str, cubin: Path,
        timeout_s: float, runner=None, env=None) -> SourceStalls:
    """`child` under ncu with the source counters of the same launches as kdt profile's first run, the report
    printed as its source page, each function's instructions mapped through nvdisasm's line table of `cubin`."""
    import subprocess
    import tempfile

    from kdt import profile, sanitize

    runner = runner or profile.run_process
    skip, count = profile.launch_window(len(functions))
    with tempfile.TemporaryDirectory(prefix="kdt-lines-") as work:
        report = Path(work) / "source"
        line = ncu_command(ncu, profile.kernel_regex(functions), skip, count, report, child)
        returncode, output = runner(line, timeout_s, env or sanitize.child_env(), None)
        result = SourceStalls(line, returncode, output)
        saved = report.with_suffix(".ncu-rep")
        if not saved.is_file():
            return result
        page = subprocess.run(import_command(ncu, saved), capture_output=True, text=True, errors="replace",
                              timeout=timeout_s)
    disassembly = subprocess.run([str(nvdisasm), "-gi", "-c", str(cubin)], capture_output=True, text=True,
                                 errors="replace", timeout=timeout_s).stdout
    for function, instructions in source_page(page.stdout).items():
        result.functions[function] = by_chain(instructions, instruction_chains(disassembly, function))
    return result
