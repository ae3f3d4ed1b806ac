"""kdt profile without a GPU: ncu's CSV parsed from real outputs captured on the H200 (tests/data), the command line it
builds, the roofline arithmetic, its exit codes, and the command end to end with a stand-in for ncu; one real run on
the GPU where ncu is there and may read the counters."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from kdt import golden, peaks, profile, runtime, stages, toolkit
from kdt.launch.plan import KernelLaunch, LaunchPlan
from tests.cli_run import run_kdt_cli
from tests.test_sanitize import _executable

DATA = Path(__file__).resolve().parent / "data"
# ncu 2025.3.1 on an H200: `ncu --clock-control none --csv --page raw --kernel-name regex:kdt_verify_attn
# --launch-skip 2 --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats --section
# WarpStateStats --section MemoryWorkloadAnalysis python3 -m kdt bench verify-attn --shape G1_H8_N8_prefix1024
# --no-graph --no-baselines > out.csv`: kdt bench's own table is mixed in before the CSV (kdt profile sends ncu's
# output to --log-file instead). The topk file is the same for its resident kernel (one launch a call).
VERIFY_ATTN_CSV = (DATA / "ncu_raw_verify_attn_G1_H8_N8_prefix1024.csv").read_text()
TOPK_CSV = (DATA / "ncu_raw_topk_resident.csv").read_text()
# what `--case "*"` matches: every case of the committed golden file
with h5py.File(golden.default_path(Path(__file__).resolve().parents[1] / "golden", "verify-attn"), "r") as _golden:
    GOLDEN_VERIFY_ATTN_CASES = len(_golden)
FWD, COMBINE = "kdt_verify_attn_fwd", "kdt_verify_attn_combine"
TOPK_RESIDENT = "kdt_topk_resident_wide_f32"
H200 = peaks.Peaks("NVIDIA H200", 4218.0, 749.0, "torch bf16 8192^3")   # the peaks line in the captured outputs
PERMISSION_LOG = ("==PROF== Connected to process 731 (/usr/bin/python3.12)\n"
                  "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
                  "Counters on the target device 0. For instructions on enabling permissions and to get more "
                  "information see https://developer.nvidia.com/ERR_NVGPUCTRPERM\n"
                  "==PROF== Disconnected from process 731\n")


def log_form(text: str) -> str:
    """What ncu writes to --log-file: its own ==NOTE== lines and the CSV, without the child's printout."""
    return "\n".join(line for line in text.splitlines() if line.startswith(("==", '"'))) + "\n"


def edited(text: str, changes: dict[str, tuple[str, str]]) -> str:
    """The CSV with metric NAME's unit and first launch's value replaced: {name: (unit, value)}."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = list(csv.reader(lines[start:start + 3]))
    for name, (unit, value) in changes.items():
        column = rows[0].index(name)
        rows[1][column], rows[2][column] = unit, value
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return "\n".join(lines[:start]) + "\n" + out.getvalue()


# --- the CSV --------------------------------------------------------------------------------------------------

def test_parse_verify_attn_fwd_then_combine():
    fwd, combine = profile.parse_csv(VERIFY_ATTN_CSV)
    assert (fwd.id, fwd.function, fwd.grid, fwd.block) == (0, FWD, "(1, 1, 4)", "(256, 1, 1)")
    assert (combine.id, combine.function, combine.grid) == (1, COMBINE, "(32, 1, 1)")
    assert fwd.duration_ns == 19424 and fwd.duration_us == pytest.approx(19.424) and combine.duration_ns == 4512
    assert (fwd.dram_pct, fwd.memory_pct, fwd.sm_pct) == (1.42, 1.68, 0.74)
    assert (combine.dram_pct, combine.memory_pct, combine.sm_pct) == (2.53, 2.53, 2.60)
    assert (fwd.achieved_occupancy_pct, fwd.theoretical_occupancy_pct) == (12.25, 12.5)
    assert (combine.achieved_occupancy_pct, combine.theoretical_occupancy_pct) == (11.21, 37.5)
    assert (fwd.blocks_per_sm_limit, fwd.occupancy_limited_by) == (1, ["registers", "shared_mem"])
    assert (combine.blocks_per_sm_limit, combine.occupancy_limited_by) == (3, ["registers"])
    assert (fwd.registers_per_thread, combine.registers_per_thread) == (254, 71)
    assert (fwd.static_smem_bytes, fwd.dynamic_smem_bytes, fwd.smem_bytes) == (0, 230952, 230952)
    assert combine.smem_bytes == 0
    assert fwd.waves_per_sm == 0.03 and fwd.l2_hit_pct == 40.68 and fwd.warp_cycles_per_issue == 8.38
    # dram__bytes.sum.per_second x gpu__time_duration.sum
    assert fwd.dram_bytes == round(68_401_976_935.75 * 19_424e-9) == 1_328_640
    assert combine.dram_bytes == round(120_624_113_475.18 * 4_512e-9)


def test_stalls_in_cycles_per_issued_instruction_largest_first():
    fwd, combine = profile.parse_csv(VERIFY_ATTN_CSV)
    assert fwd.top_stalls() == [("long_scoreboard", 1.98), ("wait", 1.29), ("lg_throttle", 1.14), ("barrier", 1.09)]
    assert combine.top_stalls() == [("long_scoreboard", 4.24), ("wait", 2.10), ("no_instruction", 1.27),
                                    ("short_scoreboard", 1.14)]
    assert combine.top_stalls(2) == combine.top_stalls()[:2]
    # the whole breakdown is kept; "selected" (the issuing cycle) is in it but never a top stall
    assert len(fwd.stalls) == 19 and fwd.stalls["selected"] == 1.0 and fwd.stalls["membar"] == 0
    assert sum(fwd.stalls.values()) == pytest.approx(fwd.warp_cycles_per_issue, abs=0.15)
    assert all(reason != "selected" for reason, _ in fwd.top_stalls(19))


def test_parse_topk_resident_cluster_kernel():
    (k,) = profile.parse_csv(TOPK_CSV)
    assert (k.function, k.grid, k.block, k.duration_ns) == (TOPK_RESIDENT, "(112, 1, 1)", "(256, 1, 1)", 6720)
    assert (k.dram_pct, k.memory_pct, k.sm_pct) == (14.48, 14.48, 8.84)
    assert (k.achieved_occupancy_pct, k.theoretical_occupancy_pct, k.blocks_per_sm_limit) == (11.86, 50.0, 4)
    assert k.occupancy_limited_by == ["shared_mem"]
    assert (k.registers_per_thread, k.static_smem_bytes, k.dynamic_smem_bytes) == (39, 10848, 40960)
    assert k.smem_bytes == 51808
    assert k.top_stalls() == [("wait", 2.17), ("long_scoreboard", 2.05), ("barrier", 1.99), ("imc_miss", 1.41)]


def test_parse_the_log_file_form_units_and_gaps():
    assert profile.parse_csv(log_form(VERIFY_ATTN_CSV)) == profile.parse_csv(VERIFY_ATTN_CSV)
    assert profile.parse_csv("==PROF== Connected to process 1\n==WARNING== No kernels were profiled.\n") == []
    assert profile.parse_csv("") == []
    scaled = edited(TOPK_CSV, {"gpu__time_duration.sum": ("usecond", "6.72"),
                               "launch__shared_mem_per_block_dynamic": ("Kbyte/block", "40.96"),
                               "launch__registers_per_thread": ("register/thread", "no data"),
                               "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "n/a")})
    (k,) = profile.parse_csv(scaled)
    assert k.duration_ns == pytest.approx(6720) and k.dynamic_smem_bytes == 40960
    assert k.registers_per_thread is None and k.sm_pct is None
    with pytest.raises(profile.ProfileError, match="fortnight"):
        profile.parse_csv(edited(TOPK_CSV, {"gpu__time_duration.sum": ("fortnight", "1")}))
    with pytest.raises(profile.ProfileError, match="no gpu__time_duration.sum"):
        profile.parse_csv(edited(TOPK_CSV, {"gpu__time_duration.sum": ("ns", "no data")}))


def test_permission_line_is_found():
    assert profile.permission_denied(PERMISSION_LOG).startswith("==ERROR== ERR_NVGPUCTRPERM - The user")
    assert profile.permission_denied(VERIFY_ATTN_CSV) is None


# --- the command line -----------------------------------------------------------------------------------------

def test_launch_window_profiles_the_second_call():
    assert profile.launch_window(2) == (2, 2)      # verify-attn split: fwd + combine
    assert profile.launch_window(1) == (1, 1)
    assert profile.launch_window(3, skip_calls=2) == (6, 3)
    with pytest.raises(ValueError):
        profile.launch_window(0)


def test_kernel_regex_matches_the_plan_functions_only():
    assert profile.kernel_regex([FWD, COMBINE]) == f"regex:^({FWD}|{COMBINE})$"
    assert profile.kernel_regex(["a", "b", "a"]) == "regex:^(a|b)$"
    pattern = re.compile(profile.kernel_regex([FWD, COMBINE])[len("regex:"):])
    assert pattern.search(FWD) and pattern.search(COMBINE)
    assert not pattern.search(FWD + "_v2") and not pattern.search("kdt_verify_attn")
    assert profile.kernel_regex(["k.x"])[len("regex:"):] == r"^(k\.x)$"


def test_ncu_command_line_for_a_bench_shape():
    child = profile.child_command("verify-attn", shape="G1_H8_N8_prefix1024", python="/usr/bin/python3",
                                  knobs=["splits=4"], arch="sm_120-emu", sms=70)
    assert child == ["/usr/bin/python3", "-m", "kdt", "bench", "verify-attn", "--shape", "G1_H8_N8_prefix1024",
                     "--no-graph", "--no-baselines", "--knob", "splits=4", "--arch", "sm_120-emu", "--sms", "70"]
    line = profile.ncu_command("/cuda/bin/ncu", [FWD, COMBINE], 2, "/tmp/x/ncu.csv", child)
    assert line[0] == "/cuda/bin/ncu" and line[-len(child):] == child
    ncu = line[:-len(child)]
    option = lambda name: ncu[ncu.index(name) + 1]
    assert option("--clock-control") == "none" and "--csv" in ncu and option("--page") == "raw"
    assert option("--log-file") == "/tmp/x/ncu.csv"
    assert option("--kernel-name") == f"regex:^({FWD}|{COMBINE})$"
    assert (option("--launch-skip"), option("--launch-count")) == ("2", "2")
    assert [ncu[i + 1] for i, word in enumerate(ncu) if word == "--section"] == [
        "SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "MemoryWorkloadAnalysis"]


def test_ncu_command_line_for_a_golden_case():
    child = profile.child_command("topk", case="k1_g1", golden=Path("/g/topk.h5"), python="py")
    assert child == ["py", "-m", "kdt", "verify", "topk", "--case", "k1_g1", "--max-diffs", "0", "--golden",
                     "/g/topk.h5"]
    line = profile.ncu_command("ncu", [TOPK_RESIDENT], 1, "log.csv", child)
    assert line[line.index("--launch-skip") + 1] == "1" and line[line.index("--launch-count") + 1] == "1"
    # a name with glob characters is matched as itself by the kdt inside
    assert profile.child_command("topk", case="odd[1]*", python="py")[6] == "odd[[]1][*]"
    with pytest.raises(ValueError):
        profile.child_command("topk", python="py")


def test_find_ncu_next_to_nvcc_or_in_the_nsight_compute_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(toolkit.shutil, "which", lambda name: None)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    real_glob = toolkit.glob.glob   # only this test's folders: a real toolkit on the machine must not answer
    monkeypatch.setattr(toolkit.glob, "glob", lambda pattern: real_glob(pattern) if pattern.startswith(str(tmp_path))
                        else [])
    monkeypatch.setattr(toolkit, "find_nvcc", lambda: None)
    real_is_file = Path.is_file
    monkeypatch.setattr(Path, "is_file", lambda self: str(self).startswith(str(tmp_path)) and real_is_file(self))
    assert profile.find_ncu() is None
    nvcc = _executable(tmp_path / "cuda" / "bin" / "nvcc")
    monkeypatch.setattr(toolkit, "find_nvcc", lambda: toolkit.Nvcc(nvcc, "PATH", "13.0.88"))
    inner = _executable(tmp_path / "cuda" / "nsight-compute-2025.3.1" / "ncu")
    assert profile.find_ncu() == inner
    beside = _executable(tmp_path / "cuda" / "bin" / "ncu")
    assert profile.find_ncu() == beside
    monkeypatch.setattr(toolkit, "find_nvcc", lambda: None)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert profile.find_ncu() == beside


# --- the roofline ---------------------------------------------------------------------------------------------

def _bench_shape(stage: str, name: str):
    return next(s for s in stages.get(stage).bench_shapes(False) if s.name == name)


def test_roofline_of_the_captured_verify_attn_call():
    shape = _bench_shape("verify-attn", "G1_H8_N8_prefix1024")
    assert (shape.bytes_moved, shape.flops) == (1_393_920, 143_720_448)
    roof = profile.roofline(shape.bytes_moved, shape.flops, 4218.0, 749.0, profile.parse_csv(VERIFY_ATTN_CSV))
    assert roof.memory_bound_us == pytest.approx(1_393_920 / 4218e3)          # bytes / (GB/s) in us
    assert roof.compute_bound_us == pytest.approx(143_720_448 / 749e6)        # flop / (TFLOP/s) in us
    assert roof.bound_by == "memory" and roof.bound_us == roof.memory_bound_us
    assert roof.measured_us == pytest.approx(19.424 + 4.512)
    assert roof.x_bound == pytest.approx(23.936 / (1_393_920 / 4218e3)) == pytest.approx(72.43, abs=0.01)
    assert roof.achieved_gbps == pytest.approx(1_393_920 / 23.936 / 1e3)
    assert roof.achieved_tflops == pytest.approx(143_720_448 / 23.936 / 1e6)
    assert roof.dram_bytes == 1_328_640 + 544_256 and roof.dram_vs_model == pytest.approx(1_872_896 / 1_393_920)


def test_roofline_compute_bound_and_without_flops():
    one = profile.parse_csv(TOPK_CSV)
    roof = profile.roofline(1_000, 10**12, 1000.0, 100.0, one)   # 1 ns of bytes, 10 ms of flop
    assert roof.bound_by == "compute" and roof.bound_us == pytest.approx(10_000)
    assert roof.x_bound == pytest.approx(6.72 / 10_000)
    shape = _bench_shape("topk", "G1_K7_vocab163840_V8_f32")
    roof = profile.roofline(shape.bytes_moved, shape.flops, 4218.0, 749.0, one)
    assert shape.flops == 0 and roof.compute_bound_us == 0 and roof.achieved_tflops == 0
    assert roof.x_bound == pytest.approx(6.72 / (shape.bytes_moved / 4218e3))
    assert profile.roofline(0, 0, 4218.0, 749.0, one).x_bound is None


# --- running ncu (a stand-in) ---------------------------------------------------------------------------------

def fake_ncu(log: str, returncode: int | None = 0, output: str = "", calls: list | None = None):
    """A stand-in for ncu + the kdt inside: writes `log` where --log-file says, returns (returncode, output)."""

    def run(line, timeout_s, env, cwd):
        if calls is not None:
            calls.append(line)
        Path(line[line.index("--log-file") + 1]).write_text(log)
        return returncode, output

    return run


def test_run_profile_reads_the_log_file_and_judges_it():
    calls = []
    result = profile.run_profile("verify-attn", [FWD, COMBINE], ncu="ncu", shape="G1_H8_N8_prefix1024",
                                 runner=fake_ncu(log_form(VERIFY_ATTN_CSV), calls=calls))
    assert [k.function for k in result.kernels] == [FWD, COMBINE] and result.total_us == pytest.approx(23.936)
    assert result.verdict() == (0, None) and len(calls) == 1 and calls[0][0] == "ncu"
    other = profile.run_profile("verify-attn", [FWD], ncu="ncu", shape="G1_H8_N8_prefix1024",
                                runner=fake_ncu(VERIFY_ATTN_CSV))
    code, why = other.verdict()
    assert code == 1 and "did not follow the plan" in why
    nothing = profile.run_profile("topk", [TOPK_RESIDENT], ncu="ncu", case="k1_g1",
                                  runner=fake_ncu("==WARNING== No kernels were profiled.\n", 1, "Traceback ..."))
    code, why = nothing.verdict()
    assert code == 1 and "profiled no launch" in why and "No kernels were profiled" in nothing.tail()
    no_gpu = profile.run_profile("topk", [TOPK_RESIDENT], ncu="ncu", case="k1_g1", runner=fake_ncu("", 2))
    assert no_gpu.verdict()[0] == 2
    late = profile.run_profile("topk", [TOPK_RESIDENT], ncu="ncu", case="k1_g1", runner=fake_ncu(TOPK_CSV, 1))
    assert late.verdict()[0] == 1 and "exited 1" in late.verdict()[1]
    timeout = profile.run_profile("topk", [TOPK_RESIDENT], ncu="ncu", case="k1_g1", runner=fake_ncu("", None))
    assert timeout.verdict()[0] == 1 and "timeout" in timeout.verdict()[1]


def test_run_profile_without_counter_permission_is_an_environment_error():
    with pytest.raises(profile.CountersNotPermitted) as raised:
        profile.run_profile("topk", [TOPK_RESIDENT], ncu="ncu", case="k1_g1", runner=fake_ncu(PERMISSION_LOG, 0))
    assert raised.value.code == 2 and "NVreg_RestrictProfilingToAdminUsers=0" in raised.value.message
    with pytest.raises(profile.CountersNotPermitted):   # printed on the console rather than in the log
        profile.run_profile("topk", [TOPK_RESIDENT], ncu="ncu", case="k1_g1", runner=fake_ncu("", 1, PERMISSION_LOG))


# --- the command ----------------------------------------------------------------------------------------------

def run_kdt(monkeypatch, capsys, *args):
    return run_kdt_cli(monkeypatch, capsys, *args)


def _plan(stage: str, *functions: str) -> LaunchPlan:
    return LaunchPlan(stage, "split prefix + combine" if len(functions) > 1 else "resident",
                      tuple(KernelLaunch(name, (1, 1, 1), 256, ()) for name in functions))


def _command_fakes(monkeypatch, plan: LaunchPlan, runner, ncu: str | None = "/cuda/bin/ncu"):
    from kdt.commands import common

    monkeypatch.setattr(runtime, "cupy", lambda: object())
    monkeypatch.setattr(runtime, "device_arch", lambda: "sm_90a")
    monkeypatch.setattr(runtime, "multiprocessors", lambda: 132)
    monkeypatch.setattr(profile, "find_ncu", lambda: None if ncu is None else Path(ncu))
    monkeypatch.setattr(common, "preflight", lambda specs: None)
    monkeypatch.setattr(profile, "launch_plan", lambda spec, inputs, params, knobs: plan)
    monkeypatch.setattr(peaks, "get", lambda refresh=False: H200)
    monkeypatch.setattr(profile, "run_process", runner)


def test_profile_command_bench_shape_tables_and_json(monkeypatch, capsys, tmp_path):
    calls = []
    _command_fakes(monkeypatch, _plan("verify-attn", FWD, COMBINE), fake_ncu(log_form(VERIFY_ATTN_CSV), calls=calls))
    out_json = tmp_path / "profile.json"
    code, out, err = run_kdt(monkeypatch, capsys, "profile", "verify-attn", "--shape", "G1_H8_N8_prefix1*",
                             "--json", str(out_json))
    assert code == 0, out + err
    assert "Traceback" not in err and len(calls) == 1
    line = calls[0]
    assert line[line.index("--launch-skip") + 1] == "2" and line[line.index("--launch-count") + 1] == "2"
    assert line[line.index("--kernel-name") + 1] == f"regex:^({FWD}|{COMBINE})$"
    assert line[line.index("-m"):] == ["-m", "kdt", "bench", "verify-attn", "--shape", "G1_H8_N8_prefix1024",
                                       "--no-graph", "--no-baselines"]
    for text in (FWD, COMBINE, "19.42 us", "4.51 us", "1.4% of peak", "0.7% of peak", "12.2% achieved",
                 "12.5% theoretical", "254 per thread", "0 B static + 230,952 B dynamic = 230,952 B per block",
                 "stall 1: long scoreboard", "1.98 cycles per issued instruction", "stall 4: barrier",
                 "limited by registers, shared_mem", "one call against the roofline", "0.330 us (memory)",
                 "23.94 us", "72.4x", "1.87 MB, 1.34x the model"):
        assert text in " ".join(out.split()), text   # titles wrap at their table's width
    figures = json.loads(out_json.read_text())
    assert figures["stage"] == "verify-attn" and figures["shape"] == "G1_H8_N8_prefix1024"
    assert (figures["arch"], figures["multiprocessors"]) == ("sm_90a", 132)
    assert figures["functions"] == [FWD, COMBINE] and figures["total_us"] == pytest.approx(23.936)
    assert (figures["ncu"]["launch_skip"], figures["ncu"]["launch_count"]) == (2, 2)
    fwd = figures["kernels"][0]
    assert (fwd["function"], fwd["duration_ns"], fwd["registers_per_thread"], fwd["dynamic_smem_bytes"]) == (
        FWD, 19424, 254, 230952)
    assert fwd["stalls"]["long_scoreboard"] == 1.98 and fwd["top_stalls"][0] == {"reason": "long_scoreboard",
                                                                                   "cycles_per_issue": 1.98}
    assert figures["roofline"]["x_bound"] == pytest.approx(72.43, abs=0.01)
    assert figures["roofline"]["bound_by"] == "memory" and figures["peaks"]["copy_gbps"] == 4218.0


def test_profile_command_on_a_shape_of_another_set(monkeypatch, capsys):
    """--set tp8: the shape is found in that set and the kdt bench under ncu is told the set too."""
    calls = []
    _command_fakes(monkeypatch, _plan("verify-attn", FWD, COMBINE), fake_ncu(log_form(VERIFY_ATTN_CSV), calls=calls))
    code, out, err = run_kdt(monkeypatch, capsys, "profile", "verify-attn", "--set", "tp8", "--shape",
                             "G4_H8_N16_prefix8192")
    assert code == 0, out + err
    assert calls[0][calls[0].index("-m"):] == ["-m", "kdt", "bench", "verify-attn", "--shape", "G4_H8_N16_prefix8192",
                                               "--no-graph", "--no-baselines", "--set", "tp8"]
    code, out, err = run_kdt(monkeypatch, capsys, "profile", "verify-attn", "--shape", "G4_H8_N16_prefix8192")
    assert code == 3 and "bench shape of verify-attn" in err and "G4_H8_N16_prefix8192" in err   # not in the default


def test_profile_command_golden_case_has_no_roofline(monkeypatch, capsys, root):
    monkeypatch.chdir(root)
    calls = []
    _command_fakes(monkeypatch, _plan("topk", TOPK_RESIDENT), fake_ncu(TOPK_CSV, calls=calls))
    code, out, err = run_kdt(monkeypatch, capsys, "profile", "topk", "--case", "k1_g1", "--knob", "resident=1")
    assert code == 0, out + err
    child = calls[0][calls[0].index("-m"):]
    assert child[:8] == ["-m", "kdt", "verify", "topk", "--case", "k1_g1", "--max-diffs", "0"]
    assert Path(child[child.index("--golden") + 1]) == (root / "golden" / "topk.h5").resolve()
    assert child[-2:] == ["--knob", "resident=1"]
    assert TOPK_RESIDENT in out and "10,848 B static + 40,960 B dynamic" in out and "roofline" not in out


def test_profile_command_exit_1_when_the_launches_do_not_follow_the_plan(monkeypatch, capsys):
    _command_fakes(monkeypatch, _plan("verify-attn", FWD), fake_ncu(VERIFY_ATTN_CSV, 0, "bench printout"))
    code, out, err = run_kdt(monkeypatch, capsys, "profile", "verify-attn", "--shape", "G1_H8_N8_prefix1024")
    assert code == 1 and "did not follow the plan" in out and "Traceback" not in err


def test_profile_command_exit_2_without_ncu_gpu_or_counter_permission(monkeypatch, capsys):
    _command_fakes(monkeypatch, _plan("topk", TOPK_RESIDENT), fake_ncu(TOPK_CSV), ncu=None)
    code, out, err = run_kdt(monkeypatch, capsys, "profile", "topk", "--shape", "G1_K7_vocab163840_V8_f32")
    assert code == 2 and "cannot run here" in err and "ncu (Nsight Compute) not found" in err
    assert "Traceback" not in err

    _command_fakes(monkeypatch, _plan("topk", TOPK_RESIDENT), fake_ncu(PERMISSION_LOG, 1))
    code, out, err = run_kdt(monkeypatch, capsys, "profile", "topk", "--shape", "G1_K7_vocab163840_V8_f32")
    assert code == 2 and "ERR_NVGPUCTRPERM" in err and "root" in err
    assert "NVreg_RestrictProfilingToAdminUsers=0" in err and "Traceback" not in err

    def no_gpu():
        raise runtime.GpuMissing("no GPU: CUDA reports no device")

    monkeypatch.setattr(runtime, "cupy", no_gpu)
    code, out, err = run_kdt(monkeypatch, capsys, "profile", "topk", "--shape", "G1_K7_vocab163840_V8_f32")
    assert code == 2 and "cannot run here" in err and "no GPU" in err


@pytest.mark.parametrize("args, words", [
    (("--shape", "nope*"), ["--shape", "'nope*', which matches none", "G1_H8_N8_prefix1024", "G8_H8_N8_prefix131072"]),
    (("--shape", "G1_H8_*"), ["--shape", "'G1_H8_*', which matches 2: G1_H8_N8_prefix1024, G1_H8_N16_prefix8192"]),
    (("--case", "nope"), ["--case", "'nope', which matches none", "ragged_h8_b15", "prefix_zero"]),
    (("--case", "*"), ["--case", f"which matches {GOLDEN_VERIFY_ATTN_CASES}"]),
    ((), ["--shape / --case", "neither"]),
    (("--shape", "G1_H8_N8_prefix1024", "--case", "h1_g1"), ["--shape / --case", "both"]),
    (("--shape", "G1_H8_N8_prefix1024", "--golden", "x.h5"), ["--golden", "--case"]),
    (("--shape", "G1_H8_N8_prefix1024", "--knob", "nope=1"), ["--knob", "nope"]),
])
def test_profile_command_bad_input_exit_3(monkeypatch, capsys, root, args, words):
    monkeypatch.chdir(root)
    monkeypatch.setattr(profile, "run_process", lambda *a: pytest.fail("ran ncu on bad input"))
    code, out, err = run_kdt(monkeypatch, capsys, "profile", "verify-attn", *args)
    assert code == 3, out + err
    assert "Traceback" not in err
    err = " ".join(err.split())   # the console wraps long messages
    for word in words:
        assert word in err, (word, err)


def test_profile_help_and_no_gpu_here(root):
    done = subprocess.run([sys.executable, "-m", "kdt", "profile", "--help"], capture_output=True, text=True,
                          cwd=root, env={**__import__("os").environ, "COLUMNS": "200"}, timeout=120)
    assert done.returncode == 0 and "--shape" in done.stdout and "--case" in done.stdout


# --- on the GPU -----------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.slow
def test_profile_topk_on_the_gpu(root, tmp_path):
    if profile.find_ncu() is None:
        pytest.skip("no ncu")
    out_json = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, "-m", "kdt", "profile", "topk", "--shape", "G1_K7_vocab163840_V8_f32",
                           "--json", str(out_json)], capture_output=True, text=True, cwd=root, timeout=900,
                          env={**__import__("os").environ, "COLUMNS": "200"})
    if done.returncode == 2 and profile.PERMISSION in done.stderr:
        pytest.skip("ncu may not read the performance counters here (ERR_NVGPUCTRPERM)")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out_json.read_text())
    assert [k["function"] for k in figures["kernels"]] == figures["functions"]
    assert all(k["duration_ns"] > 0 and k["registers_per_thread"] > 0 for k in figures["kernels"])
    assert figures["roofline"]["x_bound"] >= 0.5   # no kernel beats the machine's own copy rate by 2x
