"""`kdt sanitize`: `kdt verify` for a kernel under each compute-sanitizer tool, findings counted per tool.

Each (kernel, tool) pair is one child process:

    compute-sanitizer --tool T --error-exitcode 99 [--racecheck-report all] \\
        python3 -c BOOT verify KERNEL --max-diffs 0 --json REPORT [--case GLOB] [--knob NAME=VALUE ...]

BOOT is `python3 -m kdt` with one change: CuPy's memory pool is switched off (`cupy.cuda.set_allocator(None)`)
so every array is its own cudaMalloc and memcheck sees the true bounds of each input, output and workspace
(inside a pooled arena an overrun lands in a neighbour's memory and goes unseen). Outputs are poisoned
before each launch and inputs are uploaded, so an initcheck finding is a kernel reading memory nobody wrote.

Racecheck runs for minutes a golden case, almost all of it on the host's cores (figures: plans/reliability.md, `kdt
sanitize`). With `jobs` > 1 each (kernel, tool) is therefore one run per golden case, `jobs` at a time, merged back
into one result per (kernel, tool): the worst case decides its status, its findings are prefixed by their case, its
time is the wall time from its first case's start to its last one's end.

The log of each run is parsed for `ERROR SUMMARY: N errors` and, for racecheck, `RACECHECK SUMMARY: N hazards
displayed (E errors, W warnings)`; warnings count as findings too (every kernel must come out clean). What the
verify inside found is read from its JSON report (REPORT, in a temporary directory), not from its printout.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from kdt import toolkit

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
ERROR_EXITCODE = 99
DEFAULT_TIMEOUT_S = 1800.0
DEFAULT_JOBS = 4   # runs at once by default (each holds a CUDA context): see default_jobs
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
    case: str | None = None         # the golden case this run verified (jobs > 1), else the command's --case
    parts: list["ToolResult"] = field(default_factory=list)   # a merged result's runs, one a golden case

    @property
    def verify_summary(self) -> str:
        """"12 passed, 0 failed" from the kdt verify inside, or "" where it wrote no report."""
        if self.verify_passed is None:
            return ""
        return f"{self.verify_passed} passed, {self.verify_failed} failed"

    @property
    def finding_count(self) -> int:
        if self.parts:
            return sum(part.finding_count for part in self.parts)
        counts = [n for n in (self.errors, self.hazards) if n is not None]
        return max(counts) if counts else 0

    @property
    def status(self) -> str:
        """clean, findings, verify failed, unsupported, environment, timeout, crashed (a merged result: its worst
        run's, in the order of STATUS_SEVERITY)."""
        if self.parts:
            return min((part.status for part in self.parts), key=STATUS_SEVERITY.index)
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


STATUS_SEVERITY = ("findings", "verify failed", "crashed", "timeout", "unsupported", "environment", "clean")


def default_jobs() -> int:
    """Runs at once unless told: one a core, at most DEFAULT_JOBS (each run is a CUDA context on the GPU, with the
    sanitizer's own device memory; a small GPU should not hold many)."""
    return max(1, min(DEFAULT_JOBS, os.cpu_count() or 1))


def golden_case_names(kernel: str, pattern: str | None = None) -> list[str]:
    """The cases of the kernel's golden file matching `pattern`, in file order: what the verify inside runs. A
    missing or corrupt file is golden.GoldenError; a pattern matching nothing is BadInput (--case)."""
    from kdt import golden, stages, verify
    from kdt.refs.errors import BadInput

    path = golden.default_path(None, kernel)
    names = [item.case.name for item in verify.select_cases(stages.get(kernel), path, pattern)]
    if not names:
        raise BadInput("--case", f"a pattern matching a case in {path}", pattern)
    return names


def merge(kernel: str, tool: str, parts: Sequence[ToolResult], elapsed_s: float) -> ToolResult:
    """One (kernel, tool) result from its runs, one a golden case: the status and finding count come from the parts
    (ToolResult.status), the counts are summed, each finding and log is marked with its case."""
    def total(values):
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    codes = [part.returncode for part in parts]
    returncode = (None if None in codes else ERROR_EXITCODE if ERROR_EXITCODE in codes
                  else next((code for code in codes if code), 0))
    return ToolResult(
        kernel, tool, parts[0].command if len(parts) == 1 else [], returncode,
        "".join(f"===== kdt sanitize: case {part.case} =====\n{part.log}" for part in parts), elapsed_s,
        errors=total(p.errors for p in parts), hazards=total(p.hazards for p in parts),
        race_errors=total(p.race_errors for p in parts), race_warnings=total(p.race_warnings for p in parts),
        findings=[f"[{part.case}] {line}" for part in parts for line in part.findings],
        verify_passed=total(p.verify_passed for p in parts), verify_failed=total(p.verify_failed for p in parts),
        parts=list(parts))


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


_RUNNING: set[int] = set()   # process groups of the children running now (kill_running ends them)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_running() -> None:
    """End every child still running (an interrupted command must not leave sanitizers behind: each runs in its own
    process group, out of reach of the terminal's Ctrl-C)."""
    for pgid in list(_RUNNING):
        _kill_group(pgid)


def run_process(line: Sequence[str], timeout_s: float, env: dict[str, str], cwd: Path | None) -> tuple[int | None, str]:
    """Run one child in its own process group, output and errors merged; on timeout the whole group (the
    sanitizer and the python under it) is killed and the return code is None."""
    process = subprocess.Popen(list(line), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors="replace", env=env, cwd=cwd, start_new_session=True)
    _RUNNING.add(process.pid)
    try:
        output, _ = process.communicate(timeout=timeout_s)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        output, _ = process.communicate()
        return None, (output or "") + f"\n[kdt sanitize: killed after {timeout_s:g} s]\n"
    except BaseException:
        _kill_group(process.pid)
        raise
    finally:
        _RUNNING.discard(process.pid)


def run_sanitize(kernels: Sequence[str], tools: Sequence[str] = TOOLS, *, sanitizer: Path | str | None = None,
                 case: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, keep_logs: Path | str | None = None,
                 cwd: Path | None = None, runner: Callable | None = None,
                 on_result: Callable[[ToolResult], None] | None = None,
                 on_start: Callable[[str, str], None] | None = None, knobs: Sequence[str] = (),
                 arch: str | None = None, sms: int | None = None, jobs: int = 1,
                 case_names: Callable[[str, str | None], list[str]] = golden_case_names) -> list[ToolResult]:
    """Every kernel under every tool, results in that order (`knobs`, `arch`, `sms`: the --knob NAME=VALUE items,
    --arch and --sms of the verify inside). jobs = 1: one run a (kernel, tool), one after the other, on_start before
    each. jobs > 1: one run a golden case (`case_names(kernel, case)`), `jobs` at a time, merged per (kernel, tool);
    on_start is not called. `timeout_s` holds for each run. No compute-sanitizer: ToolkitMissing (exit 2)."""
    for tool in tools:
        if tool not in TOOLS:
            raise ValueError(f"tool: expected one of {', '.join(TOOLS)}, got {tool!r}")
    if jobs < 1:
        raise ValueError(f"jobs: expected at least 1, got {jobs}")
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
    groups = [(kernel, tool) for kernel in kernels for tool in tools]
    cases = {kernel: case_names(kernel, case) for kernel in kernels} if jobs > 1 else {}

    with tempfile.TemporaryDirectory(prefix="kdt-sanitize-") as reports:
        def run(kernel: str, tool: str, pattern: str | None, index: int) -> tuple[ToolResult, float, float]:
            report = Path(reports) / f"{kernel}.{tool}.{index}.json"
            exact = glob.escape(pattern) if jobs > 1 else pattern   # one case by its name, whatever its characters
            line = command(sanitizer, kernel, tool, report, exact, knobs=knobs, arch=arch, sms=sms)
            started = time.perf_counter()
            returncode, log = runner(line, timeout_s, env, cwd)
            ended = time.perf_counter()
            passed, failed = verify_counts(report)
            return (ToolResult(kernel, tool, line, returncode, log, ended - started, **parse(log),
                               verify_passed=passed, verify_failed=failed, case=pattern), started, ended)

        results = []
        if jobs == 1:
            for kernel, tool in groups:
                if on_start:
                    on_start(kernel, tool)
                result, _, _ = run(kernel, tool, case, 0)
                _finish(result, logs_dir, on_result)
                results.append(result)
            return results
        pool = ThreadPoolExecutor(max_workers=jobs)
        try:
            pending = {group: [pool.submit(run, *group, name, i) for i, name in enumerate(cases[group[0]])]
                       for group in groups}
            for kernel, tool in groups:
                runs = [future.result() for future in pending[(kernel, tool)]]
                elapsed = max(ended for _, _, ended in runs) - min(started for _, started, _ in runs)
                result = merge(kernel, tool, [part for part, _, _ in runs], elapsed)
                _finish(result, logs_dir, on_result)
                results.append(result)
        except BaseException:   # Ctrl-C, or a run that raised: nothing queued starts, nothing running is left
            pool.shutdown(wait=False, cancel_futures=True)
            kill_running()
            raise
        pool.shutdown()
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
