"""kdt bench without a GPU: the sources an A/B comparison builds, and the regression gate's matching."""

from __future__ import annotations

import pytest

from kdt import bench, paths
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


def _result(shape, us, arch="sm_90a", knobs=None):
    timing = bench.Timing(us, us, us, 100)
    return bench.ShapeResult("topk", shape, {}, 1, 0, 1, "", timing, None, us, 0, 0, 0, 0, knobs=knobs or {},
                             arch=arch)


def test_regressions_match_shape_arch_and_knobs():
    baseline = {"results": [{"kernel": "topk", "shape": "a", "headline_us": 10.0, "arch": "sm_90a", "knobs": {}},
                            {"kernel": "topk", "shape": "a", "headline_us": 20.0, "arch": "sm_120-emu", "knobs": {}},
                            {"kernel": "topk", "shape": "b", "headline_us": 10.0}]}   # an older file: no arch
    now = [_result("a", 10.5), _result("a", 30.0, "sm_120-emu"), _result("b", 12.0),
           _result("a", 99.0, knobs={"min_chunk": 1})]
    slower = bench.regressions(now, baseline, 10.0)
    assert [(s[1], s[2], s[3]) for s in slower] == [("a", 20.0, 30.0), ("b", 10.0, 12.0)]
