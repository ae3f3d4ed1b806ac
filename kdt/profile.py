"""`kdt profile`: Nsight Compute (ncu) on the kernel launches of one call of a stage, read back as plain data.

One child process, kdt itself under ncu:

    ncu --clock-control none --csv --page raw --log-file LOG --kernel-name regex:^(F1|F2)$
        --launch-skip N --launch-count N --section SpeedOfLight --section Occupancy --section LaunchStats
        --section WarpStateStats --section MemoryWorkloadAnalysis
        python3 -m kdt bench STAGE --shape NAME --no-graph --no-baselines [--set S] [--arch A] [--sms N]
                                                                          [--knob K=V ...]
    (a golden case: python3 -m kdt verify STAGE --case NAME --golden FILE --max-diffs 0 [...])

F1, F2 are the functions one call launches (its LaunchPlan) and N the number of launches in that plan. ncu counts
--launch-skip and --launch-count among the launches its --kernel-name filter matches, so skipping N passes over
the first call (module load, first touch of the workspace) and profiles exactly the second: `kdt bench` times
that shape with eager launches after it, `kdt verify` launches a case once to warm up and then twice with its
outputs poisoned. (Were ncu to count every launch instead, the first matching launches after N others would still
be one whole call, the first.) The profiled functions are checked against the plan, in order: a run that launched
something else is reported, not shown as this call. Both go through `kdt.ops.run`, the one launch path users call, so what is profiled is what they
run. ncu writes its CSV to LOG (--log-file), never mixed with the child's own printout; the clocks are left alone
(--clock-control none): the rates measured are the ones users get.

The CSV (`--page raw`: a header row of metric names, a row of units, one row per profiled launch) becomes one
KernelProfile per launch: duration, DRAM / memory / SM throughput as % of peak, achieved and theoretical occupancy
and what limits it, registers, static and dynamic shared memory, DRAM bytes, L2 hit rate, and the warp-state
breakdown in cycles per issued instruction (`smsp__average_warps_issue_stalled_<reason>_per_issue_active`; they sum
to `smsp__average_warp_latency_per_inst_issued`). For a bench shape, `roofline` sets the measured time of the call
against the shape's byte and flop model at the machine's measured peaks (kdt.peaks).
"""

from __future__ import annotations

import csv
import fnmatch
import glob
import os
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from rich.markup import escape

from kdt import sanitize, toolkit
from kdt.console import EXIT_CHECK_FAILED, EXIT_ENVIRONMENT, EXIT_OK, KdtExit
from kdt.refs.errors import BadInput

SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "MemoryWorkloadAnalysis")
SKIP_CALLS = 1                  # calls launched before the profiled one (the first loads the module)
TOP_STALLS = 4
DEFAULT_TIMEOUT_S = 900.0
NOT_A_STALL = ("selected",)     # the cycle a warp issues: part of the latency, not a reason to wait
PERMISSION = "ERR_NVGPUCTRPERM"
PERMISSION_FIX = ("ncu may not read this GPU's performance counters (ERR_NVGPUCTRPERM). Either run kdt profile "
                  "as root (sudo -E env PATH=$PATH python3 -m kdt profile ...), or let every user profile: load "
                  "the NVIDIA driver with NVreg_RestrictProfilingToAdminUsers=0 (echo 'options nvidia "
                  "NVreg_RestrictProfilingToAdminUsers=0' | sudo tee /etc/modprobe.d/nvidia-profiling.conf, then "
                  "reboot or reload the nvidia module); in a container, also start it with --cap-add SYS_ADMIN. "
                  "https://developer.nvidia.com/ERR_NVGPUCTRPERM")
NCU_MISSING = ("ncu (Nsight Compute) not found: next to nvcc, in the toolkit's nsight-compute folder, on PATH, under "
               "CUDA_HOME / CUDA_PATH, in /usr/local/cuda or /opt/nvidia/nsight-compute; it ships with the CUDA "
               "toolkit (or install Nsight Compute on its own)")

_STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
_MISSING = {"", "n/a", "N/A", "no data", "-"}
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30}
_TIME_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9,
            "second": 1e9}
_BYTES = re.compile(r"^(|K|M|G|T|Ki|Mi|Gi)(?:byte|B)(?:/.*)?$")


# --- finding ncu ----------------------------------------------------------------------------------------------

def find_ncu() -> Path | None:
    """ncu next to nvcc or in that toolkit's nsight-compute folder, on PATH, under CUDA_HOME / CUDA_PATH, in
    /usr/local/cuda, or in a standalone Nsight Compute under /opt/nvidia."""
    return toolkit.find_cuda_tool("ncu", folders=("nsight-compute*",), elsewhere=("/opt/nvidia/nsight-compute/*/ncu",))


# --- what to profile ------------------------------------------------------------------------------------------

def pick_one(pattern: str, names: Sequence[str], argument: str, what: str) -> str:
    """The one name `pattern` (a glob) matches; none or several: BadInput naming `argument` and the candidates."""
    found = [name for name in names if fnmatch.fnmatch(name, pattern)]
    if len(found) == 1:
        return found[0]
    matched = "none" if not found else f"{len(found)}: {', '.join(found)}"
    raise BadInput(argument, f"a glob matching exactly one {what} ({', '.join(names) or 'there are none'})",
                   f"{pattern!r}, which matches {matched}")


def launch_plan(spec, inputs: dict, params: dict, knobs: dict):
    """The LaunchPlan one call makes on this GPU and selection (--arch, --sms): which functions, in which order."""
    from kdt import ops, runtime

    return ops.plan_for(spec, inputs, params, runtime.target(spec.name), knobs)


# --- the command line -----------------------------------------------------------------------------------------

def kernel_regex(functions: Sequence[str]) -> str:
    """ncu's --kernel-name filter for exactly these function names."""
    names = "|".join(re.escape(name) for name in dict.fromkeys(functions))
    return f"regex:^({names})$"


def launch_window(launches_per_call: int, skip_calls: int = SKIP_CALLS) -> tuple[int, int]:
    """(--launch-skip, --launch-count): past `skip_calls` calls, then exactly one call's launches."""
    if launches_per_call < 1:
        raise ValueError("a call that launches no kernel cannot be profiled")
    return skip_calls * launches_per_call, launches_per_call


def child_command(stage: str, *, shape: str | None = None, case: str | None = None, golden: Path | None = None,
                  python: str = sys.executable, knobs: Sequence[str] = (), arch: str | None = None,
                  sms: int | None = None, shape_set: str | None = None) -> list[str]:
    """The kdt run under ncu: `kdt bench` on one shape of `shape_set` (None: the default set; eager launches, no
    baselines) or `kdt verify` on one case."""
    if (shape is None) == (case is None):
        raise ValueError("child_command: one of a shape and a case")
    line = [python, "-m", "kdt"]
    if shape is not None:
        line += ["bench", stage, "--shape", glob.escape(shape), "--no-graph", "--no-baselines"]
        if shape_set is not None:
            line += ["--set", shape_set]
    else:
        line += ["verify", stage, "--case", glob.escape(case), "--max-diffs", "0"]
        if golden is not None:
            line += ["--golden", str(golden)]
    options = [("--knob", item) for item in knobs] + [("--arch", arch), ("--sms", sms)]
    return line + [str(word) for option, value in options if value is not None for word in (option, value)]


def ncu_command(ncu: Path | str, functions: Sequence[str], launches_per_call: int, log_file: Path | str,
                child: Sequence[str], sections: Sequence[str] = SECTIONS) -> list[str]:
    """ncu around `child`: one call's launches of `functions` (after SKIP_CALLS calls), CSV to `log_file`."""
    skip, count = launch_window(launches_per_call)
    line = [str(ncu), "--clock-control", "none", "--csv", "--page", "raw", "--log-file", str(log_file),
            "--kernel-name", kernel_regex(functions), "--launch-skip", str(skip), "--launch-count", str(count)]
    for section in sections:
        line += ["--section", section]
    return line + list(child)


# --- the CSV --------------------------------------------------------------------------------------------------

@dataclass
class KernelProfile:
    """One profiled launch, as ncu measured it (None: the metric is not in the CSV)."""

    id: int
    function: str
    grid: str
    block: str
    duration_ns: float
    dram_pct: float | None                   # gpu__dram_throughput, % of peak (SpeedOfLight "DRAM Throughput")
    memory_pct: float | None                 # gpu__compute_memory_throughput (the busiest memory unit)
    sm_pct: float | None                     # sm__throughput (SpeedOfLight "Compute (SM) Throughput")
    achieved_occupancy_pct: float | None     # sm__warps_active.avg.pct_of_peak_sustained_active
    theoretical_occupancy_pct: float | None  # sm__maximum_warps_per_active_cycle_pct
    blocks_per_sm_limit: int | None          # the smallest launch__occupancy_limit_*
    occupancy_limited_by: list[str]          # which limits reach that smallest value
    registers_per_thread: int | None
    static_smem_bytes: int | None
    dynamic_smem_bytes: int | None
    waves_per_sm: float | None
    dram_bytes: int | None                   # dram__bytes.sum.per_second x duration
    l2_hit_pct: float | None
    warp_cycles_per_issue: float | None      # smsp__average_warp_latency_per_inst_issued
    stalls: dict[str, float] = field(default_factory=dict)   # reason -> cycles per issued instruction

    @property
    def duration_us(self) -> float:
        return self.duration_ns / 1e3

    @property
    def smem_bytes(self) -> int | None:
        if self.static_smem_bytes is None and self.dynamic_smem_bytes is None:
            return None
        return (self.static_smem_bytes or 0) + (self.dynamic_smem_bytes or 0)

    def top_stalls(self, count: int = TOP_STALLS) -> list[tuple[str, float]]:
        """The largest stall reasons, largest first (ties by name), without the issuing cycle itself."""
        ranked = sorted(((reason, value) for reason, value in self.stalls.items()
                         if reason not in NOT_A_STALL and value > 0), key=lambda item: (-item[1], item[0]))
        return ranked[:count]

    def as_json(self) -> dict:
        return {**asdict(self), "duration_us": self.duration_us, "smem_bytes": self.smem_bytes,
                "top_stalls": [{"reason": r, "cycles_per_issue": v} for r, v in self.top_stalls()]}


class ProfileError(KdtExit):
    """ncu's CSV cannot be read as a profile (exit 1: a newer ncu's format, a run cut short)."""

    def __init__(self, problem: str):
        self.problem = problem
        super().__init__(EXIT_CHECK_FAILED, f"[red]ncu's CSV cannot be read:[/] {escape(problem)}")


class CountersNotPermitted(KdtExit):
    """ncu may not read the performance counters on this machine: exit 2, with ncu's line and the fix."""

    def __init__(self, line: str):
        self.line = line
        super().__init__(EXIT_ENVIRONMENT, f"[red]cannot run here:[/] {escape(line)}\n{escape(PERMISSION_FIX)}")


def _number(cell: str) -> float | None:
    text = cell.strip().replace(",", "")
    if text in _MISSING:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _nanoseconds(value: float | None, unit: str) -> float | None:
    if value is None:
        return None
    scale = _TIME_NS.get(unit.strip())
    if scale is None:
        raise ProfileError(f"a duration in unit {unit!r}: expected one of {', '.join(_TIME_NS)}")
    return value * scale


def _bytes(value: float | None, unit: str) -> float | None:
    if value is None:
        return None
    match = _BYTES.match(unit.strip())
    return value * _PREFIX[match.group(1)] if match else value


def _integer(value: float | None) -> int | None:
    return None if value is None else int(round(value))


class _Row:
    """One launch's cells by metric name, with their units."""

    def __init__(self, header: list[str], units: list[str], cells: list[str]):
        self.cells = {name: (cell, unit) for name, cell, unit in zip(header, cells, units)}

    def text(self, name: str) -> str:
        return self.cells.get(name, ("", ""))[0].strip()

    def unit(self, name: str) -> str:
        return self.cells.get(name, ("", ""))[1]

    def number(self, name: str) -> float | None:
        return _number(self.cells[name][0]) if name in self.cells else None


def _kernel(row: _Row) -> KernelProfile:
    function = row.text("Kernel Name")
    duration = _nanoseconds(row.number("gpu__time_duration.sum"), row.unit("gpu__time_duration.sum"))
    if duration is None:
        raise ProfileError(f"launch {row.text('ID')} ({function}): no gpu__time_duration.sum in ncu's CSV")
    limits = {name[len("launch__occupancy_limit_"):]: row.number(name) for name in row.cells
              if name.startswith("launch__occupancy_limit_")}
    limits = {name: value for name, value in limits.items() if value is not None}
    smallest = min(limits.values()) if limits else None
    per_second = _bytes(row.number("dram__bytes.sum.per_second"), row.unit("dram__bytes.sum.per_second"))
    stalls = {}
    for name in row.cells:
        match = _STALL.match(name)
        if match and row.number(name) is not None:
            stalls[match.group(1)] = row.number(name)
    return KernelProfile(
        id=int(row.number("ID")), function=function, grid=row.text("Grid Size"), block=row.text("Block Size"),
        duration_ns=duration,
        dram_pct=row.number("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
        memory_pct=row.number("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
        sm_pct=row.number("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        achieved_occupancy_pct=row.number("sm__warps_active.avg.pct_of_peak_sustained_active"),
        theoretical_occupancy_pct=row.number("sm__maximum_warps_per_active_cycle_pct"),
        blocks_per_sm_limit=_integer(smallest),
        occupancy_limited_by=sorted(name for name, value in limits.items() if value == smallest),
        registers_per_thread=_integer(row.number("launch__registers_per_thread")),
        static_smem_bytes=_integer(_bytes(row.number("launch__shared_mem_per_block_static"),
                                          row.unit("launch__shared_mem_per_block_static"))),
        dynamic_smem_bytes=_integer(_bytes(row.number("launch__shared_mem_per_block_dynamic"),
                                           row.unit("launch__shared_mem_per_block_dynamic"))),
        waves_per_sm=row.number("launch__waves_per_multiprocessor"),
        dram_bytes=round(per_second * duration / 1e9) if per_second is not None else None,
        l2_hit_pct=row.number("lts__t_sector_hit_rate.pct"),
        warp_cycles_per_issue=row.number("smsp__average_warp_latency_per_inst_issued.ratio"),
        stalls=stalls)


def parse_csv(text: str) -> list[KernelProfile]:
    """The launches in ncu's `--csv --page raw` output, in the order profiled. Lines that are not ncu's CSV
    (==PROF== notes, anything a child printed) are passed over; no header: no launches."""
    header: list[str] | None = None
    units: list[str] | None = None
    rows: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith('"'):
            continue
        cells = next(csv.reader([line]))
        if header is None:
            if cells[:1] == ["ID"] and "Kernel Name" in cells:
                header = cells
            continue
        if len(cells) != len(header) or cells == header:
            continue
        if not cells[0].strip():
            units = units or cells
        elif cells[0].strip().isdigit():
            rows.append(cells)
    if header is None:
        return []
    units = units or [""] * len(header)
    return [_kernel(_Row(header, units, cells)) for cells in rows]


def permission_denied(text: str) -> str | None:
    """ncu's ERR_NVGPUCTRPERM line, where it printed one."""
    for line in text.splitlines():
        if PERMISSION in line:
            return line.strip()
    return None


# --- the roofline ---------------------------------------------------------------------------------------------

@dataclass
class Roofline:
    """One call against the shape's model at the machine's peaks: bound = max(bytes / copy, flops / matmul)."""

    bytes_moved: int
    flops: int
    copy_gbps: float
    matmul_tflops: float
    memory_bound_us: float
    compute_bound_us: float
    bound_us: float
    bound_by: str                # "memory" or "compute"
    measured_us: float           # the sum of the call's kernel durations under ncu
    x_bound: float | None        # measured / bound (None: a model of nothing)
    achieved_gbps: float         # model bytes / measured
    achieved_tflops: float
    dram_bytes: int | None       # what ncu counted crossing DRAM, against the model's bytes
    dram_vs_model: float | None


def roofline(bytes_moved: int, flops: int, copy_gbps: float, matmul_tflops: float,
             kernels: Sequence[KernelProfile]) -> Roofline:
    from kdt.peaks import roofline_times

    memory_us, compute_us = roofline_times(bytes_moved, flops, copy_gbps, matmul_tflops)
    bound = max(memory_us, compute_us)
    measured = sum(k.duration_ns for k in kernels) / 1e3
    dram = None if not kernels or any(k.dram_bytes is None for k in kernels) else sum(k.dram_bytes for k in kernels)
    return Roofline(int(bytes_moved), int(flops), copy_gbps, matmul_tflops, memory_us, compute_us, bound,
                    "memory" if memory_us >= compute_us else "compute", measured,
                    measured / bound if bound > 0 else None,
                    bytes_moved / measured / 1e3 if measured else 0.0,
                    flops / measured / 1e6 if measured else 0.0,
                    dram, dram / bytes_moved if dram is not None and bytes_moved else None)


# --- running it -----------------------------------------------------------------------------------------------

@dataclass
class ProfileResult:
    stage: str
    kind: str                          # "shape" or "case"
    name: str
    functions: list[str]               # what one call launches, in order (the plan)
    command: list[str]
    returncode: int | None             # None: killed after the timeout
    output: str                        # ncu's and the child's stdout and stderr
    log: str                           # ncu's --log-file: its notes and the CSV
    elapsed_s: float
    kernels: list[KernelProfile] = field(default_factory=list)

    @property
    def total_us(self) -> float:
        return sum(k.duration_ns for k in self.kernels) / 1e3

    def verdict(self) -> tuple[int, str | None]:
        """(exit code, what went wrong): 0 and None for a profile of exactly one call of the plan."""
        child = "kdt bench" if self.kind == "shape" else "kdt verify"
        if not self.kernels:
            if self.returncode is None:
                return EXIT_CHECK_FAILED, f"ncu and {child} did not finish: killed after the timeout"
            if self.returncode == EXIT_ENVIRONMENT:
                return EXIT_ENVIRONMENT, f"{child} under ncu could not run here (exit 2)"
            return EXIT_CHECK_FAILED, (f"ncu profiled no launch of {', '.join(dict.fromkeys(self.functions))} "
                                       f"({child} under it exited {self.returncode})")
        got = [k.function for k in self.kernels]
        if got != self.functions:
            return EXIT_CHECK_FAILED, (f"ncu profiled {', '.join(got)} but one call launches "
                                       f"{', '.join(self.functions)}: the launches under ncu did not follow the plan "
                                       "made here (another path?), so these figures are not one call's")
        if self.returncode != 0:
            how = "was killed after the timeout" if self.returncode is None else f"exited {self.returncode}"
            return EXIT_CHECK_FAILED, f"the profile was taken, but {child} under ncu {how}"
        return EXIT_OK, None

    def tail(self, lines: int = 25) -> str:
        """The end of what ncu and the child printed (why it failed), ncu's own notes first."""
        notes = [line for line in self.log.splitlines() if line.startswith("==")]
        text = "\n".join(notes[-lines:] + self.output.strip().splitlines()[-lines:])
        return text.replace("[kdt sanitize: killed", "[killed")


def run_process(line: Sequence[str], timeout_s: float, env: dict[str, str], cwd: Path | None) -> tuple[int | None, str]:
    """The child in its own process group, killed whole on timeout (kdt.sanitize's runner)."""
    return sanitize.run_process(line, timeout_s, env, cwd)


def run_profile(stage: str, functions: Sequence[str], *, ncu: Path | str, shape: str | None = None,
                case: str | None = None, golden: Path | None = None, knobs: Sequence[str] = (),
                arch: str | None = None, sms: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                cwd: Path | None = None, runner: Callable | None = None,
                shape_set: str | None = None) -> ProfileResult:
    """One call of `stage` on `shape` (of `shape_set`) or `case` under ncu; `functions`: the launches of one call
    (its plan), in order. ERR_NVGPUCTRPERM: CountersNotPermitted (exit 2). A CSV that cannot be read: ProfileError."""
    child = child_command(stage, shape=shape, case=case, golden=golden, knobs=knobs, arch=arch, sms=sms,
                          shape_set=shape_set)
    runner = runner or run_process
    with tempfile.TemporaryDirectory(prefix="kdt-profile-") as work:
        log_file = Path(work) / "ncu.csv"
        line = ncu_command(ncu, functions, len(functions), log_file, child)
        started = time.perf_counter()
        returncode, output = runner(line, timeout_s, sanitize.child_env(), cwd)
        elapsed = time.perf_counter() - started
        log = log_file.read_text(errors="replace") if log_file.is_file() else ""
    denied = permission_denied(log) or permission_denied(output)
    if denied:
        raise CountersNotPermitted(denied)
    result = ProfileResult(stage, "shape" if shape is not None else "case", shape if shape is not None else case,
                           list(functions), line, returncode, output, log, elapsed)
    result.kernels = parse_csv(log) or parse_csv(output)
    return result


def results_json(result: ProfileResult, *, plan_path: str, arch: str, multiprocessors: int, knobs: dict,
                 roof: Roofline | None, peaks=None) -> dict:
    """Every figure of the profile, for --json."""
    skip, count = launch_window(len(result.functions))
    return {
        "stage": result.stage, result.kind: result.name, "arch": arch, "multiprocessors": multiprocessors,
        "knobs": dict(knobs), "path": plan_path, "functions": result.functions,
        "ncu": {"command": result.command, "launch_skip": skip, "launch_count": count, "sections": list(SECTIONS),
                "clock_control": "none", "returncode": result.returncode, "elapsed_s": result.elapsed_s},
        "kernels": [k.as_json() for k in result.kernels],
        "total_us": result.total_us,
        "roofline": asdict(roof) if roof is not None else None,
        "peaks": asdict(peaks) if peaks is not None else None,
    }
