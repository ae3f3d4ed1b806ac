"""The command line: exit codes (0 ok, 1 check failed, 2 environment, 3 bad input), never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def kdt(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "kdt", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "COLUMNS": "200", **(env or {})}, timeout=600)


def test_help_lists_the_commands(root):
    done = kdt("--help", cwd=root)
    assert done.returncode == 0
    for command in ("env-check", "gen-golden", "build", "verify", "bench", "pipeline", "fuzz", "sanitize"):
        assert command in done.stdout


def test_version_and_short_help(root):
    import kdt as package

    done = kdt("--version", cwd=root)
    assert done.returncode == 0 and done.stdout.strip() == f"kdt {package.__version__}"
    for args in (("-h",), ("verify", "-h"), ("bench", "-h")):
        done = kdt(*args, cwd=root)
        assert done.returncode == 0 and "Usage" in done.stdout, args


def test_a_misspelt_stage_gets_a_suggestion(root, tmp_path):
    done = kdt("gen-golden", "tree_accept", "--check", "--golden-dir", str(tmp_path), cwd=root)
    assert done.returncode == 3 and "did you mean 'tree-accept'?" in " ".join(done.stderr.split())


def test_golden_files_resolve_against_the_package_not_the_working_directory(root, tmp_path):
    done = kdt("gen-golden", "tree-build", "--check", cwd=tmp_path)
    assert done.returncode == 0 and "no drift" in done.stdout


def test_env_check_targets_the_gpu_present(monkeypatch):
    from kdt import envcheck, toolkit

    gpu = toolkit.Gpu(0, "NVIDIA H200", "sm_90", 140.0, 132)
    monkeypatch.setattr(toolkit, "gpu_report", lambda: toolkit.GpuReport("14", None, "13.0", "13.0", [gpu], None))
    assert envcheck.default_arch() == "sm_90a"
    monkeypatch.setattr(toolkit, "gpu_report", lambda: toolkit.GpuReport(None, "no CuPy", None, None, [], None))
    assert envcheck.default_arch() == "sm_120"


def test_install_hints_fit_the_installation(monkeypatch, tmp_path):
    from importlib import metadata

    from kdt import paths

    checkout = paths.PACKAGE.parent
    assert paths.install_command("gpu") == f"python3 -m pip install -e '{checkout}[gpu]'"
    assert paths.install_command() == f"python3 -m pip install -e '{checkout}'"
    # an installed wheel (no pyproject.toml beside the package): the requirements its metadata lists, markers off
    monkeypatch.setattr(paths, "PACKAGE", tmp_path / "site-packages" / "kdt")
    monkeypatch.setattr(metadata, "requires", lambda name: [
        "numpy>=1.26", "h5py>=3.10", 'cupy-cuda13x>=13; extra == "gpu"', "pytest>=8; extra == 'test'",
        'nvidia-cuda-nvdisasm>=13; sys_platform == "linux" and extra == "test"'] if name == "kdt" else None)
    assert paths.install_command("gpu") == "python3 -m pip install 'cupy-cuda13x>=13'"
    assert paths.install_command("test") == "python3 -m pip install 'pytest>=8' 'nvidia-cuda-nvdisasm>=13'"
    assert paths.install_command() == "python3 -m pip install 'numpy>=1.26' 'h5py>=3.10'"


def test_env_check_json(root):
    done = kdt("env-check", "--json", cwd=root)
    report = json.loads(done.stdout)
    names = [check["name"] for check in report["checks"]]
    assert "nvcc" in names and "cupy" in names and any(n.startswith("gpu") for n in names)
    assert "package pyelftools" in names    # kdt build reads every new cubin with it
    assert done.returncode == (0 if report["ok"] else 1)


def test_env_check_require_gpu_fails_without_one(root):
    pytest.importorskip("h5py")
    from tests.conftest import GPU_SKIP_REASON

    if GPU_SKIP_REASON is None:
        pytest.skip("this machine has a GPU")
    done = kdt("env-check", "--require-gpu", "--json", cwd=root)
    assert done.returncode == 1
    assert not json.loads(done.stdout)["ok"]


def test_env_check_bad_arch_is_a_clear_error(root):
    done = kdt("env-check", "--arch", "sm_7", cwd=root)
    assert done.returncode == 3 and "--arch" in done.stderr and "Traceback" not in done.stderr


def test_unknown_kernel(root, tmp_path):
    done = kdt("gen-golden", "nope", "--golden-dir", str(tmp_path), cwd=root)
    assert done.returncode == 3 and "expected one of" in done.stderr and "Traceback" not in done.stderr


def test_unknown_option(root):
    done = kdt("gen-golden", "--frobnicate", cwd=root)
    assert done.returncode == 3 and "Traceback" not in done.stderr


def test_gen_golden_then_check_then_drift(root, tmp_path):
    assert kdt("gen-golden", "tree-build", "--golden-dir", str(tmp_path), cwd=root).returncode == 0
    assert (tmp_path / "tree-build.h5").exists()
    assert kdt("gen-golden", "tree-build", "--check", "--golden-dir", str(tmp_path), cwd=root).returncode == 0
    import h5py

    with h5py.File(tmp_path / "tree-build.h5", "r+") as f:
        f["b1/expected/logw"][1, 1] = 0.5
    done = kdt("gen-golden", "tree-build", "--check", "--golden-dir", str(tmp_path), cwd=root)
    assert done.returncode == 1 and "expected/logw" in done.stdout


def test_check_on_a_missing_directory_reports_not_traceback(root, tmp_path):
    done = kdt("gen-golden", "topk", "--check", "--golden-dir", str(tmp_path / "none"), cwd=root)
    assert done.returncode == 1 and "no such file" in done.stdout and "Traceback" not in done.stderr


def test_read_only_golden_dir(root, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes through directory permissions")
    target = tmp_path / "ro"
    target.mkdir()
    target.chmod(0o500)
    done = kdt("gen-golden", "tree-accept", "--golden-dir", str(target), cwd=root)
    assert done.returncode != 0 and "Traceback" not in done.stderr


def test_inputs_out_roundtrip(root, tmp_path):
    from kdt import golden, stages

    spec = stages.get("tree-accept")
    fresh = golden.expected_for(spec, spec.make_cases()[:2])
    golden.write(tmp_path / "in.h5", spec, fresh, inputs_only=True)
    done = kdt("gen-golden", "--inputs", str(tmp_path / "in.h5"), "--out", str(tmp_path / "out.h5"), cwd=root)
    assert done.returncode == 0, done.stderr
    assert golden.drift(spec, tmp_path / "out.h5", fresh) == []
    half = kdt("gen-golden", "--inputs", str(tmp_path / "in.h5"), cwd=root)
    assert half.returncode == 3 and "--inputs/--out" in half.stderr


def test_arches_take_commas_and_repeats_once():
    from kdt.commands.common import parse_arches
    from kdt.refs.errors import BadInput

    assert parse_arches(["sm_90a,sm_120", "sm_120", " sm_120-emu "]) == ["sm_90a", "sm_120", "sm_120-emu"]
    with pytest.raises(BadInput, match="--arch"):
        parse_arches(["sm_90a,sm_7"])
