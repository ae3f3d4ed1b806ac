"""kdt bench without a GPU: the sources an A/B comparison builds and the builds it refuses, the regression gate's
matching, the roofline bound of every shape, and the named shape sets (--set)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from kdt import bench, ops, paths, peaks, runtime, stages
from kdt.refs.errors import BadInput


def test_the_sources_of_a_revision_or_a_directory(tmp_path):
    repository = paths.PACKAGE.parent
    exported = bench.sources_of("HEAD", repository, tmp_path / "head")
    assert exported == tmp_path / "head" / "kernels"
    assert (exported / "topk.cu").is_file() and (exported / "common" / "ptx.cuh").is_file()
    assert bench.sources_of(str(repository), repository, tmp_path / "x") == repository / "kernels"
    assert bench.sources_of(str(repository / "kernels"), repository, tmp_path / "y") == repository / "kernels"
    with pytest.raises(BadInput, match="--against"):
        bench.sources_of("no-such-revision-0123", repository, tmp_path / "z")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match="--against"):
        bench.sources_of(str(tmp_path / "empty"), repository, tmp_path / "w")


def test_a_comparison_gives_both_builds_the_scratch_the_larger_plan_needs(monkeypatch):
    # the other build's cubins may export constants that make its plan split differently (more partials than ours)
    scratch = lambda nbytes: SimpleNamespace(nbytes=nbytes) if nbytes else None
    monkeypatch.setattr(runtime, "sources", lambda where: contextlib.nullcontext())
    for ours, theirs, chosen in ((100, 200, 200), (200, 100, 200), (100, 100, 100), (0, 64, 64), (64, 0, 64),
                                 (0, 0, 0)):
        monkeypatch.setattr(ops, "workspace_for", lambda spec, inputs, params, knobs=None, n=theirs: scratch(n))
        buffers = bench._Buffers([{}], {}, {}, scratch(ours))
        both = bench._workspace_for_both("verify-attn", buffers, {}, "elsewhere")
        assert (both.nbytes if both is not None else 0) == chosen, (ours, theirs)


def _result(shape, us, arch="sm_90a", knobs=None):
    timing = bench.Timing(us, us, us, 100)
    return bench.ShapeResult("topk", shape, {}, 1, 0, 1, "", timing, None, us, 0, 0, 0, 0, 0, 0, knobs=knobs or {},
                             arch=arch)


def test_regressions_match_shape_arch_and_knobs():
    baseline = {"results": [{"kernel": "topk", "shape": "a", "headline_us": 10.0, "arch": "sm_90a", "knobs": {}},
                            {"kernel": "topk", "shape": "a", "headline_us": 20.0, "arch": "sm_120-emu", "knobs": {}},
                            {"kernel": "topk", "shape": "b", "headline_us": 10.0}]}   # an older file: no arch
    now = [_result("a", 10.5), _result("a", 30.0, "sm_120-emu"), _result("b", 12.0),
           _result("a", 99.0, knobs={"min_chunk": 1})]
    slower = bench.regressions(now, baseline, 10.0)
    assert [(s[1], s[2], s[3]) for s in slower] == [("a", 20.0, 30.0), ("b", 10.0, 12.0)]


# --- the roofline bound -----------------------------------------------------------------------------------------

VERIFY_ATTN = stages.get("verify-attn")


def _tp8(name):
    return next(item for item in VERIFY_ATTN.bench_set("tp8") if item.name == name)


H200 = peaks.Peaks("NVIDIA H200", 4236.0, 771.0, "torch bf16 8192^3")   # issue 17's peaks


@pytest.mark.parametrize("shape, bound_us, now_us", [
    # issue 17's table: shape (H = 8), its bound and the time measured then
    ("G1_H8_N8_prefix1024", 0.33, 20.7), ("G1_H8_N16_prefix8192", 2.97, 23.7), ("G1_H8_N16_prefix32768", 11.8, 40.0),
    ("G1_H8_N64_prefix32768", 47.4, 87.1), ("G4_H8_N16_prefix8192", 11.9, 36.7), ("G4_H8_N8_prefix32768", 35.9, 59.4),
    ("G16_H8_N8_prefix8192", 36.5, 60.1), ("G1_H8_N256_prefix32768", 190.9, 289.8),
])
def test_the_bound_of_issue_17s_shapes(shape, bound_us, now_us):
    item = _tp8(shape)
    bound, percent = peaks.roofline_bound(item.bytes_moved, item.flops, now_us, H200)
    assert bound == pytest.approx(bound_us, rel=5e-3)   # the issue's figures, rounded
    assert percent == pytest.approx(100 * bound / now_us)


def test_the_bound_is_the_slower_of_bytes_and_flops():
    machine = peaks.Peaks("x", 1000.0, 100.0, "x")                       # 1 GB/ms, 0.1 PFLOP/s
    assert peaks.roofline_bound(2_000_000, 0, 4.0, machine) == (2.0, 50.0)  # no flop model: bytes alone
    assert peaks.roofline_bound(1_000, 10**9, 20.0, machine) == (10.0, 50.0)   # compute: 10 us against 1 ns of bytes
    assert peaks.roofline_bound(10**6, 10**8, 1.0, machine) == (1.0, 100.0)     # 1 us each: at the roofline
    assert peaks.roofline_bound(10**6, 0, 0.0, machine) == (1.0, 0.0)           # nothing measured: no percentage


def test_bench_and_profile_agree_on_the_bound():
    from kdt import profile

    for name in ("G1_H8_N8_prefix1024", "G1_H8_N256_prefix32768"):   # bound by bytes, by flops
        item = _tp8(name)
        roof = profile.roofline(item.bytes_moved, item.flops, H200.copy_gbps, H200.matmul_tflops, [])
        assert peaks.roofline_bound(item.bytes_moved, item.flops, 1.0, H200)[0] == pytest.approx(roof.bound_us)


# --- shape sets --------------------------------------------------------------------------------------------------

def test_verify_attn_declares_the_tp8_set_and_keeps_its_default():
    assert VERIFY_ATTN.bench_set_names() == ["default", "tp8"]
    tp8 = [item.name for item in VERIFY_ATTN.bench_set("tp8")]
    assert tp8 == [f"G{g}_H8_N{n}_prefix{p}" for g in (1, 4, 16) for n in (8, 16, 64, 256)
                   for p in (1024, 8192, 32768, 131072)]
    assert [item.name for item in VERIFY_ATTN.bench_set("tp8", quick=True)] == [
        "G1_H8_N8_prefix1024", "G1_H8_N16_prefix8192", "G1_H8_N16_prefix32768", "G1_H8_N64_prefix32768",
        "G4_H8_N16_prefix8192", "G4_H8_N8_prefix32768", "G16_H8_N8_prefix8192", "G1_H8_N256_prefix32768"]
    default = ["G1_H64_N256_prefix32768", "G8_H8_N8_prefix131072", "G1_H8_N8_prefix1024", "G1_H8_N16_prefix8192",
               "G1_H16_N64_prefix8192", "G1_H64_N64_prefix32768", "G1_H16_N256_prefix131072", "G8_H16_N64_prefix8192",
               "G8_H64_N8_prefix32768", "G8_H64_N256_prefix8192", "G8_H8_N64_prefix131072", "G32_H8_N8_prefix1024",
               "G32_H16_N8_prefix8192", "G32_H64_N64_prefix1024", "G32_H8_N256_prefix32768"]
    assert [item.name for item in VERIFY_ATTN.bench_set("default")] == default
    assert [item.name for item in VERIFY_ATTN.bench_shapes(False)] == default
    assert [item.name for item in VERIFY_ATTN.bench_set("default", quick=True)] == default[:2]
    # every shape once: the two both sets hold (G1_H8_N8_prefix1024, G1_H8_N16_prefix8192) are the same shape
    every = VERIFY_ATTN.every_bench_shape()
    assert [item.name for item in every] == list(dict.fromkeys(default + tp8)) and len(every) == 15 + 48 - 2
    same = lambda item: (item.layout, item.params, item.bytes_moved, item.flops)
    assert same(_tp8("G1_H8_N8_prefix1024")) == same(VERIFY_ATTN.bench_set("default")[2])


def test_a_set_a_stage_lacks_names_the_ones_it_has():
    with pytest.raises(BadInput, match=r"--set: expected a bench shape set of verify-attn: default, tp8, got 'tp9'"):
        VERIFY_ATTN.bench_set("tp9")
    accept = stages.get("tree-accept")
    assert accept.bench_set_names() == ["default"]
    with pytest.raises(BadInput, match=r"of tree-accept: default, got 'tp8'"):
        accept.bench_set("tp8")


def test_the_sets_shape_glob():
    from kdt.commands.common import shapes_to_run

    chosen = shapes_to_run([VERIFY_ATTN], "tp8", False, "G16_*_prefix131072")
    assert [item.name for item in chosen["verify-attn"]] == [f"G16_H8_N{n}_prefix131072" for n in (8, 16, 64, 256)]
    assert shapes_to_run([VERIFY_ATTN], "default", False, "G16_*") == {"verify-attn": []}


INPUT_BUDGET_BYTES = 8 * 10**9   # device generation and the SDPA baseline take a few times the inputs: H200 141 GB


def test_every_bench_shape_fits_an_h200():
    """Inputs and outputs of every shape of every set well under an H200's memory (the largest, tree-accept's
    logits_G64_N64_vocab163840_f32 and verify-attn tp8's G16_H8_N256_prefix131072, 2.7 and 2.5 GB)."""
    import math

    import numpy as np

    nbytes = lambda dims, dtype: math.prod(dims) * (2 if dtype == "bfloat16" else np.dtype(dtype).itemsize)
    held = {}
    for spec in stages.all_stages():
        for item in spec.every_bench_shape():
            outputs = spec.output_layout({name: dims for name, (dims, _) in item.layout.items()}, item.params)
            held[spec.name, item.name] = (sum(nbytes(dims, dtype) for dims, dtype in item.layout.values())
                                          + sum(nbytes(out.shape, out.dtype) for out in outputs.values()))
            assert held[spec.name, item.name] < INPUT_BUDGET_BYTES, (spec.name, item.name)
    attention = {name: size for (stage, name), size in held.items() if stage == "verify-attn"}
    assert max(attention, key=attention.get) == "G16_H8_N256_prefix131072"


def test_the_wide_sets_hold_issue_20s_grid():
    """topk and tree-build's `--set wide`: V in {64, 256, 1024} at G in {1, 8, 64}; tree-build with B = V (at most
    1023) and B = 1023; --quick the issue's own shapes."""
    from kdt import stages

    topk = {(s.layout["logits"][0][0], s.params["k"]) for s in stages.get("topk").bench_set("wide")}
    assert topk == {(g, v) for g in (1, 8, 64) for v in (64, 256, 1024)}
    build = stages.get("tree-build").bench_set("wide")
    grid = {(s.layout["top_logp"][0][0], s.layout["top_logp"][0][2], s.params["budget"]) for s in build}
    assert grid == {(g, v, b) for g in (1, 8, 64) for v in (64, 256, 1024) for b in {min(v, 1023), 1023}}
    assert [s.name for s in stages.get("tree-build").bench_set("wide", quick=True)] == ["G64_K3_V255_B255",
                                                                                          "G64_K7_V1024_B1023"]


def _tree_accept_source(walk_params: str) -> str:
    """A tree_accept.cu with the real constants and entry points that do nothing, the walk taking `walk_params`."""
    return f"""extern "C" {{
__constant__ int kdt_tree_accept_max_nodes = 1024;
__constant__ int kdt_tree_accept_walk_warps = 1;
__constant__ int kdt_tree_accept_argmax_threads = 256;
__constant__ int kdt_tree_accept_argmax_min_blocks = 4;
__constant__ int kdt_tree_accept_split_min_vectors = 64;
}}
extern "C" __global__ void tree_accept_from_predict({walk_params}) {{ accept_len[0] = 0; }}
extern "C" __global__ void tree_accept_from_logits(const void*, int, int, int, const int*, const int*, const int*,
                                                   int, int, int, void*, int* accept_len, int*, int*) {{
    accept_len[0] = 0; }}
"""


TREE_WALK = "const int*, const int*, const int*, const int*, int, int, int max_depth, int* accept_len, int*, int*"


@pytest.fixture
def other_builds(tmp_path, monkeypatch):
    """This tree's tree-accept (a stand-in that fits its launcher), the same again, one whose walk lost its max_depth
    and one without a constant the launcher reads."""
    monkeypatch.setenv("KDT_CACHE_DIR", str(tmp_path / "cache"))
    trees = {}
    for name, walk in (("ours", TREE_WALK), ("same", TREE_WALK), ("older", TREE_WALK.replace(" int max_depth,", ""))):
        trees[name] = tmp_path / name / "kernels"
        trees[name].mkdir(parents=True)
        (trees[name] / "tree_accept.cu").write_text(_tree_accept_source(walk))
    trees["unconstant"] = tmp_path / "unconstant"
    trees["unconstant"].mkdir()
    (trees["unconstant"] / "tree_accept.cu").write_text(_tree_accept_source(TREE_WALK).replace("walk_warps", "warps"))
    return trees


@pytest.mark.nvcc
def test_against_a_build_these_launchers_cannot_drive_is_refused(other_builds, monkeypatch, root):
    """An entry point with a parameter fewer would crash the process at its first launch: refused on the CPU first
    (exit 3, naming the function and both layouts), before any GPU is needed; so is a build without a constant the
    launcher reads; a build that fits is not."""
    from kdt import build
    from kdt.commands import bench as bench_command

    monkeypatch.setattr(build, "KERNELS_DIR", other_builds["ours"])
    spec = stages.get("tree-accept")
    check = lambda theirs: bench_command._refuse_undrivable(spec, theirs, "REV", spec.bench_set("default"), {}, [{}],
                                                            ["sm_90"], None)
    check(other_builds["same"])
    with pytest.raises(BadInput, match="tree_accept_from_predict: parameters .bytes each.: 8,8,8,8,4,4,8,8,8 in the "
                                       "cubin, 8,8,8,8,4,4,4,8,8,8 launched"):
        check(other_builds["older"])
    with pytest.raises(BadInput, match="exports no constant 'kdt_tree_accept_walk_warps'"):
        check(other_builds["unconstant"])

    env = {**os.environ, "KDT_KERNELS_DIR": str(other_builds["ours"]), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "kdt", "bench", "tree-accept", "--arch", "sm_90", "--against",
                           str(other_builds["older"])], capture_output=True, text=True, cwd=root, env=env, timeout=600)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "tree_accept_from_predict" in done.stderr and "add --whole-trees" in done.stderr
    assert "Traceback" not in done.stderr


def test_whole_trees_runs_a_revision_or_a_checkout(tmp_path):
    from kdt import tree_compare

    repository = paths.PACKAGE.parent
    head = tree_compare.tree_of("HEAD", repository, tmp_path / "head")
    assert (head / "kdt" / "__main__.py").is_file() and (head / "kernels" / "topk.cu").is_file()
    assert tree_compare.tree_of(str(repository), repository, tmp_path / "x") == repository.resolve()
    (tmp_path / "sources").mkdir()
    (tmp_path / "sources" / "topk.cu").write_text("")
    for bad in ("no-such-revision-0123", str(tmp_path / "sources")):   # a directory of sources has no kdt to run
        with pytest.raises(BadInput, match="--against"):
            tree_compare.tree_of(bad, repository, tmp_path / "z")


def test_whole_trees_pass_both_trees_the_same_bench_arguments():
    from kdt import tree_compare

    assert tree_compare.bench_arguments(["topk"], None, False, None, [], None, [], None, False) == \
        ["-m", "kdt", "bench", "topk", "--no-baselines", "--format", "json"]
    line = tree_compare.bench_arguments(["topk", "tree-build"], "wide", True, "G8*", ["gate=true", "gate_min_chunk=64"],
                                        "resident=true,false", ["sm_90a", "sm_120-emu"], 70, True)
    assert line[:5] == ["-m", "kdt", "bench", "topk", "tree-build"]
    pairs = list(zip(line[8::2], line[9::2]))
    assert ("--set", "wide") in pairs and ("--shape", "G8*") in pairs and ("--sweep", "resident=true,false") in pairs
    assert line.count("--knob") == 2 and line.count("--arch") == 2 and "70" in line
    assert line[-2:] == ["--quick", "--no-graph"]


def _document(rows):
    return {"results": [{"kernel": "topk", "shape": shape, "arch": "sm_90a", "knobs": {}, "graph": {"median_us": us},
                         "headline_us": us, "path": path} for shape, us, path in rows]}


class _FakeTrees:
    """subprocess.run for two trees: each call returns the next document of the tree its cwd names."""

    def __init__(self, other, ours, theirs):
        self.other, self.documents, self.calls = other, {None: list(ours), str(other): list(theirs)}, []

    def __call__(self, argv, cwd=None, env=None, **_):
        self.calls.append((cwd, env.get("PYTHONPATH", "").split(os.pathsep)[0] if cwd else None))
        return subprocess.CompletedProcess(argv, 0, json.dumps(self.documents[cwd].pop(0)), "")


def test_whole_trees_alternate_rounds_and_compare_per_shape(tmp_path):
    from kdt import tree_compare

    other = tmp_path / "other"
    ours = [_document([("a", 10.0, "gate"), ("b", 20.0, "gate"), ("new", 1.0, "gate")]) for _ in range(3)]
    theirs = [_document([("a", us, "gate"), ("b", 10.0, "radix"), ("old", 1.0, "gate")]) for us in (20.0, 12.5, 8.0)]
    fake = _FakeTrees(other, ours, theirs)
    got_ours, got_theirs = tree_compare.rounds(other, ["-m", "kdt", "bench", "topk"], runner=fake)
    # ours first in even rounds; the other tree runs in its own directory with itself first on PYTHONPATH
    assert fake.calls == [(None, None), (str(other), str(other)), (str(other), str(other)), (None, None),
                          (None, None), (str(other), str(other))]
    rows, lonely = tree_compare.compare(got_ours, got_theirs)
    assert [(row.shape, row.path) for row in rows] == [("a", "gate"), ("b", "gate / radix")]
    assert rows[0].ratios == [0.5, 0.8, 1.25] and rows[0].ratio == 0.8   # the median round, not the mean
    assert rows[1].ratio == 2.0 and rows[1].mode == "graph"
    assert lonely == ["topk new", "topk old"]


def test_whole_trees_stop_on_a_tree_that_cannot_run_or_refuses():
    from kdt import tree_compare
    from kdt.console import KdtExit

    def said(code, stdout=""):
        return lambda argv, **_: subprocess.CompletedProcess(argv, code, stdout, "first\nerror: --knob: no knob x")

    with pytest.raises(BadInput, match="--against.*refused them: .*no knob x"):
        tree_compare.run_tree(None, [], runner=said(3))
    with pytest.raises(KdtExit) as stopped:
        tree_compare.run_tree(None, [], runner=said(2))
    assert stopped.value.code == 2 and "exit 2" in str(stopped.value)
    with pytest.raises(KdtExit) as crashed:   # a traceback's exit 1 is not "a check failed"
        tree_compare.run_tree(None, [], runner=said(1))
    assert crashed.value.code == 2 and "exit 1" in str(crashed.value)
    with pytest.raises(KdtExit, match="no JSON"):
        tree_compare.run_tree(None, [], runner=said(0, "not json"))

    def slow(argv, **_):
        raise subprocess.TimeoutExpired(argv, tree_compare.CHILD_TIMEOUT_S)

    with pytest.raises(KdtExit, match="did not finish"):
        tree_compare.run_tree(None, [], runner=slow)


def test_whole_trees_report_each_shape_and_fail_on_a_regression(monkeypatch, tmp_path):
    """The command's table and JSON document from two trees' rounds (stand-ins for the processes): ours / theirs per
    shape, the range of the rounds, a shape only one tree timed named, exit 1 where a ratio passes --max-regression."""
    from typer.testing import CliRunner

    from kdt import tree_compare
    from kdt.cli import app

    ours = [_document([("a", 10.0, "gate"), ("b", 30.0, "gate")]) for _ in range(3)]
    theirs = [_document([("a", 20.0, "gate"), ("b", 20.0, "gate"), ("gone", 1.0, "gate")]) for _ in range(3)]
    monkeypatch.setattr(tree_compare, "rounds", lambda other, arguments, **_: (ours, theirs))
    written = tmp_path / "against.json"
    done = CliRunner().invoke(app, ["bench", "topk", "--against", "HEAD", "--whole-trees", "--json", str(written),
                                    "--max-regression", "20"])
    assert done.exit_code == 1, done.output
    document = json.loads(written.read_text())
    assert document["whole_trees"] and document["only_one_tree"] == ["topk gone"]
    assert [(c["shape"], c["ratio"]) for c in document["comparisons"]] == [("a", 0.5), ("b", 1.5)]
    assert "0.500" in done.output and "1.500" in done.output and "slower" in done.output
    assert "kdt bench topk --against HEAD --whole-trees" in done.output    # no --set given: none named
    within = CliRunner().invoke(app, ["bench", "topk", "--against", "HEAD", "--whole-trees", "--max-regression", "60"])
    assert within.exit_code == 0, within.output


def test_whole_trees_on_the_command_line(root):
    """Without --against it is bad input; on a machine without a GPU this tree's run stops the comparison (exit 2,
    its reason, no traceback)."""
    env = {**os.environ, "COLUMNS": "200"}
    alone = subprocess.run([sys.executable, "-m", "kdt", "bench", "topk", "--whole-trees"], capture_output=True,
                           text=True, cwd=root, env=env, timeout=120)
    assert alone.returncode == 3 and "--whole-trees" in alone.stderr and "Traceback" not in alone.stderr
    from tests.conftest import GPU_SKIP_REASON

    if GPU_SKIP_REASON is None:   # a GPU: the comparison would run; the no-GPU stop is what this part checks
        return
    done = subprocess.run([sys.executable, "-m", "kdt", "bench", "topk", "--quick", "--against", "HEAD",
                           "--whole-trees"], capture_output=True, text=True, cwd=root, env=env, timeout=300)
    assert done.returncode == 2 and "kdt bench in this tree stopped (exit 2)" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_graph_replay_slower_than_eager_launches_is_called_out():
    steady, eager = bench.Timing(147.4, 147.1, 148.1, 100), bench.Timing(150.0, 149.5, 151.0, 100)
    assert bench.graph_note(eager, steady) is None and bench.graph_note(eager, None) is None
    assert bench.graph_note(eager, bench.Timing(1.2 * 150.0, 0, 0, 100)) is None
    # the machine of plans/perf-notes.md's eighteenth session: topk G64 K15 f32, 281.2 us replayed, 153.2 eager
    note = bench.graph_note(bench.Timing(153.17, 152.0, 155.0, 100), bench.Timing(281.20, 277.8, 408.1, 100))
    assert note and "1.84x the eager median" in note and "281.20 against 153.17 us" in note
