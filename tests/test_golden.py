"""Golden files: layout, determinism, drift detection, atomic writes, and every broken file named."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from kdt import golden, stages
from kdt.dtypes import BF16
from tests.faults import fill_the_disk

SPEC = stages.get("tree-accept")


@pytest.fixture(scope="module")
def fresh():
    return golden.expected_for(SPEC, SPEC.make_cases())


def test_committed_golden_files_have_no_drift(root):
    for spec in stages.all_stages():
        path = golden.default_path(root / "golden", spec.name)
        assert golden.drift(spec, path, golden.expected_for(spec, spec.make_cases())) == [], spec.name


def test_layout_is_the_contracts(root):
    path = golden.default_path(root / "golden", "verify-attn")
    with h5py.File(path, "r") as f:
        assert f.attrs["kernel"] == "verify-attn" and int(f.attrs["schema_version"]) == golden.SCHEMA_VERSION
        assert str(f.attrs["ref_digest"]).startswith("sha256:") and "kdt" in str(f.attrs["generator"])
        case = f[next(iter(f))]
        assert {"description", "seed", "softmax_scale", "d_v"} <= set(case.attrs)
        q = case["inputs/q"]
        assert q.dtype == np.uint16 and q.attrs["dtype"] == "bfloat16"
        assert set(case["expected"]) == {"out", "lse"}


def test_generation_is_deterministic(tmp_path, fresh):
    golden.write(tmp_path / "a.h5", SPEC, fresh)
    again = golden.expected_for(SPEC, SPEC.make_cases())
    assert golden.drift(SPEC, tmp_path / "a.h5", again) == []


def test_roundtrip_keeps_bf16(tmp_path):
    spec = stages.get("topk")
    case = [c for c in spec.make_cases() if c.name == "v1024_vocab5003"]
    golden.write(tmp_path / "t.h5", spec, golden.expected_for(spec, case))
    back = golden.read(tmp_path / "t.h5", spec)
    assert back.cases[0].case.inputs["logits"].dtype == BF16
    assert back.cases[0].case.inputs["logits"].tobytes() == case[0].inputs["logits"].tobytes()


def test_drift_is_reported(tmp_path, fresh):
    path = tmp_path / "tree-accept.h5"
    golden.write(path, SPEC, fresh)
    with h5py.File(path, "r+") as f:
        data = f["k1/expected/accept_len"]
        data[0] = data[0] + 1
    found = golden.drift(SPEC, path, fresh)
    assert [(d.case, d.item) for d in found] == [("k1", "expected/accept_len")]


@pytest.mark.parametrize("damage, problem", [
    (lambda p: p.unlink(), "no such file"),
    (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "truncated"),
    (lambda p: p.write_text("not hdf5"), "not a readable HDF5"),
])
def test_broken_files_are_named(tmp_path, fresh, damage, problem):
    path = tmp_path / "tree-accept.h5"
    golden.write(path, SPEC, fresh)
    damage(path)
    with pytest.raises(golden.GoldenError) as error:
        golden.read(path, SPEC)
    assert problem in str(error.value)


def _edit(path: Path, edit):
    with h5py.File(path, "r+") as f:
        edit(f)


@pytest.mark.parametrize("edit, problem", [
    (lambda f: f.attrs.__setitem__("schema_version", 99), "schema_version 99"),
    (lambda f: f.attrs.__setitem__("kernel", "topk"), "holds kernel 'topk'"),
    (lambda f: f.attrs.__delitem__("kernel"), "missing file attribute 'kernel'"),
    (lambda f: f["k1/expected"].__delitem__("accept_len"), "lacks the expected dataset 'accept_len'"),
    (lambda f: (f["k1/expected"].__delitem__("accept_len"),
                f["k1/expected"].create_dataset("accept_len", data=np.zeros(2, np.int64))), "int64"),
    (lambda f: (f["k1/expected"].__delitem__("accept_len"),
                f["k1/expected"].create_dataset("accept_len", data=np.zeros(3, np.int32))), "(3,)"),
    (lambda f: f["k1"].attrs.__delitem__("max_depth"), "lacks the parameter(s) max_depth"),
])
def test_malformed_files_are_named(tmp_path, fresh, edit, problem):
    path = tmp_path / "tree-accept.h5"
    golden.write(path, SPEC, fresh)
    _edit(path, edit)
    with pytest.raises(golden.GoldenError) as error:
        golden.read(path, SPEC)
    assert problem in str(error.value)


def test_failed_write_leaves_the_old_file_intact(tmp_path, fresh, monkeypatch):
    path = tmp_path / "tree-accept.h5"
    golden.write(path, SPEC, fresh)
    before = path.read_bytes()

    fill_the_disk(monkeypatch)
    with pytest.raises(OSError):
        golden.write(path, SPEC, fresh)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["tree-accept.h5"]  # no temporary left behind


def test_inputs_only_file_gets_expected_outputs(tmp_path, fresh):
    captured = tmp_path / "captured.h5"
    golden.write(captured, SPEC, fresh, inputs_only=True)
    with pytest.raises(golden.GoldenError, match="no 'expected' group"):
        golden.read(captured, SPEC)
    read_back = golden.read(captured, expect_outputs=False)
    computed = golden.expected_for(SPEC, [item.case for item in read_back.cases])
    for a, b in zip(computed, fresh):
        for key in b.expected:
            assert a.expected[key].tobytes() == b.expected[key].tobytes()
