"""kdt sanitize without a GPU: the command lines it builds, the sanitizer logs it parses (samples written
as compute-sanitizer prints them), its verdicts and exit codes; one real run on the GPU."""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import sys
import time
from pathlib import Path

import pytest

from kdt import sanitize, stages, toolkit
from kdt.refs.errors import BadInput
from tests.test_fuzz import run_kdt

VERIFY_TAIL = "12 passed, 0 failed\n"

MEMCHECK_CLEAN = """========= COMPUTE-SANITIZER
                         kdt verify topk (golden/topk.h5)
12 passed, 0 failed
========= ERROR SUMMARY: 0 errors
"""

MEMCHECK_OOB = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at topk_select_kernel+0x2d0 in /work/main/kernels/topk.cu:212
=========     by thread (31,0,0) in block (3,0,0)
=========     Address 0x7f3c2e000a00 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f3c2e000800 of size 512 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2f0b4f] in libcuda.so.1
=========         Host Frame: [0x15b2e] in libcudart.so.13
=========
========= Invalid __global__ write of size 4 bytes
=========     at topk_select_kernel+0x2d0 in /work/main/kernels/topk.cu:212
=========     by thread (32,0,0) in block (3,0,0)
=========     Address 0x7f3c2e000a04 is out of bounds
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaStreamSynchronize.
=========     Saved host backtrace up to driver entry point at error
=========
11 passed, 1 failed
========= ERROR SUMMARY: 3 errors
"""

RACECHECK_HAZARDS = """========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at tree_build_kernel+0x4a0 in /work/main/kernels/tree_build.cu:150
=========     and Read access at tree_build_kernel+0x520 in /work/main/kernels/tree_build.cu:157 [8 hazards]
=========
========= Warning: Race reported between Write access at tree_build_kernel+0x600 in /work/main/kernels/tree_build.cu:171
=========     and Write access at tree_build_kernel+0x600 in /work/main/kernels/tree_build.cu:171 [2 hazards]
=========
17 passed, 0 failed
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
"""

RACECHECK_CLEAN = """========= COMPUTE-SANITIZER
17 passed, 0 failed
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
"""

INITCHECK_UNINITIALISED = """========= COMPUTE-SANITIZER
========= Uninitialized __global__ memory read of size 4 bytes
=========     at tree_accept_from_logits+0x1b0 in /work/main/kernels/tree_accept.cu:88
=========     by thread (5,0,0) in block (0,0,0)
=========     Address 0x7f55a4c00200
=========     Saved host backtrace up to driver entry point at kernel launch time
=========
12 passed, 0 failed
========= ERROR SUMMARY: 1 error
"""

SYNCCHECK_BARRIER = """========= COMPUTE-SANITIZER
========= Barrier error detected. Divergent thread(s) in warp
=========     at verify_attn_kernel+0x9f0 in /work/main/kernels/verify_attn.cu:301
=========     by thread (1,0,0) in block (0,0,0)
=========
========= ERROR SUMMARY: 2048 errors
========= ERROR SUMMARY: 1948 errors were not printed. Use --print-limit option to adjust the number of printed errors
6 passed, 0 failed
"""

GVISOR_UNSUPPORTED = """========= COMPUTE-SANITIZER
========= Error: Device not supported. Please refer to the "Supported Devices" section of the sanitizer documentation
========= Program hit cudaErrorUnknown (error 999) due to "unknown error" on CUDA API call to cudaMalloc.
cannot run here: no usable GPU (CUDARuntimeError: cudaErrorUnknown: unknown error)
========= ERROR SUMMARY: 1 error
"""

CRASHED = """========= COMPUTE-SANITIZER
Fatal Python error: Segmentation fault
"""

VERIFY_MISMATCH_CLEAN_MEMORY = """========= COMPUTE-SANITIZER
11 passed, 1 failed
========= ERROR SUMMARY: 0 errors
"""


def verify_tail(log: str) -> tuple[int | None, int | None]:
    """The (passed, failed) that the kdt verify inside a sample log printed, which its JSON report holds too."""
    import re

    found = re.findall(r"^(\d+) passed, (\d+) failed$", log, re.MULTILINE)
    return (int(found[-1][0]), int(found[-1][1])) if found else (None, None)


def result(log, returncode, tool="memcheck", kernel="topk"):
    passed, failed = verify_tail(log)
    return sanitize.ToolResult(kernel, tool, ["compute-sanitizer"], returncode, log, 1.0, **sanitize.parse(log),
                               verify_passed=passed, verify_failed=failed)


def test_parse_memcheck_findings():
    parsed = sanitize.parse(MEMCHECK_OOB)
    assert parsed["errors"] == 3 and parsed["hazards"] is None and "verify_summary" not in parsed
    assert parsed["findings"] == [
        "Invalid __global__ write of size 4 bytes at topk_select_kernel+0x2d0 in /work/main/kernels/topk.cu:212",
        "Invalid __global__ write of size 4 bytes at topk_select_kernel+0x2d0 in /work/main/kernels/topk.cu:212",
        'Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to '
        "cudaStreamSynchronize."]
    r = result(MEMCHECK_OOB, sanitize.ERROR_EXITCODE)
    assert r.status == "findings" and r.finding_count == 3 and r.is_failure


def test_parse_racecheck_counts_errors_and_warnings():
    parsed = sanitize.parse(RACECHECK_HAZARDS)
    assert (parsed["hazards"], parsed["race_errors"], parsed["race_warnings"]) == (2, 1, 1)
    assert parsed["errors"] is None
    assert parsed["findings"][0].startswith("Error: Race reported between Write access at tree_build_kernel+0x4a0")
    assert parsed["findings"][1].startswith("Warning: Race reported")
    # a warning alone is a finding too: every kernel must come out clean
    only_warning = RACECHECK_HAZARDS.replace("2 hazards displayed (1 error, 1 warning)", "1 hazard displayed (0 errors, 1 warning)")
    assert result(only_warning, 0, "racecheck").status == "findings"
    assert result(RACECHECK_CLEAN, 0, "racecheck").status == "clean"


def test_parse_initcheck_and_synccheck():
    init = result(INITCHECK_UNINITIALISED, sanitize.ERROR_EXITCODE, "initcheck", "tree-accept")
    assert init.errors == 1 and init.status == "findings"
    assert init.findings == ["Uninitialized __global__ memory read of size 4 bytes at tree_accept_from_logits+0x1b0 "
                             "in /work/main/kernels/tree_accept.cu:88"]
    sync = result(SYNCCHECK_BARRIER, sanitize.ERROR_EXITCODE, "synccheck", "verify-attn")
    assert sync.errors == 2048 and sync.finding_count == 2048  # not the "were not printed" line
    assert sync.findings == ["Barrier error detected. Divergent thread(s) in warp at verify_attn_kernel+0x9f0 in "
                             "/work/main/kernels/verify_attn.cu:301"]


@pytest.mark.parametrize("log, returncode, status, failure", [
    (MEMCHECK_CLEAN, 0, "clean", False),
    (MEMCHECK_OOB, 99, "findings", True),
    (VERIFY_MISMATCH_CLEAN_MEMORY, 1, "verify failed", True),
    (GVISOR_UNSUPPORTED, 2, "unsupported", False),
    (CRASHED, -11, "crashed", True),
    ("========= COMPUTE-SANITIZER\ncannot run here: no GPU\n", 2, "environment", False),
    (MEMCHECK_CLEAN, None, "timeout", True),
])
def test_statuses(log, returncode, status, failure):
    r = result(log, returncode)
    assert r.status == status and r.is_failure == failure and r.clean == (status == "clean")


def test_exit_codes():
    clean, found, unsupported = result(MEMCHECK_CLEAN, 0), result(MEMCHECK_OOB, 99), result(GVISOR_UNSUPPORTED, 2)
    assert sanitize.exit_code([clean, clean]) == 0
    assert sanitize.exit_code([clean, found, unsupported]) == 1
    assert sanitize.exit_code([clean, unsupported]) == 2


def test_command_lines():
    line = sanitize.command("/cuda/bin/compute-sanitizer", "tree-build", "memcheck", "/tmp/r.json",
                            python="/usr/bin/python3")
    assert line[:5] == ["/cuda/bin/compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "99"]
    assert line[5:8] == ["/usr/bin/python3", "-c", sanitize.BOOT]
    assert line[8:] == ["verify", "tree-build", "--max-diffs", "0", "--json", "/tmp/r.json"]
    race = sanitize.command("cs", "topk", "racecheck", "r.json", case="k1_*", knobs=["resident=0"])
    assert race[race.index("--racecheck-report") + 1] == "all" and race[-4:] == ["--case", "k1_*", "--knob", "resident=0"]
    for tool in ("initcheck", "synccheck"):
        assert "--racecheck-report" not in sanitize.command("cs", "topk", tool, "r.json")
    with pytest.raises(ValueError, match="tool"):
        sanitize.command("cs", "topk", "leakcheck", "r.json")
    assert "set_allocator(None)" in sanitize.BOOT and "main()" in sanitize.BOOT
    env = sanitize.child_env({"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(":") == [str(sanitize.ROOT), "/elsewhere"]


def test_the_boot_code_is_kdt_itself(root):
    """BOOT runs the kdt command line (here: --help) even where CuPy is missing."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", sanitize.BOOT, "--help"], capture_output=True, text=True,
                          env=sanitize.child_env(), cwd=root, timeout=120)
    assert done.returncode == 0 and "verify" in done.stdout


def _fake_runner(logs):
    """A stand-in for compute-sanitizer + kdt verify: returns the sample log and, as the verify inside would, writes
    its JSON report with the cases the log's summary line counts."""
    import json

    calls = []

    def run(line, timeout_s, env, cwd):
        calls.append(line)
        tool, kernel = line[line.index("--tool") + 1], line[line.index("verify") + 1]
        returncode, log = logs[(kernel, tool)]
        passed, failed = verify_tail(log)
        if passed is not None:
            cases = [{"passed": True}] * passed + [{"passed": False}] * failed
            Path(line[line.index("--json") + 1]).write_text(json.dumps({"passed": not failed, "cases": cases}))
        return returncode, log

    return run, calls


def test_run_sanitize_runs_every_kernel_under_every_tool_and_keeps_logs(tmp_path):
    logs = {(k, t): (0, RACECHECK_CLEAN if t == "racecheck" else MEMCHECK_CLEAN)
            for k in ("topk", "tree-build") for t in sanitize.TOOLS}
    logs[("tree-build", "racecheck")] = (sanitize.ERROR_EXITCODE, RACECHECK_HAZARDS)
    runner, calls = _fake_runner(logs)
    seen = []
    results = sanitize.run_sanitize(["topk", "tree-build"], sanitizer="cs", runner=runner, keep_logs=tmp_path / "logs",
                                    on_result=seen.append)
    assert [(r.kernel, r.tool) for r in results] == [(k, t) for k in ("topk", "tree-build") for t in sanitize.TOOLS]
    assert len(calls) == 8 and seen == results
    assert [r.status for r in results if not r.clean] == ["findings"]
    assert results[0].verify_summary == "12 passed, 0 failed" and results[5].verify_summary == "17 passed, 0 failed"
    assert (tmp_path / "logs" / "tree-build.racecheck.log").read_text() == RACECHECK_HAZARDS
    assert results[5].log_path == tmp_path / "logs" / "tree-build.racecheck.log"
    assert sanitize.exit_code(results) == 1


def test_no_sanitizer_is_an_environment_error(monkeypatch):
    monkeypatch.setattr(sanitize, "find_sanitizer", lambda: None)
    with pytest.raises(toolkit.ToolkitMissing, match="compute-sanitizer not found"):
        sanitize.run_sanitize(["topk"])


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_find_sanitizer_next_to_nvcc(tmp_path, monkeypatch):
    nvcc = _executable(tmp_path / "cuda" / "bin" / "nvcc")
    monkeypatch.setattr(toolkit, "find_nvcc", lambda: toolkit.Nvcc(nvcc, "PATH", "13.0.88"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    # the toolkit's own layout: <root>/compute-sanitizer/compute-sanitizer
    inner = _executable(tmp_path / "cuda" / "compute-sanitizer" / "compute-sanitizer")
    found = sanitize.find_sanitizer()
    assert found == inner or found.name == "compute-sanitizer"  # a system one in /usr/local/cuda may come first
    beside = _executable(tmp_path / "cuda" / "bin" / "compute-sanitizer")
    assert sanitize.find_sanitizer() == beside


def test_run_process_merges_output_and_kills_on_timeout(tmp_path):
    code, output = sanitize.run_process([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); "
                                         "sys.exit(3)"], 60, sanitize.child_env(), tmp_path)
    assert code == 3 and "out" in output and "err" in output
    code, output = sanitize.run_process([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                                        1.0, sanitize.child_env(), tmp_path)
    assert code is None and "started" in output and "killed after 1 s" in output


# --- the command ----------------------------------------------------------------------------------------

def _command_fakes(monkeypatch, logs):
    from kdt.commands import common

    monkeypatch.setattr(sanitize, "find_sanitizer", lambda: Path("/cuda/bin/compute-sanitizer"))
    monkeypatch.setattr(common, "preflight", lambda specs: None)
    runner, calls = _fake_runner(logs)
    monkeypatch.setattr(sanitize, "run_process", runner)
    return calls


def test_sanitize_command_table_and_exit_1_on_a_finding(monkeypatch, capsys, tmp_path):
    logs = {("tree-accept", t): (0, RACECHECK_CLEAN if t == "racecheck" else MEMCHECK_CLEAN) for t in sanitize.TOOLS}
    logs[("tree-accept", "initcheck")] = (sanitize.ERROR_EXITCODE, INITCHECK_UNINITIALISED)
    calls = _command_fakes(monkeypatch, logs)
    code, out, err = run_kdt(monkeypatch, capsys, "sanitize", "tree-accept", "--keep-logs", str(tmp_path),
                             "--jobs", "1")
    assert code == 1, out + err
    assert len(calls) == 4 and "Traceback" not in err
    assert "kdt sanitize" in out and "1 finding" in out and "clean" in out and "12 passed, 0 failed" in out
    assert "Uninitialized __global__ memory read of size 4 bytes" in out and "tree_accept.cu:88" in out
    assert (tmp_path / "tree-accept.initcheck.log").exists()


def test_sanitize_command_clean_and_tool_choice(monkeypatch, capsys):
    logs = {(k, "memcheck"): (0, MEMCHECK_CLEAN) for k in stages.names()}
    calls = _command_fakes(monkeypatch, logs)
    code, out, err = run_kdt(monkeypatch, capsys, "sanitize", "all", "--tool", "memcheck", "--jobs", "1")
    assert code == 0, out + err
    assert len(calls) == len(stages.names()) and "clean:" in out


def test_sanitize_command_unsupported_device_exits_2(monkeypatch, capsys):
    calls = _command_fakes(monkeypatch, {("topk", "memcheck"): (2, GVISOR_UNSUPPORTED)})
    code, out, err = run_kdt(monkeypatch, capsys, "sanitize", "topk", "--tool", "memcheck", "--jobs", "1")
    assert code == 2 and "could not check" in out and len(calls) == 1


def test_sanitize_command_bad_tool_and_missing_sanitizer(monkeypatch, capsys):
    code, out, err = run_kdt(monkeypatch, capsys, "sanitize", "topk", "--tool", "leakcheck")
    assert code == 3 and "--tool" in err and "leakcheck" in err
    monkeypatch.setattr(sanitize, "find_sanitizer", lambda: None)
    code, out, err = run_kdt(monkeypatch, capsys, "sanitize", "topk")
    assert code == 2 and "compute-sanitizer not found" in err and "Traceback" not in err


def test_golden_case_names_are_the_verify_inside_cases():
    assert sanitize.golden_case_names("tree-sample", "top_*") == ["top_k_only", "top_p_only", "top_k_and_top_p"]
    import h5py

    from kdt import golden
    with h5py.File(golden.default_path(None, "tree-accept"), "r") as f:
        assert sanitize.golden_case_names("tree-accept") == list(f)
    with pytest.raises(BadInput, match="--case"):
        sanitize.golden_case_names("topk", "no_such_case*")


def _per_case_runner(logs):
    """The fake sanitizer for one run a case: the log by (kernel, tool, case), where the case is read back from the
    escaped --case the run was given; the verify inside reports that one case."""
    import json

    calls = []

    def run(line, timeout_s, env, cwd):
        calls.append(line)
        tool, kernel = line[line.index("--tool") + 1], line[line.index("verify") + 1]
        pattern = line[line.index("--case") + 1]
        name = next(name for (k, t, name) in logs if (k, t) == (kernel, tool) and fnmatch.fnmatchcase(name, pattern))
        returncode, log = logs[(kernel, tool, name)]
        if returncode is not None:
            passed = "failed" not in log.split("passed, ")[-1][:3]
            Path(line[line.index("--json") + 1]).write_text(json.dumps({"cases": [{"passed": passed}]}))
        return returncode, log

    return run, calls


def test_jobs_run_one_case_at_a_time_and_merge_per_kernel_and_tool(tmp_path):
    cases = ["plain", "odd[1]*", "last"]   # glob characters in a name: each run must match that case only
    tools = ("memcheck", "racecheck")
    logs = {(k, t, c): (0, RACECHECK_CLEAN if t == "racecheck" else MEMCHECK_CLEAN)
            for k in ("topk", "tree-build") for t in tools for c in cases}
    logs[("tree-build", "racecheck", "odd[1]*")] = (sanitize.ERROR_EXITCODE, RACECHECK_HAZARDS)
    logs[("topk", "memcheck", "last")] = (None, "started\n[kdt sanitize: killed after 5 s]\n")
    runner, calls = _per_case_runner(logs)
    seen = []
    results = sanitize.run_sanitize(["topk", "tree-build"], tools, sanitizer="cs", runner=runner, jobs=3,
                                    case_names=lambda kernel, pattern: cases, keep_logs=tmp_path, on_result=seen.append)
    assert len(calls) == 12 and seen == results
    assert sorted(line[line.index("--case") + 1] for line in calls) == sorted(
        [glob.escape(c) for c in cases] * 4)
    assert [(r.kernel, r.tool, r.status) for r in results] == [
        ("topk", "memcheck", "timeout"), ("topk", "racecheck", "clean"),
        ("tree-build", "memcheck", "clean"), ("tree-build", "racecheck", "findings")]
    race = results[3]
    assert [part.case for part in race.parts] == cases and race.finding_count == 2 and race.hazards == 2
    assert race.findings and all(line.startswith("[odd[1]*] ") for line in race.findings)
    assert results[1].verify_summary == "3 passed, 0 failed"
    log = (tmp_path / "tree-build.racecheck.log").read_text()
    assert all(f"case {c} =====" in log for c in cases) and "RACECHECK SUMMARY: 2 hazards" in log
    assert results[0].returncode is None and sanitize.exit_code(results) == 1
    assert sanitize.exit_code(results[1:3]) == 0


def test_an_interrupt_kills_every_running_case(tmp_path):
    pids = tmp_path / "pids"
    sanitizer = tmp_path / "compute-sanitizer"
    sanitizer.write_text(f"#!/bin/sh\necho $$ >> {pids}\nexec sleep 60\n")
    sanitizer.chmod(0o755)

    def started_children() -> int:
        return len(pids.read_text().split()) if pids.exists() else 0

    def runner(line, timeout_s, env, cwd):
        if line[-1] == "boom":   # the first case's run is interrupted once the other two are running
            while started_children() < 2:
                time.sleep(0.05)
            raise KeyboardInterrupt
        return sanitize.run_process(line, timeout_s, env, cwd)

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        sanitize.run_sanitize(["topk"], ["memcheck"], sanitizer=sanitizer, runner=runner, jobs=3,
                              case_names=lambda kernel, pattern: ["boom", "slow", "slower"])
    while sanitize._RUNNING and time.monotonic() - started < 20:
        time.sleep(0.05)
    assert time.monotonic() - started < 20 and not sanitize._RUNNING
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_sanitize_command_jobs_runs_every_case(monkeypatch, capsys):
    logs = {("tree-accept", t, c): (0, RACECHECK_CLEAN if t == "racecheck" else MEMCHECK_CLEAN)
            for t in sanitize.TOOLS for c in sanitize.golden_case_names("tree-accept")}
    logs[("tree-accept", "initcheck", "k1")] = (sanitize.ERROR_EXITCODE, INITCHECK_UNINITIALISED)
    from kdt.commands import common

    monkeypatch.setattr(sanitize, "find_sanitizer", lambda: Path("/cuda/bin/compute-sanitizer"))
    monkeypatch.setattr(common, "preflight", lambda specs: None)
    runner, calls = _per_case_runner(logs)
    monkeypatch.setattr(sanitize, "run_process", runner)
    code, out, err = run_kdt(monkeypatch, capsys, "sanitize", "tree-accept", "--jobs", "4", "--format", "json")
    runs = 4 * len(sanitize.golden_case_names("tree-accept"))
    assert code == 1 and len(calls) == runs and f"{runs} runs" in err and "4 at a time" in err
    document = json.loads(out)
    statuses = {r["tool"]: r["status"] for r in document["results"]}
    assert statuses == {"memcheck": "clean", "racecheck": "clean", "initcheck": "findings", "synccheck": "clean"}
    initcheck = next(r for r in document["results"] if r["tool"] == "initcheck")
    assert [c["status"] for c in initcheck["cases"] if c["case"] == "k1"] == ["findings"]
    assert initcheck["findings"][0].startswith("[k1] Uninitialized __global__ memory read")


def test_sanitize_command_bad_case_before_any_run(monkeypatch, capsys):
    calls = _command_fakes(monkeypatch, {})
    code, out, err = run_kdt(monkeypatch, capsys, "sanitize", "topk", "--case", "no_such_case*")
    assert code == 3 and "--case" in err and "no_such_case*" in err and calls == []


# --- on the GPU -----------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("tool", sanitize.TOOLS)
def test_tree_accept_is_clean_under_the_sanitizer(tool, root):
    if sanitize.find_sanitizer() is None:
        pytest.skip("no compute-sanitizer")
    (r,) = sanitize.run_sanitize(["tree-accept"], [tool], case="k1", cwd=root, timeout_s=600)
    if r.status in ("unsupported", "environment"):
        pytest.skip(f"compute-sanitizer cannot run here: {r.log[-500:]}")
    assert r.clean, f"{r.status}: {r.findings[:5]}\n{r.log[-3000:]}"
