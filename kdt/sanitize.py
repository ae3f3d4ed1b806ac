"""`kdt sanitize`: `kdt verify` for a kernel under each compute-sanitizer tool, findings counted per tool.

Each (kernel, tool) pair is one child process:

    compute-sanitizer --tool T --error-exitcode 99 [--racecheck-report all] \\
        python3 -c BOOT verify KERNEL --max-diffs 0 --json REPORT [--case GLOB] [--knob NAME=VALUE ...]

BOOT is `python3 -m kdt` with one change: CuPy's memory pool is switched off (`cupy.cuda.set_allocator(None)`)
so every array is its own cudaMalloc and memcheck sees the true bounds of each input, output and workspace
(inside a pooled arena an overrun lands in a neighbour's memory and goes unseen). Outputs are poisoned
before each launch and inputs are uploaded, so an initcheck finding is a kernel reading memory nobody wrote.

The log of each run is parsed for `ERROR SUMMARY: N errors` and, for racecheck, `RACECHECK SUMMARY: N hazards
displayed (E errors, W warnings)`; warnings count as findings too (every kernel must come out clean). What the
verify inside found is read from its JSON report (REPORT, in a temporary directory), not from its printout.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from kdt import toolkit

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
ERROR_EXITCODE = 99
DEFAULT_TIMEOUT_S = 1800.0
ROOT = Path(__file__).resolve().parents[1]

# `python3 -m kdt` with CuPy's pool off, so each allocation has its own bounds for memcheck.
BOOT = ("import sys\n"
        "sys.argv[0] = 'kdt'\n"
        "try:\n"
        "    import cupy\n"
        "    cupy.cuda.set_allocator(None)\n"
        "except Exception:\n"
        "    pass\n"
        "from kdt.cli import main\n"
        "main()\n")

_ERROR_SUMMARY = re.compile(r"^========= +ERROR SUMMARY: (\d+) errors?[ \t]*$", re.MULTILINE)
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_PREFIX = re.compile(r"^========= ?")
# The sanitizer cannot watch this GPU or runtime at all: an environment problem, not a finding.
_UNSUPPORTED = re.compile(r"Device not supported|not supported on this (?:device|platform|GPU)|"
                          r"Unable to find injection library|Could not (?:load|find) the (?:injection|sanitizer)|"
                          r"Target application terminated before first instrumented API call", re.IGNORECASE)
_NOT_A_FINDING = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "Saved host backtrace",
                  "Host Frame", "Device Frame", "LEAK SUMMARY")


@dataclass
class ToolResult:
    kernel: str
    tool: str
    command: list[str]
    returncode: int | None          # None: killed after the timeout
    log: str
    elapsed_s: float
    errors: int | None = None       # from ERROR SUMMARY
    hazards: int | None = None      # racecheck: hazards displayed (errors + warnings)
    race_errors: int | None = None
    race_warnings: int | None = None
    findings: list[str] = field(default_factory=list)   # one line per reported problem, with its location
    verify_passed: int | None = None   # cases the kdt verify inside passed and failed (its JSON report; None:
    verify_failed: int | None = None   # it wrote none)
    log_path: Path | None = None

    @property
    def verify_summary(self) -> str:
        """"12 passed, 0 failed" from the kdt verify inside, or "" where it wrote no report."""
        if self.verify_passed is None:
            return ""
        return f"{self.verify_passed} passed, {self.verify_failed} failed"

    @property
    def finding_count(self) -> int:
        counts = [n for n in (self.errors, self.hazards) if n is not None]
        return max(counts) if counts else 0

    @property
    def status(self) -> str:
        """clean, findings, verify failed, unsupported, environment, timeout, crashed."""
        if self.returncode is None:
            return "timeout"
        if _UNSUPPORTED.search(self.log):
            return "unsupported"
        if self.finding_count > 0 or self.returncode == ERROR_EXITCODE:
            return "findings"
        if self.errors is None and self.hazards is None:
            return "environment" if self.returncode == 2 else "crashed"
        if self.returncode == 0:
            return "clean"
        if self.returncode == 2:
            return "environment"
        return "verify failed"

    @property
    def clean(self) -> bool:
        return self.status == "clean"

    @property
    def is_failure(self) -> bool:
        """A result that fails the check (exit 1), as opposed to one this machine could not produce."""
        return self.status in ("findings", "verify failed", "timeout", "crashed")


def find_sanitizer() -> Path | None:
    """compute-sanitizer next to nvcc (or in the toolkit's compute-sanitizer/ folder), on PATH, under
    CUDA_HOME / CUDA_PATH, in /usr/local/cuda, or where cuda-pathfinder finds it."""
    return toolkit.find_cuda_tool("compute-sanitizer", folders=("compute-sanitizer",))


def command(sanitizer: Path | str, kernel: str, tool: str, report: Path | str, case: str | None = None,
            python: str = sys.executable, knobs: Sequence[str] = (), arch: str | None = None,
            sms: int | None = None) -> list[str]:
    """The child command line for one kernel under one tool; the verify inside writes its JSON to `report`."""
    if tool not in TOOLS:
        raise ValueError(f"tool: expected one of {', '.join(TOOLS)}, got {tool!r}")
    line = [str(sanitizer), "--tool", tool, "--error-exitcode", str(ERROR_EXITCODE)]
    if tool == "racecheck":
        line += ["--racecheck-report", "all"]
    line += [python, "-c", BOOT, "verify", kernel, "--max-diffs", "0", "--json", str(report)]
    if case:
        line += ["--case", case]
    for item in knobs:
        line += ["--knob", item]
    if arch is not None:
        line += ["--arch", arch]
    if sms is not None:
        line += ["--sms", str(sms)]
    return line


def verify_counts(report: Path) -> tuple[int | None, int | None]:
    """(passed, failed) cases of a `kdt verify --json` report; (None, None) where there is none (the verify did
    not get that far) or it cannot be read."""
    try:
        cases = json.loads(Path(report).read_text())["cases"]
        passed = sum(1 for case in cases if case["passed"])
        return passed, len(cases) - passed
    except (OSError, ValueError, KeyError, TypeError):
        return None, None


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: kdt importable from this checkout, wide tables, no colour codes."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("COLUMNS", "200")
    env["NO_COLOR"] = "1"
    env.pop("GITHUB_STEP_SUMMARY", None)   # the parent reports; the verify runs inside must not append summaries
    return env


def _finding_lines(log: str) -> list[str]:
    """One line per reported problem: the headline (`Invalid __global__ write of size 4 bytes`, `Race
    reported between ...`, `Program hit cudaErrorIllegalAddress ...`) with the location line under it."""
    out: list[str] = []
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if not _PREFIX.match(line):
            continue
        body = _PREFIX.sub("", line, count=1)
        if not body or body[0].isspace() or body.startswith(_NOT_A_FINDING):
            continue
        location = ""
        for follow in lines[i + 1: i + 4]:
            rest = _PREFIX.sub("", follow, count=1).strip()
            if rest.startswith(("at ", "and ", "Write Thread", "Read Thread")):
                location = rest
                break
        out.append(f"{body.strip()} {location}".strip())
    return out


def parse(log: str) -> dict:
    """Counts and findings from one sanitizer log."""
    errors = [int(m.group(1)) for m in _ERROR_SUMMARY.finditer(log)]
    race = _RACE_SUMMARY.search(log)
    return {
        "errors": errors[0] if errors else None,
        "hazards": int(race.group(1)) if race else None,
        "race_errors": int(race.group(2)) if race else None,
        "race_warnings": int(race.group(3)) if race else None,
        "findings": _finding_lines(log),
    }


def run_process(line: Sequence[str], timeout_s: float, env: dict[str, str], cwd: Path | None) -> tuple[int | None, str]:
    """Run one child in its own process group, output and errors merged; on timeout the whole group (the
    sanitizer and the python under it) is killed and the return code is None."""
    process = subprocess.Popen(list(line), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors="replace", env=env, cwd=cwd, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        output, _ = process.communicate()
        return None, (output or "") + f"\n[kdt sanitize: killed after {timeout_s:g} s]\n"


def run_sanitize(kernels: Sequence[str], tools: Sequence[str] = TOOLS, *, sanitizer: Path | str | None = None,
                 case: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, keep_logs: Path | str | None = None,
                 cwd: Path | None = None, runner: Callable | None = None,
                 on_result: Callable[[ToolResult], None] | None = None,
                 on_start: Callable[[str, str], None] | None = None, knobs: Sequence[str] = (),
                 arch: str | None = None, sms: int | None = None) -> list[ToolResult]:
    """Every kernel under every tool, in that order (`knobs`, `arch`, `sms`: the --knob NAME=VALUE items, --arch and
    --sms of the verify inside). No compute-sanitizer: ToolkitMissing (exit 2)."""
    for tool in tools:
        if tool not in TOOLS:
            raise ValueError(f"tool: expected one of {', '.join(TOOLS)}, got {tool!r}")
    if sanitizer is None:
        sanitizer = find_sanitizer()
    if sanitizer is None:
        raise toolkit.ToolkitMissing("compute-sanitizer not found (next to nvcc, on PATH, under CUDA_HOME or "
                                     "/usr/local/cuda, or by cuda-pathfinder); it ships with the CUDA toolkit")
    runner = runner or run_process
    logs_dir = Path(keep_logs) if keep_logs is not None else None
    if logs_dir is not None:
        logs_dir.mkdir(parents=True, exist_ok=True)
    env = child_env()
    results = []
    with tempfile.TemporaryDirectory(prefix="kdt-sanitize-") as reports:
        for kernel in kernels:
            for tool in tools:
                if on_start:
                    on_start(kernel, tool)
                report = Path(reports) / f"{kernel}.{tool}.json"
                line = command(sanitizer, kernel, tool, report, case, knobs=knobs, arch=arch, sms=sms)
                started = time.perf_counter()
                returncode, log = runner(line, timeout_s, env, cwd)
                passed, failed = verify_counts(report)
                result = ToolResult(kernel, tool, line, returncode, log, time.perf_counter() - started, **parse(log),
                                    verify_passed=passed, verify_failed=failed)
                _finish(result, logs_dir, on_result)
                results.append(result)
    return results


def _finish(result: ToolResult, logs_dir: Path | None, on_result: Callable[[ToolResult], None] | None) -> None:
    if logs_dir is not None:
        result.log_path = logs_dir / f"{result.kernel}.{result.tool}.log"
        result.log_path.write_text(result.log)
    if on_result:
        on_result(result)


def exit_code(results: Sequence[ToolResult]) -> int:
    """1 if any run found something or failed; else 2 if some run could not be made here; else 0."""
    if any(r.is_failure for r in results):
        return 1
    if any(not r.clean for r in results):
        return 2
    return 0
