"""kdt build: cache keys, ptxas parsing, and a real compile of every kernel for sm_90 and sm_120."""

from __future__ import annotations

import json
import os

import pytest

from kdt import build, stages, toolkit
from tests import sass

PTXAS_LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'kdt_tree_build' for 'sm_90'
ptxas info    : Function properties for kdt_tree_build
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 400 bytes cmem[0]
"""


def test_parse_ptxas():
    (resources,) = build.parse_ptxas(PTXAS_LOG, {"kdt_tree_build": (8, 4)})
    assert resources == build.FunctionResources("kdt_tree_build", 40, 2048, 8, 4, 4, (8, 4))
    assert build.parse_ptxas(PTXAS_LOG, {})[0].parameters == ()


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


# The spills an entry point may have, and why; any other spill, or more than these, fails the build check.
# kdt_tree_sample_slots runs at two blocks per SM (64 registers a thread) so that G1 N16's 16 clusters start in one
# wave on the H200 (at one block per SM the 16th waited for the first 15: 24.9 us against 13.8, same run;
# plans/kernels/tree-sample.md). Measured with nvcc 13.0 (version 10): 196 bytes on sm_90 / sm_90a, 124 on sm_120.
# kdt_topk_gate_*: 1,024 threads a block (the prune's radix select and sort are whole-block) leave 64 registers;
# the spills are the saves around the noinline meeting (gate_rendezvous) and loop-carried values reloaded each step
# (plans/kernels/topk.md, "Gate path", where the timed build has them). nvcc 13.0: f32 132 / bf16 216 bytes on
# sm_90, 88 / 140 on sm_120; the split kernels (the split's offset and row live through the scan) f32 120 / bf16 200
# on sm_90a.
SPILL_STORE_BYTES_ALLOWED = {"kdt_tree_sample_slots": 256, "kdt_topk_gate_f32": 160, "kdt_topk_gate_bf16": 256,
                             "kdt_topk_gate_split_f32": 160, "kdt_topk_gate_split_bf16": 256}


@pytest.mark.nvcc
@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
@pytest.mark.parametrize("kernel", build.kernel_names())
def test_every_kernel_compiles_without_warnings(kernel, arch):
    """Every source under kernels/ (warnings are errors: a cubin in the cache compiled clean), with no spills but
    the allowed ones, its launch constants read from the cubin. The user's cache is shared with test_plans, so CI
    compiles each once."""
    result = build.build(kernel, arch)
    assert result.cubin.is_file()
    assert result.resources, "ptxas reported no entry function"
    assert all(r.spill_store_bytes <= SPILL_STORE_BYTES_ALLOWED.get(r.function, 0) for r in result.resources), \
        result.resources
    prefix = f"kdt_{kernel.replace('-', '_')}_"
    assert result.constants and all(name.startswith(prefix) for name in result.constants), result.constants
    again = build.build(kernel, arch)
    assert again.cached and again.cubin == result.cubin and again.constants == result.constants
    assert again.resources == result.resources


# SASS opcodes (before the first '.') that read or write global memory, or memory by a generic address.
GLOBAL_MEMORY_OPCODES = {"LDG", "STG", "LDGSTS", "ATOMG", "RED", "ATOM", "LD", "ST", "CCTL", "UBLKCP", "UBLKPF",
                         "UBLKRED", "UTMALDG", "UTMAPF", "UTMASTG", "UTMAREDG"}
# Entry points whose wait for the previous launch comes later, and why that is sound.
WAITS_LATER = {"kdt_verify_attn_combine": "it reads n_nodes, a step input, before its wait; it only ever follows its "
                                          "main kernel, which let it in after waiting itself"}


def _sass_opcodes(instructions: list[str]) -> list[str]:
    """The opcodes (before the first '.') of a section's instructions, predicates dropped."""
    opcodes = []
    for instruction in instructions:
        words = instruction.replace(";", " ").split()
        words = words[1:] if words and words[0].startswith("@") else words
        if words:
            opcodes.append(words[0].split(".")[0])
    return opcodes


@pytest.mark.nvcc
@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
@pytest.mark.parametrize("kernel", stages.names())
def test_every_entry_point_waits_for_the_previous_launch_before_touching_memory(kernel, arch):
    """The knob overlap_previous lets a plan's first kernel start before the launch ahead of it ends. That is sound
    only where every entry point waits for that launch (griddepcontrol.wait: SASS ACQBULK) before its first global
    memory access, and it gains only where each lets the next launch in (launch_dependents: PREEXIT)."""
    listing = sass.sections(kernel, arch)
    for function in (r.function for r in build.build(kernel, arch).resources):
        opcodes = _sass_opcodes(listing[function])
        assert "ACQBULK" in opcodes and "PREEXIT" in opcodes, f"{function}: no griddepcontrol wait or launch"
        if function in WAITS_LATER:
            continue
        first_access = next((i for i, op in enumerate(opcodes) if op in GLOBAL_MEMORY_OPCODES), len(opcodes))
        assert opcodes.index("ACQBULK") < first_access, \
            f"{function} ({arch}) touches global memory ({opcodes[first_access]}) before its wait"


@pytest.mark.nvcc
@pytest.mark.compile
def test_the_kernels_limits_are_the_contracts():
    """The limits each kernel exports equal the ones its stage spec checks (the contract's launcher limits)."""
    from kdt.stages import topk, tree_accept, tree_build, verify_attn

    exported = {name: build.build(name, "sm_90").constants for name in stages.names()}
    assert exported["topk"]["kdt_topk_max_v"] == topk.reference.MAX_K
    assert exported["topk"]["kdt_topk_max_vocab"] == topk.MAX_VOCAB
    assert exported["tree-build"]["kdt_tree_build_max_budget"] == tree_build.reference.MAX_BUDGET
    assert exported["tree-build"]["kdt_tree_build_max_depth"] == tree_build.reference.MAX_DEPTH
    assert exported["tree-build"]["kdt_tree_build_max_fanout"] == tree_build.reference.MAX_FANOUT
    assert exported["tree-accept"]["kdt_tree_accept_max_nodes"] == tree_accept.MAX_SLOTS
    assert exported["verify-attn"]["kdt_verify_attn_dqk"] == verify_attn.KEY_DIM
    assert exported["verify-attn"]["kdt_verify_attn_dv"] == verify_attn.VALUE_DIM
    assert exported["verify-attn"]["kdt_verify_attn_page"] == verify_attn.PAGE_SIZE


def test_a_missing_or_old_build_report_is_a_cache_miss(tmp_path):
    assert build._read_report(tmp_path / "missing.json") is None
    (tmp_path / "old.json").write_text("[]")    # the report format of an older kdt
    assert build._read_report(tmp_path / "old.json") is None
    resources = {"function": "k", "registers": 8, "shared_bytes": 0, "stack_bytes": 0, "spill_store_bytes": 0,
                 "spill_load_bytes": 0}
    report = {"resources": [resources], "constants": {}, "sha256": "0" * 64}
    (tmp_path / "no-parameters.json").write_text(json.dumps(report))   # before parameters were recorded
    assert build._read_report(tmp_path / "no-parameters.json") is None
    report["resources"][0]["parameters"] = [8, 4]
    (tmp_path / "now.json").write_text(json.dumps(report))
    assert build._read_report(tmp_path / "now.json")["resources"][0].parameters == (8, 4)


def _attribute(form: int, attribute: int, value: bytes = b"") -> bytes:
    sized = len(value).to_bytes(2, "little") if form == build.EIFMT_SVAL else b""
    return bytes([form, attribute]) + sized + value


def _kparam(ordinal: int, size: int) -> bytes:
    """An EIATTR_KPARAM_INFO record: index, ordinal, offset, then flags with the size in bits 18..31."""
    value = (0).to_bytes(4, "little") + ordinal.to_bytes(2, "little") + (0).to_bytes(2, "little") + \
        ((size << 18) | 0x1F000).to_bytes(4, "little")
    return _attribute(build.EIFMT_SVAL, build.EIATTR_KPARAM_INFO, value)


def test_parameter_sizes_from_an_nv_info_section():
    """Records in any order (nvcc writes them last parameter first) among attributes of every format."""
    info = (_attribute(build.EIFMT_SVAL, 0x37, b"\x82\0\0\0") + _kparam(2, 4)
            + _attribute(build.EIFMT_HVAL, 0x1B, b"\xff\0") + _kparam(0, 8) + _attribute(build.EIFMT_NVAL, 0x05)
            + _kparam(1, 16) + _attribute(build.EIFMT_BVAL, 0x10, b"\1\0"))
    assert build._parameter_sizes(info, "s") == (8, 16, 4)
    assert build._parameter_sizes(info + b"\0\0garbage", "s") == (8, 16, 4)   # a zero format byte ends it
    assert build._parameter_sizes(b"", "s") == ()
    with pytest.raises(ValueError, match="past the section's end"):
        build._parameter_sizes(_kparam(0, 8)[:-1], "s")
    with pytest.raises(ValueError, match="unknown format 0x9"):
        build._parameter_sizes(bytes([9, 0x17]), "s")
    with pytest.raises(ValueError, match="ordinals"):
        build._parameter_sizes(_kparam(1, 8), "s")


PARAMETERS_KERNEL = """struct Pair { double a, b; };
extern "C" __global__ void params(const float* x, int n, double d, char c) { if (n == 0 && c) *(float*)x = (float)d; }
extern "C" __global__ void by_value(Pair p, short s, float* y) { y[0] = static_cast<float>(p.a + s); }
extern "C" __global__ void none() {}
"""


@pytest.mark.nvcc
def test_the_parameters_of_each_function_are_read_from_the_cubin(tmp_path, monkeypatch):
    """(const float*, int, double, char) is 8,4,8,1 bytes; a struct by value its size; no parameters, none. Recorded
    in the report, so a cached build gives them back."""
    monkeypatch.setenv("KDT_CACHE_DIR", str(tmp_path / "cache"))
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "params.cu").write_text(PARAMETERS_KERNEL)
    for arch in ("sm_90a", "sm_120"):
        result = build.build("params", arch, kernels_dir=kernels)
        assert {r.function: r.parameters for r in result.resources} == \
            {"params": (8, 4, 8, 1), "by_value": (16, 2, 8), "none": ()}
        again = build.build("params", arch, kernels_dir=kernels)
        assert again.cached and again.resources == result.resources


@pytest.mark.nvcc
def test_compile_errors_name_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setenv("KDT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "KERNELS_DIR", tmp_path)
    (tmp_path / "topk.cu").write_text('extern "C" __global__ void k() { int unused; undefined_call(); }\n')
    with pytest.raises(build.BuildError) as error:
        build.build(stages.get("topk"), "sm_90")
    assert "topk.cu(1)" in error.value.log


def test_unknown_arch_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="arch"):
        build.build("topk", "sm_7")


TINY_KERNEL = 'extern "C" __constant__ int kdt_tiny_threads = 32;\nextern "C" __global__ void tiny(int* out) { out[threadIdx.x] = 1; }\n'


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A one-line kernel in its own sources and cache: compiles in a second."""
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "tiny.cu").write_text(TINY_KERNEL)
    monkeypatch.setattr(build, "KERNELS_DIR", kernels)
    monkeypatch.setenv("KDT_CACHE_DIR", str(tmp_path / "cache"))
    return kernels


@pytest.mark.nvcc
def test_a_corrupted_cache_entry_is_rebuilt_not_trusted(tiny, capsys):
    first = build.build("tiny", "sm_90")
    assert not first.cached and first.constants == {"kdt_tiny_threads": 32}
    assert build.build("tiny", "sm_90").cached
    first.cubin.write_bytes(first.cubin.read_bytes()[:100])          # truncated behind kdt's back
    again = build.build("tiny", "sm_90")
    assert not again.cached and again.cubin == first.cubin and again.constants == first.constants
    assert "does not match the digest" in capsys.readouterr().err
    assert build.build("tiny", "sm_90").cached


@pytest.mark.nvcc
def test_without_pyelftools_a_build_stops_before_nvcc_and_the_cache_still_serves(tiny, monkeypatch, capsys):
    """A checkout run on an image without pyelftools (kdt's dependency that reads a new cubin's records): a clear
    ToolkitMissing (exit 2) before nvcc runs, and cubins already in the cache load as before."""
    cached = build.build("tiny", "sm_90")
    monkeypatch.setitem(__import__("sys").modules, "elftools.elf.elffile", None)
    assert build.build("tiny", "sm_90").cached
    capsys.readouterr()
    with pytest.raises(toolkit.ToolkitMissing, match="pip install pyelftools"):
        build.build("tiny", "sm_90", force=True)
    assert "compiling" not in capsys.readouterr().err
    assert build.build("tiny", "sm_90").cubin == cached.cubin


@pytest.mark.nvcc
def test_cached_files_are_readable_by_the_group(tiny):
    result = build.build("tiny", "sm_90")
    for path in (result.cubin, result.cubin.with_suffix(".json")):
        assert path.stat().st_mode & 0o044 == 0o044, oct(path.stat().st_mode)


@pytest.mark.nvcc
def test_concurrent_builds_of_the_same_kernel_are_safe(tiny, tmp_path, root):
    """Two processes build the same kernel into the same empty cache at once: both succeed, one cubin remains,
    its report matches it, and no temporary is left behind."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from kdt import build; build.KERNELS_DIR = Path(sys.argv[1]); "
            "r = build.build('tiny', 'sm_90'); print(r.cubin)")
    env = {**os.environ, "KDT_CACHE_DIR": str(tmp_path / "cache")}
    processes = [subprocess.Popen([sys.executable, "-c", code, str(tiny)], cwd=root, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    outputs = [p.communicate(timeout=300) for p in processes]
    assert all(p.returncode == 0 for p in processes), outputs
    assert len({out.strip() for out, _ in outputs}) == 1
    files = sorted(p.name for p in (tmp_path / "cache" / "cubins").iterdir())
    assert len(files) == 2 and not any(name.startswith(".") for name in files), files
    assert build.build("tiny", "sm_90").cached
