"""Hostile inputs, each tried and named: it must end in a clear message and its exit code (1 check failed,
2 this machine cannot run it, 3 bad arguments or input files), never a traceback, never a half-written file.
plans/reliability.md lists every case with the test that covers it (some live in test_golden.py and
test_cli.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.cli_run import run_kdt_cli

from kdt import build, golden, runtime, stages, toolkit
from kdt.spec import Case
from kdt.refs.errors import BadInput
from tests.test_fuzz import run_kdt
from tests.faults import fill_the_disk


def words(text: str) -> str:
    return " ".join(text.split())


def kdt_subprocess(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "kdt", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "COLUMNS": "200", **(env or {})}, timeout=300)


@pytest.fixture
def no_cupy(monkeypatch):
    """CuPy not importable, as on a machine without a GPU (also on one with a GPU)."""
    monkeypatch.setitem(sys.modules, "cupy", None)
    runtime.cupy.cache_clear()
    yield
    runtime.cupy.cache_clear()


@pytest.fixture
def fake_gpu(monkeypatch):
    """A GPU that is never used: commands get past their "is there a GPU" check and fail on what follows."""
    monkeypatch.setattr(runtime, "cupy", lambda: types.SimpleNamespace())
    monkeypatch.setattr(runtime, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(runtime, "default_arches", lambda: ["sm_90"])
    monkeypatch.setattr(runtime, "multiprocessors", lambda: 132)
    monkeypatch.setattr(build, "build", lambda kernel, arch, **kw: build.BuildResult(build.kernel_name(kernel), arch,
                                                                                     Path("x"), True))


TREE_BUILD = stages.get("tree-build")


@pytest.fixture(scope="module")
def tree_build_cases():
    return golden.expected_for(TREE_BUILD, [c for c in TREE_BUILD.make_cases() if c.name in ("b1", "k1_star")])


# --- golden files through `kdt verify` (the unit tests are in test_golden.py) -----------------------------

def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _edit(edit):
    def apply(path: Path) -> None:
        with h5py.File(path, "r+") as f:
            edit(f)
    return apply


def _replace(name, data):
    def edit(f):
        del f[name]
        f.create_dataset(name, data=data)
    return edit


@pytest.mark.parametrize("damage, problem", [
    (_cut, "truncated"),
    (lambda p: p.unlink(), "no such file"),
    (_edit(lambda f: f.attrs.__setitem__("schema_version", 2)), "schema_version 2, this kdt reads 1"),
    (_edit(lambda f: f["b1/expected"].__delitem__("logw")), "lacks the expected dataset 'logw'"),
    (_edit(lambda f: f["b1/inputs"].__delitem__("top_logp")), "lacks the input dataset 'top_logp'"),
    (_edit(_replace("b1/expected/n_nodes", np.zeros(3, np.int64))), "expected/n_nodes is int64"),
    (_edit(_replace("b1/expected/parent", np.zeros((3, 3), np.int32))), "expected/parent is int32 (3, 3)"),
    (_edit(lambda f: f.attrs.__setitem__("kernel", "topk")), "holds kernel 'topk'"),
], ids=["truncated", "missing-file", "schema-version", "missing-dataset", "missing-input", "wrong-dtype",
        "wrong-shape", "other-kernel"])
def test_verify_names_a_broken_golden_file(tmp_path, monkeypatch, capsys, fake_gpu, tree_build_cases, damage, problem):
    path = tmp_path / "tree-build.h5"
    golden.write(path, TREE_BUILD, tree_build_cases)
    damage(path)
    code, out, err = run_kdt_cli(monkeypatch, capsys, "verify", "tree-build", "--golden", str(path))
    assert code == 1 and "golden file error" in err and problem in words(err), err
    assert "Traceback" not in err


def test_gen_golden_inputs_names_a_truncated_or_foreign_file(tmp_path, monkeypatch, capsys, tree_build_cases):
    captured = tmp_path / "captured.h5"
    golden.write(captured, TREE_BUILD, tree_build_cases, inputs_only=True)
    _cut(captured)
    code, out, err = run_kdt_cli(monkeypatch, capsys, "gen-golden", "--inputs", str(captured), "--out",
                                 str(tmp_path / "out.h5"))
    assert code == 1 and "truncated" in words(err) and not (tmp_path / "out.h5").exists()
    captured.write_text("kernel,schema_version\ntopk,1\n")
    code, out, err = run_kdt_cli(monkeypatch, capsys, "gen-golden", "--inputs", str(captured), "--out",
                                 str(tmp_path / "out.h5"))
    assert code == 1 and "not a readable HDF5 file" in words(err) and not (tmp_path / "out.h5").exists()


def test_gen_golden_check_reports_a_truncated_file_as_drift(tmp_path, monkeypatch, capsys, root):
    golden.write(tmp_path / "tree-build.h5", TREE_BUILD, golden.expected_for(TREE_BUILD, TREE_BUILD.make_cases()))
    _cut(tmp_path / "tree-build.h5")
    code, out, err = run_kdt_cli(monkeypatch, capsys, "gen-golden", "tree-build", "--check", "--golden-dir",
                                 str(tmp_path))
    assert code == 1 and "truncated" in words(out) and "Traceback" not in err


# --- a read-only golden directory, a full disk, an interrupted write ---------------------------------------

def _old_golden(tmp_path) -> tuple[Path, bytes]:
    path = tmp_path / "tree-build.h5"
    path.write_bytes(b"the old file")
    return path, path.read_bytes()


def test_read_only_golden_directory(tmp_path, monkeypatch, capsys):
    """As root a chmod does not stop a write (test_cli.py::test_read_only_golden_dir covers it for other
    users), so the file system's answer is simulated where the write asks for its temporary file."""
    path, before = _old_golden(tmp_path)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path))

    monkeypatch.setattr(golden.tempfile, "mkstemp", refuse)
    code, out, err = run_kdt_cli(monkeypatch, capsys, "gen-golden", "tree-build", "--golden-dir", str(tmp_path))
    assert code == 2 and "file system error" in err and "Permission denied" in err and "Traceback" not in err
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["tree-build.h5"]


def test_a_rename_refused_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, capsys):
    path, before = _old_golden(tmp_path)

    def refuse(source, target):
        raise PermissionError(1, "Operation not permitted", str(target))

    monkeypatch.setattr(golden.os, "replace", refuse)
    code, out, err = run_kdt_cli(monkeypatch, capsys, "gen-golden", "tree-build", "--golden-dir", str(tmp_path))
    assert code == 2 and "Operation not permitted" in err and "Traceback" not in err
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["tree-build.h5"]


def test_full_disk_while_writing(tmp_path, monkeypatch, capsys):
    path, before = _old_golden(tmp_path)

    fill_the_disk(monkeypatch)
    code, out, err = run_kdt_cli(monkeypatch, capsys, "gen-golden", "tree-build", "--golden-dir", str(tmp_path))
    assert code == 2 and "No space left on device" in err and "Traceback" not in err
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["tree-build.h5"]


def test_an_interrupted_write_leaves_the_old_file(tmp_path, monkeypatch, tree_build_cases):
    path, before = _old_golden(tmp_path)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(golden, "_write_array", interrupted)
    with pytest.raises(KeyboardInterrupt):
        golden.write(path, TREE_BUILD, tree_build_cases)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["tree-build.h5"]


def test_golden_dir_that_is_a_file(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "golden"
    blocker.write_text("a file where the directory should be")
    code, out, err = run_kdt_cli(monkeypatch, capsys, "gen-golden", "tree-build", "--golden-dir", str(blocker))
    assert code == 2 and "file system error" in err and "Traceback" not in err
    assert blocker.read_text() == "a file where the directory should be"


# --- values and shapes the contract forbids, through `kdt gen-golden --inputs` ------------------------------

def _tree_accept_with_logits(value):
    from kdt.refs.tree_build import tree_build

    lp = np.array([[[-0.5, -1.0], [-0.25, -2.0]]], np.float32)
    tree = tree_build(lp, np.array([[[3, 4], [5, 6]]], np.int32), 3)
    logits = np.zeros((1, 4, 8), np.float32)
    logits[0, 1, 2] = value
    inputs = {name: tree[name] for name in ("token", "first_child", "next_sibling", "n_nodes")}
    return Case("bad", "", 0, {"max_depth": 2}, {**inputs, "target_logits": logits})


def _topk(logits, k=2):
    return Case("bad", "", 0, {"k": k}, {"logits": np.asarray(logits, np.float32)})


def _tree_build(top_logp, budget=4, ids_dtype=np.int32):
    top_logp = np.asarray(top_logp, np.float32)
    return Case("bad", "", 0, {"budget": budget},
                {"top_logp": top_logp, "top_ids": np.arange(top_logp.size, dtype=ids_dtype).reshape(top_logp.shape)})


def _attention(change):
    from kdt.stages import verify_attn

    inputs = verify_attn.attention_inputs(np.random.default_rng(1), [70], 1, 2, 2, 3)
    change(inputs)
    return verify_attn._case("bad", "", 0, inputs)


def _set(name, index, value):
    def change(inputs):
        inputs[name][index] = value
    return change


HOSTILE_VALUES = [
    ("topk", _topk([[[1.0, np.nan, 0.5]]]), "logits", "no NaN"),
    ("topk", _topk([[[1.0, np.inf, 0.5]]]), "logits", "no +inf"),
    ("topk", _topk([[[-np.inf, -np.inf, -np.inf]]], k=1), "logits", "a finite logit"),
    ("topk", _topk(np.zeros((1, 1, 2000)), k=1025), "k", "[1, min(vocab=2000, 1024)]"),
    ("topk", _topk([[[1.0, 2.0]]], k=3), "k", "min(vocab=2", ),
    ("tree-build", _tree_build([[[-0.5, np.nan]]]), "top_logp", "no NaN"),
    ("tree-build", _tree_build([[[np.inf, -1.0]]]), "top_logp", "no +inf"),
    ("tree-build", _tree_build([[[-1.0, -0.5]]]), "top_logp", "non-increasing"),
    ("tree-build", _tree_build([[[-0.5]]], budget=1024), "budget", "[1, 1023]"),
    ("tree-build", _tree_build(np.zeros((1, 65, 1))), "top_logp", "K (axis 1) in [1, 64]"),
    ("tree-build", _tree_build(np.zeros((1, 1, 1025))), "top_logp", "V (axis 2) in [1, 1024]"),
    ("tree-build", _tree_build([[[-0.5]]], ids_dtype=np.int64), "top_ids", "int32"),
    ("tree-accept", _tree_accept_with_logits(np.nan), "target_logits", "no NaN"),
    ("verify-attn", _attention(_set("prefix_len", 0, 10_000)), "prefix_len[0]", "a length in [0, 128]"),
    ("verify-attn", _attention(_set("block_table", (0, 0), 999)), "block_table[0]", "page ids in"),
]


@pytest.mark.parametrize("kernel, case, argument, expected", HOSTILE_VALUES,
                         ids=[f"{k}-{a}-{i}" for i, (k, _, a, _) in enumerate(HOSTILE_VALUES)])
def test_forbidden_values_and_shapes_through_gen_golden_inputs(tmp_path, monkeypatch, capsys, kernel, case, argument,
                                                              expected):
    spec = stages.get(kernel)
    captured = tmp_path / "captured.h5"
    golden.write(captured, spec, [golden.GoldenCase(case, {})], inputs_only=True)
    out_file = tmp_path / "out.h5"
    code, out, err = run_kdt_cli(monkeypatch, capsys, "gen-golden", "--inputs", str(captured), "--out", str(out_file))
    text = words(err)
    assert code == 3, err
    assert f"{argument}: expected" in text and expected in text and "Traceback" not in err
    assert f"case {case.name!r}" in text and "captured.h5" in text          # which file and which case
    assert not out_file.exists() and sorted(os.listdir(tmp_path)) == ["captured.h5"]


def test_gen_golden_never_writes_over_its_inputs(tmp_path, monkeypatch, capsys, tree_build_cases):
    """--out naming the --inputs file, directly or through a link, is refused before anything is read or written."""
    captured = tmp_path / "captured.h5"
    golden.write(captured, TREE_BUILD, [golden.GoldenCase(item.case, {}) for item in tree_build_cases],
                 inputs_only=True)
    before = captured.read_bytes()
    link = tmp_path / "link.h5"
    link.symlink_to(captured)
    for out in (captured, link, tmp_path / "." / "captured.h5"):
        code, _, err = run_kdt_cli(monkeypatch, capsys, "gen-golden", "--inputs", str(captured), "--out", str(out))
        assert code == 3 and "--out" in err and "Traceback" not in err, err
    assert captured.read_bytes() == before and link.is_symlink()


@pytest.mark.parametrize("drop", ["input", "parameter"])
def test_gen_golden_inputs_with_a_missing_input_or_parameter(tmp_path, monkeypatch, capsys, drop):
    captured = tmp_path / "captured.h5"
    golden.write(captured, TREE_BUILD, [golden.GoldenCase(_tree_build([[[-0.5, -1.0]]]), {})], inputs_only=True)
    with h5py.File(captured, "r+") as f:
        if drop == "input":
            del f["bad/inputs/top_ids"]
        else:
            del f["bad"].attrs["budget"]
    code, out, err = run_kdt_cli(monkeypatch, capsys, "gen-golden", "--inputs", str(captured), "--out",
                                 str(tmp_path / "out.h5"))
    assert code == 3 and ("top_ids" if drop == "input" else "budget") in err and "Traceback" not in err


# --- shapes beyond the contract's limits, checked before any launch (kdt.ops calls check_layout) -----------

def _layout(kernel, inputs, params):
    spec = stages.get(kernel)
    shapes = {name: tuple(shape) for name, (shape, _) in inputs.items()}
    dtypes = {name: dtype for name, (_, dtype) in inputs.items()}
    with pytest.raises(BadInput) as error:
        spec.check_layout(shapes, dtypes, params)
    return error.value


TREE = {"token": ((2, 8), "int32"), "first_child": ((2, 8), "int32"), "next_sibling": ((2, 8), "int32"),
        "n_nodes": ((2,), "int32")}
ATTENTION = {"q": ((2, 8, 4, 576), "bfloat16"), "kv_cache": ((5, 64, 576), "bfloat16"),
             "block_table": ((2, 3), "int32"), "prefix_len": ((2,), "int32"), "kv_tree": ((2, 8, 576), "bfloat16"),
             "mask": ((2, 8, 1), "uint32"), "n_nodes": ((2,), "int32")}


@pytest.mark.parametrize("kernel, inputs, params, argument", [
    ("topk", {"logits": ((1, 2, 262145), "float32")}, {"k": 8}, "logits"),
    ("topk", {"logits": ((1, 2, 4096), "float32")}, {"k": 1025}, "k"),
    ("topk", {"logits": ((1, 2, 4096), "float32")}, {"k": 0}, "k"),
    ("topk", {"logits": ((1, 2, 4096), "float16")}, {"k": 8}, "logits"),
    ("topk", {"logits": ((2, 4096), "float32")}, {"k": 8}, "logits"),
    ("tree-build", {"top_logp": ((1, 7, 8), "float32"), "top_ids": ((1, 7, 8), "int32")}, {"budget": 1024}, "budget"),
    ("tree-build", {"top_logp": ((1, 7, 8), "float32"), "top_ids": ((1, 7, 8), "int32")}, {"budget": 0}, "budget"),
    ("tree-build", {"top_logp": ((1, 65, 8), "float32"), "top_ids": ((1, 65, 8), "int32")}, {"budget": 63}, "top_logp"),
    ("tree-build", {"top_logp": ((1, 7, 1025), "float32"), "top_ids": ((1, 7, 1025), "int32")}, {"budget": 63},
     "top_logp"),
    ("tree-build", {"top_logp": ((1, 7, 8), "float32"), "top_ids": ((1, 7, 9), "int32")}, {"budget": 63}, "top_ids"),
    ("tree-accept", TREE, {"max_depth": 7}, "target_predict/target_logits"),
    ("tree-accept", {**TREE, "target_predict": ((2, 8), "int32"), "target_logits": ((2, 8, 5), "float32")},
     {"max_depth": 7}, "target_predict/target_logits"),
    ("tree-accept", {**TREE, "target_predict": ((2, 8), "int32")}, {"max_depth": 0}, "max_depth"),
    ("tree-accept", {**TREE, "target_predict": ((2, 9), "int32")}, {"max_depth": 7}, "target_predict"),
    ("verify-attn", ATTENTION, {"softmax_scale": 0.04, "d_v": 577}, "d_v"),
    ("verify-attn", ATTENTION, {"softmax_scale": 0.04, "d_v": 512, "out_dtype": "float16"}, "out_dtype"),
    ("verify-attn", {**ATTENTION, "kv_cache": ((5, 32, 576), "bfloat16")}, {"softmax_scale": 0.04, "d_v": 512},
     "kv_cache"),
    ("verify-attn", {**ATTENTION, "mask": ((2, 8, 2), "uint32")}, {"softmax_scale": 0.04, "d_v": 512}, "mask"),
    ("verify-attn", {**ATTENTION, "q": ((2, 8, 4, 576), "float32")}, {"softmax_scale": 0.04, "d_v": 512}, "q"),
])
def test_shapes_beyond_the_limits_are_bad_input(kernel, inputs, params, argument):
    error = _layout(kernel, inputs, params)
    assert error.argument == argument and "expected" in str(error)


# --- a kernel that does not compile, no nvcc ---------------------------------------------------------------

@pytest.mark.nvcc
def test_a_kernel_that_does_not_compile(tmp_path, root):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "topk.cu").write_text('extern "C" __global__ void topk(int* out) { out[0] = undefined_name; }\n')
    cache = tmp_path / "cache"
    done = kdt_subprocess("build", "topk", "--arch", "sm_90", cwd=root,
                          env={"KDT_KERNELS_DIR": str(kernels), "KDT_CACHE_DIR": str(cache)})
    assert done.returncode == 2, done.stderr
    assert "compile error in topk for sm_90" in words(done.stderr) and "topk.cu(1)" in done.stderr
    assert "undefined_name" in done.stderr and "Traceback" not in done.stderr
    assert not any(p.is_file() for p in cache.rglob("*"))  # no cubin, no temporary left behind


def test_a_missing_kernel_source(tmp_path, root):
    done = kdt_subprocess("build", "topk", "--arch", "sm_90", cwd=root,
                          env={"KDT_KERNELS_DIR": str(tmp_path), "KDT_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 2 and "no kernel source at" in words(done.stderr) and "Traceback" not in done.stderr


@pytest.mark.nvcc
def test_fuzz_stops_before_any_case_on_a_kernel_that_does_not_compile(tmp_path, monkeypatch, capsys):
    (tmp_path / "tree_build.cu").write_text("this is not CUDA\n")
    monkeypatch.setattr(build, "KERNELS_DIR", tmp_path)
    monkeypatch.setenv("KDT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(runtime, "cupy", lambda: types.SimpleNamespace())
    monkeypatch.setattr(runtime, "device_arch", lambda: "sm_90")
    code, out, err = run_kdt(monkeypatch, capsys, "fuzz", "tree-build", "--cases", "1")
    assert code == 2 and "compile error in tree-build" in words(err) and "Traceback" not in err


@pytest.fixture
def no_nvcc(monkeypatch, tmp_path):
    """No nvcc anywhere: not on PATH, no CUDA_HOME / CUDA_PATH, and cuda-pathfinder finds nothing."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setitem(sys.modules, "cuda.pathfinder",
                        types.SimpleNamespace(find_nvidia_binary_utility=lambda name: None))
    assert toolkit.find_nvcc() is None


def test_no_nvcc_build(no_nvcc, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("KDT_CACHE_DIR", str(tmp_path / "cache"))
    code, out, err = run_kdt_cli(monkeypatch, capsys, "build", "topk", "--arch", "sm_90")
    assert code == 2 and "cannot run here" in err and "nvcc not found" in err and "Traceback" not in err


def test_no_nvcc_env_check(no_nvcc, monkeypatch, capsys):
    code, out, err = run_kdt_cli(monkeypatch, capsys, "env-check", "--json")
    import json

    report = json.loads(out)
    nvcc = next(check for check in report["checks"] if check["name"] == "nvcc")
    assert code == 1 and not report["ok"] and not nvcc["ok"]


def test_no_nvcc_no_sanitizer(no_nvcc, monkeypatch, capsys):
    from kdt import sanitize

    if Path("/usr/local/cuda/bin/compute-sanitizer").exists():
        pytest.skip("a system compute-sanitizer is installed")
    assert sanitize.find_sanitizer() is None
    code, out, err = run_kdt(monkeypatch, capsys, "sanitize", "topk")
    assert code == 2 and "compute-sanitizer not found" in err and "Traceback" not in err


# --- no GPU -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [("verify", "topk"), ("bench", "tree-build", "--quick")], ids=["verify", "bench"])
def test_no_gpu(no_cupy, monkeypatch, capsys, args):
    code, out, err = run_kdt_cli(monkeypatch, capsys, *args)
    assert code == 2 and "cannot run here" in err and "CuPy is not importable" in words(err)
    assert "Traceback" not in err


def test_verify_without_a_gpu_checks_the_golden_file_and_writes_its_reports(no_cupy, monkeypatch, capsys, tmp_path,
                                                                            tree_build_cases):
    """No GPU: a broken --golden is still found (exit 1, named); a good one gets exit 2 and --json / --junit reports
    that say why, so a CI collector has something to show."""
    broken = tmp_path / "broken.h5"
    broken.write_bytes(b"not hdf5")
    code, out, err = run_kdt_cli(monkeypatch, capsys, "verify", "tree-build", "--golden", str(broken))
    assert code == 1 and "golden file error" in err and "Traceback" not in err
    good = tmp_path / "good.h5"
    golden.write(good, TREE_BUILD, tree_build_cases)
    report, junit = tmp_path / "verify.json", tmp_path / "verify.xml"
    code, out, err = run_kdt_cli(monkeypatch, capsys, "verify", "tree-build", "--golden", str(good), "--json",
                                 str(report), "--junit", str(junit))
    assert code == 2 and "cannot run here" in err
    import json

    document = json.loads(report.read_text())
    assert not document["passed"] and document["cases"][0]["case"] == "(environment)"
    assert "CuPy is not importable" in document["cases"][0]["error"]
    assert "<error" in junit.read_text() and "(environment)" in junit.read_text()


@pytest.mark.parametrize("args", [("fuzz", "topk", "--cases", "1"), ("sanitize", "topk")], ids=["fuzz", "sanitize"])
def test_no_gpu_fuzz_and_sanitize(no_cupy, monkeypatch, capsys, args):
    from kdt import sanitize

    monkeypatch.setattr(sanitize, "find_sanitizer", lambda: Path("/cuda/bin/compute-sanitizer"))
    code, out, err = run_kdt(monkeypatch, capsys, *args)
    assert code == 2 and "cannot run here" in err and "CuPy is not importable" in words(err)


def test_no_gpu_for_real(root):
    """On a machine where CuPy is missing, the real command, in its own process."""
    from tests.conftest import GPU_SKIP_REASON

    if GPU_SKIP_REASON is None:
        pytest.skip("this machine has a GPU")
    done = kdt_subprocess("verify", "topk", cwd=root)
    assert done.returncode == 2 and "cannot run here" in done.stderr and "Traceback" not in done.stderr


# --- a GPU of an arch the cubins were not built for --------------------------------------------------------

def test_a_cubin_the_driver_refuses(monkeypatch):
    monkeypatch.setattr(runtime, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(build, "build", lambda kernel, arch, **kw: build.BuildResult(build.kernel_name(kernel), arch,
                                                                                     Path("t.cubin"), True))

    def refuse(*args):
        raise RuntimeError("CUDA_ERROR_NO_BINARY_FOR_GPU: no kernel image is available for execution on the device")

    monkeypatch.setattr(runtime, "_module_for", refuse)
    with pytest.raises(runtime.GpuMissing, match="does not load on this GPU/driver.*NO_BINARY_FOR_GPU"):
        runtime._load.__wrapped__("topk", "sm_90")


@pytest.fixture
def ampere(monkeypatch):
    """An sm_80 GPU: an arch kdt does not build for."""
    monkeypatch.setattr(runtime, "cupy", lambda: types.SimpleNamespace())
    monkeypatch.setattr(runtime, "gpu_arch", lambda: "sm_80")


@pytest.mark.parametrize("args", [("fuzz", "topk", "--cases", "1"), ("sanitize", "topk")], ids=["fuzz", "sanitize"])
def test_fuzz_and_sanitize_on_an_unsupported_arch(ampere, monkeypatch, capsys, args):
    from kdt import sanitize

    monkeypatch.setattr(sanitize, "find_sanitizer", lambda: Path("/cuda/bin/compute-sanitizer"))
    code, out, err = run_kdt(monkeypatch, capsys, *args)
    assert code == 2 and "this GPU is sm_80" in err and "Traceback" not in err


def test_loading_kernels_on_an_unsupported_arch(ampere, monkeypatch):
    monkeypatch.setattr(toolkit, "find_nvcc", lambda: toolkit.Nvcc(Path("/bin/true"), "PATH", "13.0.88"))
    with pytest.raises(runtime.GpuMissing, match="sm_80"):
        runtime.load("topk")


def test_verify_on_an_unsupported_arch(ampere, monkeypatch, capsys):
    code, out, err = run_kdt_cli(monkeypatch, capsys, "verify", "topk")
    assert code == 2 and "sm_80" in err and "Traceback" not in err


# --- on the GPU: kdt.ops checks the layout before any launch -----------------------------------------------

@pytest.mark.gpu
def test_ops_rejects_shapes_beyond_the_limits_before_launching():
    from kdt import ops

    cp = runtime.cupy()
    lp = cp.zeros((1, 65, 8), cp.float32)
    with pytest.raises(BadInput) as error:
        ops.tree_build(lp, cp.zeros((1, 65, 8), cp.int32), 63)
    assert error.value.argument == "top_logp"
    with pytest.raises(BadInput) as error:
        ops.topk(cp.zeros((1, 2, 100), cp.float32), 101)
    assert error.value.argument == "k"
    with pytest.raises(BadInput) as error:
        ops.topk(np.zeros((1, 2, 100), np.float32), 8)  # host memory
    assert error.value.argument == "logits"
