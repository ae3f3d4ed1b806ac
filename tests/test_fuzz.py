"""kdt fuzz without a GPU: a fake "kernel" (the reference with a planted bug) is found, shrunk to a small
case that still fails the same way, and saved as a regression case that golden.read accepts."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from tests.cli_run import run_kdt_cli

from kdt import fuzz, golden, stages
from kdt.spec import Case
from kdt.verify import CaseResult
from tests.faults import fill_the_disk


def fake_kernel(plant=None, raises=None, seen=None):
    """A `run_case` that computes the reference and lets `plant(case, outputs)` corrupt the outputs, or
    `raises(case)` return an exception to raise (a CUDA error); `seen` collects the cases it ran."""

    def run(spec, item):
        case = item.case
        if seen is not None:
            seen.append(case)
        if raises is not None and (error := raises(case)) is not None:
            raise error
        got = {name: np.array(value, copy=True) for name, value in spec.reference(case.inputs, case.params).items()}
        if plant is not None:
            plant(case, got)
        fields = [policy.compare(name, item.expected[name], got[name], 3) for name, policy in spec.outputs.items()]
        return CaseResult(spec.name, case.name, case.description, all(f.ok for f in fields), 1.0, fields)

    return run


def healthy():
    return True


def topk_bug(case, got):
    """Wrong second id in the last request's first row whenever vocab >= 1000 and V >= 2."""
    if case.inputs["logits"].shape[2] >= 1000 and case.params["k"] >= 2:
        got["top_ids"][-1, 0, 1] += 1


def test_topk_bug_is_found_shrunk_and_saved(tmp_path):
    spec = stages.get("topk")
    path = fuzz.regressions_path("topk", tmp_path)
    assert path == tmp_path / "regressions" / "topk.h5"
    report = fuzz.run_fuzz(spec, seconds=None, seed=7, max_cases=40, run_case=fake_kernel(topk_bug),
                           healthy=healthy, regressions=path, max_failures=1)
    assert report.stopped_by == "failures" and not report.ok
    (failure,) = report.failures
    groups, depth, vocab = failure.shrunk.inputs["logits"].shape
    assert (groups, depth) == (1, 1) and failure.shrunk.params["k"] == 2
    assert 1000 <= vocab <= failure.original.inputs["logits"].shape[2]
    assert failure.shrink_steps > 0 and "top_ids" in failure.detail
    # the regression file is a golden file like any other, and the case still fails on the buggy kernel
    saved = golden.read(path, spec)
    (item,) = saved.cases
    assert item.case.name == failure.saved_as == f"fuzz_7_{failure.index}"
    assert item.case.seed == 7 and "shrunk" in item.case.description and f"case {failure.index}" in item.case.description
    assert saved.ref_digest == spec.reference_digest()
    assert not fake_kernel(topk_bug)(spec, item).passed
    assert fake_kernel()(spec, item).passed
    assert sorted(os.listdir(path.parent)) == ["topk.h5"]  # no temporary left behind


def test_tree_build_shrinks_every_dimension_to_the_smallest_failing_one(tmp_path):
    spec = stages.get("tree-build")

    def bug(case, got):
        if case.params["budget"] >= 8 and case.inputs["top_logp"].shape[2] >= 3:
            got["n_nodes"][0] += 1

    report = fuzz.run_fuzz(spec, seconds=None, seed=3, max_cases=30, run_case=fake_kernel(bug), healthy=healthy,
                           max_failures=1)
    (failure,) = report.failures
    assert failure.shrunk.inputs["top_logp"].shape == (1, 1, 3)
    assert failure.shrunk.params["budget"] == 8
    assert failure.saved_to is None  # no regressions path: nothing written


def test_tree_accept_shrinks_batch_and_depth():
    spec = stages.get("tree-accept")

    def bug(case, got):
        if case.params["max_depth"] >= 3:
            got["accept_tokens"][0, 0] ^= 1

    report = fuzz.run_fuzz(spec, seconds=None, seed=11, max_cases=30, run_case=fake_kernel(bug), healthy=healthy,
                           max_failures=1, shrink_runs=60)
    (failure,) = report.failures
    assert failure.shrunk.inputs["token"].shape[0] == 1 and failure.shrunk.params["max_depth"] == 3


def test_shrinking_keeps_the_same_failure():
    """A variant that fails differently (an exception where the original mismatched) is not taken."""
    spec = stages.get("topk")

    def raises(case):
        return RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS") if case.inputs["logits"].shape[2] < 500 else None

    report = fuzz.run_fuzz(spec, seconds=None, seed=7, max_cases=40, max_failures=1, healthy=healthy,
                           run_case=fake_kernel(topk_bug, raises=raises))
    (failure,) = report.failures
    assert failure.shrunk.inputs["logits"].shape[2] >= 1000 and "top_ids" in failure.detail


def test_a_kernel_exception_is_a_failure_and_is_shrunk(tmp_path):
    spec = stages.get("topk")

    def raises(case):
        return RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access") if case.params["k"] >= 16 else None

    report = fuzz.run_fuzz(spec, seconds=None, seed=5, max_cases=40, max_failures=1, healthy=healthy,
                           run_case=fake_kernel(raises=raises), regressions=tmp_path / "r.h5")
    (failure,) = report.failures
    assert failure.detail.startswith("RuntimeError: CUDA_ERROR_ILLEGAL_ADDRESS")
    assert failure.shrunk.params["k"] == 16 and failure.shrunk.inputs["logits"].shape[:2] == (1, 1)
    assert report.context_lost is None
    assert [item.case.name for item in golden.read(tmp_path / "r.h5", spec).cases] == [failure.saved_as]


def test_a_lost_cuda_context_stops_the_run_and_keeps_the_case(tmp_path):
    spec = stages.get("tree-build")
    seen = []
    report = fuzz.run_fuzz(spec, seconds=None, seed=2, max_cases=10, healthy=lambda: False,
                           run_case=fake_kernel(raises=lambda case: RuntimeError("cudaErrorIllegalAddress"), seen=seen),
                           regressions=tmp_path / "tree-build.h5")
    assert report.stopped_by == "context lost" and "unusable" in report.context_lost
    assert report.cases_run == 1 and len(seen) == 1  # nothing ran after the lost context, not even a shrink
    (failure,) = report.failures
    assert failure.shrunk is failure.original
    assert golden.read(tmp_path / "tree-build.h5", spec).cases[0].case.name == "fuzz_2_0"


def test_context_lost_while_shrinking_keeps_the_smallest_case_so_far():
    spec = stages.get("topk")
    calls = []

    def raises(case):
        calls.append(case)
        return RuntimeError("sticky") if len(calls) > 3 else None

    def probe():
        return len(calls) <= 3

    report = fuzz.run_fuzz(spec, seconds=None, seed=7, max_cases=40, run_case=fake_kernel(topk_bug, raises=raises),
                           healthy=probe)
    assert report.stopped_by == "context lost" and "while shrinking" in report.context_lost
    (failure,) = report.failures
    assert fuzz.case_size(failure.shrunk) < fuzz.case_size(failure.original)  # 2 variants were taken


def test_generator_bugs_are_counted_apart():
    spec = stages.get("topk")

    def bad_generator(rng):
        case = spec.random_case(rng)
        if rng.random() < 0.5:
            logits = case.inputs["logits"].astype(np.float32)
            logits[0, 0, 0] = np.nan  # out of contract: the reference rejects it
            return dataclasses.replace(case, inputs={"logits": logits})
        return case

    def broken_generator(rng):
        raise IndexError("off by one")

    report = fuzz.run_fuzz(dataclasses.replace(spec, random_case=bad_generator), seconds=None, seed=1, max_cases=12,
                           run_case=fake_kernel(), healthy=healthy)
    assert report.cases_run == 12 and not report.failures and report.generator_bugs and not report.ok
    assert all(bug.where == "reference" and "NaN" in bug.message for bug in report.generator_bugs)
    report = fuzz.run_fuzz(dataclasses.replace(spec, random_case=broken_generator), seconds=None, seed=1, max_cases=3,
                           run_case=fake_kernel(), healthy=healthy)
    assert [bug.where for bug in report.generator_bugs] == ["random_case"] * 3
    assert "IndexError: off by one" in report.generator_bugs[0].message


def test_cases_are_reproducible_from_seed_and_index():
    spec = stages.get("tree-accept")
    seen = []
    fuzz.run_fuzz(spec, seconds=None, seed=42, max_cases=4, run_case=fake_kernel(seen=seen), healthy=healthy)
    again = []
    report = fuzz.run_fuzz(spec, seconds=None, seed=42, start=2, max_cases=1, run_case=fake_kernel(seen=again),
                           healthy=healthy)
    assert report.ok and report.cases_run == 1
    assert fuzz._fingerprint(again[0]) == fuzz._fingerprint(seen[2]) == fuzz._fingerprint(fuzz.draw_case(spec, 42, 2))
    assert fuzz._fingerprint(seen[0]) != fuzz._fingerprint(seen[1])


def test_time_limit_and_progress():
    spec = stages.get("tree-accept")
    ticks = iter(range(1000))
    states = []
    report = fuzz.run_fuzz(spec, seconds=3, seed=0, run_case=fake_kernel(), healthy=healthy,
                           on_progress=states.append, clock=lambda: float(next(ticks)))
    assert report.stopped_by == "time" and report.ok and report.cases_run >= 1
    assert states and states[-1].cases_run == report.cases_run and states[-1].kernel == "tree-accept"
    with pytest.raises(ValueError):
        fuzz.run_fuzz(spec, seconds=None, max_cases=None)


# --- saving regressions ---------------------------------------------------------------------------------

def _small_case(name="fuzz_1_0"):
    spec = stages.get("tree-build")
    case = spec.random_case(np.random.default_rng(0))
    shrunk = next(iter(spec.shrink(case)))
    return spec, dataclasses.replace(shrunk, name=name)


def test_save_regression_appends_and_replaces_by_name(tmp_path):
    spec, first = _small_case("fuzz_1_0")
    _, second = _small_case("fuzz_1_5")
    path = tmp_path / "regressions" / "tree-build.h5"
    fuzz.save_regression(path, spec, first)
    fuzz.save_regression(path, spec, second)
    fuzz.save_regression(path, spec, dataclasses.replace(first, description="again"))
    cases = golden.read(path, spec).cases
    assert [item.case.name for item in cases] == ["fuzz_1_5", "fuzz_1_0"]
    assert cases[1].case.description == "again"


def test_an_unreadable_regressions_file_is_left_alone(tmp_path):
    spec = stages.get("topk")
    path = fuzz.regressions_path("topk", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not an HDF5 file")
    report = fuzz.run_fuzz(spec, seconds=None, seed=7, max_cases=40, run_case=fake_kernel(topk_bug), healthy=healthy,
                           regressions=path, max_failures=1, shrink_runs=5)
    (failure,) = report.failures
    assert failure.saved_to is None and "not saved" in failure.save_error and "not a readable HDF5" in failure.save_error
    assert path.read_bytes() == b"not an HDF5 file"


def test_a_full_disk_while_saving_keeps_the_old_file(tmp_path, monkeypatch):
    spec, first = _small_case("fuzz_1_0")
    _, second = _small_case("fuzz_1_1")
    path = tmp_path / "tree-build.h5"
    fuzz.save_regression(path, spec, first)
    before = path.read_bytes()

    fill_the_disk(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        fuzz.save_regression(path, spec, second)
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["tree-build.h5"]


def test_a_second_failure_that_shrinks_to_the_same_shape_is_not_saved_again(tmp_path):
    spec = stages.get("topk")
    path = tmp_path / "topk.h5"
    report = fuzz.run_fuzz(spec, seconds=None, seed=7, max_cases=40, run_case=fake_kernel(topk_bug), healthy=healthy,
                           regressions=path, max_failures=2)
    first, second = report.failures
    assert second.duplicate_of == first.index and second.saved_to is None
    assert [item.case.name for item in golden.read(path, spec).cases] == [first.saved_as]


# --- the stages' shrinkers and verify-attn's generator -----------------------------------------------------

@pytest.mark.parametrize("kernel", ["topk", "tree-build", "tree-accept"])
def test_every_shrink_variant_is_valid_and_smaller(kernel):
    spec = stages.get(kernel)
    for seed in range(3):
        case = spec.random_case(np.random.default_rng([100, seed]))
        variants = list(spec.shrink(case))
        assert variants or max(a.shape[0] for a in case.inputs.values()) == 1
        for variant in variants:
            smaller = fuzz.case_size(variant) < fuzz.case_size(case) or any(
                variant.params[key] < case.params[key] for key in spec.params)
            assert smaller, fuzz.summarize(variant)
            shapes = {name: a.shape for name, a in variant.inputs.items()}
            dtypes = {name: "bfloat16" if a.dtype.name == "bfloat16" else a.dtype.name for name, a in variant.inputs.items()}
            spec.check_layout(shapes, dtypes, dict(variant.params))
            spec.reference(variant.inputs, variant.params)  # no BadInput


def _attention_case(prefix=(70, 0, 130), heads=2, budget=15):
    from kdt.stages import verify_attn

    rng = np.random.default_rng(9)
    return verify_attn._case("small", "small", 9, verify_attn.attention_inputs(rng, list(prefix), heads, 4, 4, budget))


def test_verify_attn_random_case_stays_within_the_brief():
    from kdt.refs.verify_attn import validate

    spec = stages.get("verify-attn")
    seen_b, seen_h = set(), set()
    for i in range(25):
        case = spec.random_case(np.random.default_rng([0, i]))
        x = case.inputs
        groups, slots, heads, key_dim = x["q"].shape
        assert 1 <= groups <= 3 and slots - 1 in (1, 7, 15, 40, 63) and heads in (1, 2, 8, 16)
        assert ((x["prefix_len"] >= 0) & (x["prefix_len"] <= 3000)).all()
        seen_b.add(slots - 1)
        seen_h.add(heads)
        validate(*(x[name] for name in ("q", "kv_cache", "block_table", "prefix_len", "kv_tree", "mask", "n_nodes")),
                 case.params["d_v"])
        spec.check_layout({n: a.shape for n, a in x.items()},
                          {n: "bfloat16" if a.dtype.name == "bfloat16" else a.dtype.name for n, a in x.items()},
                          dict(case.params))
    assert len(seen_b) >= 4 and len(seen_h) >= 3


def test_verify_attn_shrinks_keep_the_surviving_rows_exact():
    """Cutting the cache down to the pages in use changes nothing; keeping the first N' slots keeps those
    rows' outputs (a slot's ancestors precede it); one request keeps its rows; all variants are valid."""
    spec = stages.get("verify-attn")
    case = _attention_case()
    full = spec.reference(case.inputs, case.params)
    variants = list(spec.shrink(case))
    assert variants
    compact = [v for v in variants if v.inputs["kv_cache"].shape[0] < case.inputs["kv_cache"].shape[0]
               and v.inputs["q"].shape == case.inputs["q"].shape and (v.inputs["prefix_len"] == case.inputs["prefix_len"]).all()]
    assert compact, "no page-compaction variant"
    out = spec.reference(compact[-1].inputs, case.params)
    assert np.array_equal(out["out"], full["out"]) and np.array_equal(out["lse"], full["lse"])
    fewer_slots = [v for v in variants if v.inputs["q"].shape[1] < case.inputs["q"].shape[1]]
    assert fewer_slots
    for variant in fewer_slots:
        n = variant.inputs["q"].shape[1]
        out = spec.reference(variant.inputs, case.params)
        for g in range(case.inputs["q"].shape[0]):
            live = min(int(case.inputs["n_nodes"][g]) + 1, n)
            assert np.array_equal(out["out"][g, :live], full["out"][g, :live])
    singles = [v for v in variants if v.inputs["q"].shape[0] == 1]
    assert len(singles) == 3 and all(v.inputs["kv_cache"] is case.inputs["kv_cache"] for v in singles)
    out = spec.reference(singles[2].inputs, case.params)
    assert np.array_equal(out["out"][0], full["out"][2])
    prefixes = [v for v in variants if v.inputs["prefix_len"].shape == case.inputs["prefix_len"].shape
                and not np.array_equal(v.inputs["prefix_len"], case.inputs["prefix_len"])]
    assert any((v.inputs["prefix_len"] == 0).all() for v in prefixes)
    assert all((v.inputs["prefix_len"] <= case.inputs["prefix_len"]).all() for v in prefixes)


def test_verify_attn_fuzz_finds_a_head_bug():
    """End to end on verify-attn's own generator and shrinker (the reference is the slow part: few runs)."""
    spec = stages.get("verify-attn")

    def bug(case, got):
        if case.inputs["q"].shape[2] >= 2:
            got["lse"][0, 0, 1] += 1.0

    small = dataclasses.replace(spec, random_case=lambda rng: _attention_case(prefix=(65, 3), heads=8, budget=7))
    report = fuzz.run_fuzz(small, seconds=None, seed=0, max_cases=1, run_case=fake_kernel(bug), healthy=healthy)
    (failure,) = report.failures
    assert failure.shrunk.inputs["q"].shape[:3] == (1, 1, 2)
    assert (failure.shrunk.inputs["prefix_len"] == 0).all() and "lse" in failure.detail


def test_batch_variants_and_sizes():
    assert fuzz.smaller_sizes(1) == [] and fuzz.smaller_sizes(2) == [1] and fuzz.smaller_sizes(10) == [1, 5, 8, 9]
    case = Case("c", "", 0, {}, {"a": np.zeros((5, 2)), "shared": np.zeros((7,))})
    variants = list(fuzz.batch_variants(case, shared=("shared",)))
    assert [v.inputs["a"].shape[0] for v in variants] == [1, 1, 1, 1, 1, 2, 3]
    assert all(v.inputs["shared"].shape == (7,) for v in variants)
    assert list(fuzz.default_shrink(case)) == []  # leading axes differ: no generic cut
    same = Case("c", "", 0, {}, {"a": np.zeros((2, 3)), "b": np.zeros((2,))})
    assert len(list(fuzz.default_shrink(same))) == 2


def test_failure_signatures():
    from kdt.compare import FieldResult

    def result(error=None, bad=()):
        return CaseResult("k", "c", "", False, None, [FieldResult(n, 1, 1 if n in bad else 0) for n in ("x", "y")], error)

    mismatch_x = fuzz.failure_signature(result(bad=("x",)))
    assert fuzz.same_failure(mismatch_x, fuzz.failure_signature(result(bad=("x", "y"))))
    assert not fuzz.same_failure(mismatch_x, fuzz.failure_signature(result(bad=("y",))))
    assert not fuzz.same_failure(mismatch_x, fuzz.failure_signature(result(error="RuntimeError: boom")))
    assert fuzz.same_failure(("error", "RuntimeError"), fuzz.failure_signature(result(error="RuntimeError: other")))


# --- the command ----------------------------------------------------------------------------------------

def run_kdt(monkeypatch, capsys, *args):
    """`kdt ARGS` through the real app, where fuzz and sanitize are registered."""
    return run_kdt_cli(monkeypatch, capsys, *args)


def test_fuzz_command_reports_saves_and_exits_1(tmp_path, monkeypatch, capsys):
    from kdt.commands import common, fuzz as fuzz_command

    monkeypatch.setattr(common, "preflight", lambda specs: None)
    monkeypatch.setattr(fuzz_command, "device_hooks", lambda graph, knobs: (fake_kernel(topk_bug), healthy))
    code, out, err = run_kdt(monkeypatch, capsys, "fuzz", "topk", "--seed", "7", "--cases", "40",
                             "--golden-dir", str(tmp_path), "--max-failures", "1")
    assert code == 1, out + err
    assert "FAIL" in out and "topk case" in out and "replay: kdt fuzz topk --seed 7 --start" in out
    assert str(fuzz.regressions_path("topk", tmp_path)) in out and "Traceback" not in err
    assert "seed 7" in err
    assert len(golden.read(fuzz.regressions_path("topk", tmp_path), stages.get("topk")).cases) == 1


def test_fuzz_command_clean_run_exits_0(tmp_path, monkeypatch, capsys):
    from kdt.commands import common, fuzz as fuzz_command

    monkeypatch.setattr(common, "preflight", lambda specs: None)
    monkeypatch.setattr(fuzz_command, "device_hooks", lambda graph, knobs: (fake_kernel(), healthy))
    code, out, err = run_kdt(monkeypatch, capsys, "fuzz", "tree-accept", "--cases", "3", "--golden-dir", str(tmp_path))
    assert code == 0, out + err
    assert "3 cases, 0 failed, 0 generator bugs" in out
    assert not (tmp_path / "regressions").exists()


def test_fuzz_command_bad_input(monkeypatch, capsys):
    code, out, err = run_kdt(monkeypatch, capsys, "fuzz", "nope")
    assert code == 3 and "expected one of" in err and "Traceback" not in err


def test_fuzz_command_without_a_gpu_exits_2(monkeypatch, capsys):
    from kdt import runtime

    def no_gpu():
        raise runtime.GpuMissing("CuPy is not importable (ModuleNotFoundError: No module named 'cupy')")

    monkeypatch.setattr(runtime, "cupy", no_gpu)
    code, out, err = run_kdt(monkeypatch, capsys, "fuzz", "topk", "--cases", "1")
    assert code == 2 and "cannot run here" in err and "CuPy" in err and "Traceback" not in err


# --- on the GPU -----------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("kernel", stages.names())
def test_kernel_survives_fuzzing(kernel, graph, tmp_path):
    spec = stages.get(kernel)
    report = fuzz.run_fuzz(spec, seconds=60, seed=20261130, max_cases=6 if graph else 12,
                           run_case=fuzz.device_runner(graph), regressions=tmp_path / f"{kernel}.h5", shrink_runs=40)
    details = [f"case {f.index}: {f.detail}; smallest {fuzz.summarize(f.shrunk)}" for f in report.failures]
    details += [f"generator bug, case {b.index}: {b.message}" for b in report.generator_bugs]
    assert report.ok, "\n".join(details + [report.context_lost or ""])

