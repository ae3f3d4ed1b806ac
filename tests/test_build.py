"""kdt build: cache keys, ptxas parsing, and a real compile of every kernel for sm_90 and sm_120."""

from __future__ import annotations

import pytest

from kdt import build, stages, toolkit

PTXAS_LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'kdt_tree_build' for 'sm_90'
ptxas info    : Function properties for kdt_tree_build
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 400 bytes cmem[0]
"""


def test_parse_ptxas():
    (resources,) = build.parse_ptxas(PTXAS_LOG)
    assert resources == build.FunctionResources("kdt_tree_build", 40, 2048, 8, 4, 4)


def test_cache_key_follows_source_headers_arch_and_nvcc(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "KERNELS_DIR", tmp_path)
    (tmp_path / "common").mkdir()
    header = tmp_path / "common" / "util.cuh"
    header.write_text("#define X 1\n")
    source = tmp_path / "k.cu"
    source.write_text('#include "common/util.cuh"\nextern "C" __global__ void k() {}\n')
    key = build.cache_key(source, "sm_90", "13.0.88")
    assert key == build.cache_key(source, "sm_90", "13.0.88")
    assert key != build.cache_key(source, "sm_120", "13.0.88")
    assert key != build.cache_key(source, "sm_90", "13.1.0")
    assert key != build.cache_key(source, "sm_90", "13.0.88", build.NVCC_FLAGS + ("-G",))
    header.write_text("#define X 2\n")
    assert key != build.cache_key(source, "sm_90", "13.0.88")


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
@pytest.mark.parametrize("kernel", stages.names())
def test_every_kernel_compiles_without_warnings(kernel, arch, tmp_path, monkeypatch):
    monkeypatch.setenv("KDT_CACHE_DIR", str(tmp_path))
    spec = stages.get(kernel)
    result = build.build(spec, arch)
    assert result.cubin.is_file() and not result.cached
    assert result.resources, "ptxas reported no entry function"
    assert all(r.spill_store_bytes == 0 for r in result.resources), result.resources
    again = build.build(spec, arch)
    assert again.cached and again.cubin == result.cubin


@pytest.mark.nvcc
def test_compile_errors_name_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setenv("KDT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "KERNELS_DIR", tmp_path)
    (tmp_path / "topk.cu").write_text('extern "C" __global__ void k() { int unused; undefined_call(); }\n')
    with pytest.raises(build.BuildError) as error:
        build.build(stages.get("topk"), "sm_90")
    assert "topk.cu(1)" in error.value.log


def test_unknown_arch_is_rejected():
    with pytest.raises(ValueError, match="arch"):
        toolkit.arch_flag("sm_7")
