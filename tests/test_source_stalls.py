"""kdt profile --lines without a GPU: ncu's source page and nvdisasm's line table as captured for tree-sample's
every-slot kernel on the H200 (tests/data, trimmed to the sampled instructions), the chains they make, a real line
table from nvdisasm on a cubin built here, and the command end to end with a stand-in for the second ncu run."""

from __future__ import annotations

import json
import subprocess

import pytest

from kdt import source_stalls, toolkit
from tests.test_profile import DATA, FWD, COMBINE, _command_fakes, _plan, fake_ncu, log_form, run_kdt, VERIFY_ATTN_CSV

SLOTS = "kdt_tree_sample_slots"
# ncu 2025.3.1 on the H200: `ncu --kernel-name regex:kdt_tree_sample_slots --launch-count 1 --section SourceCounters
# --section WarpStateStats -o prof python3 -m kdt bench tree-sample --shape G1_N16_T0.7_topp0.95 --no-graph
# --no-baselines`, then `ncu -i prof.ncu-rep --page source --csv --print-source sass` (kept: the first instruction,
# the sampled ones, the address, source, sample and per-reason columns); `nvdisasm -gi -c` of the same cubin (kept:
# those instructions and the line comments that apply to them).
PAGE = (DATA / "ncu_source_tree_sample_slots.csv").read_text()
DISASSEMBLY = (DATA / "nvdisasm_tree_sample_slots.txt").read_text()


def test_the_captured_profile_by_source_line():
    pages = source_stalls.source_page(PAGE)
    assert list(pages) == [SLOTS] and pages[SLOTS][0].offset == 0
    rows = source_stalls.by_chain(pages[SLOTS], source_stalls.instruction_chains(DISASSEMBLY, SLOTS))
    assert sum(row.samples for row in rows) == sum(item.samples for item in pages[SLOTS]) == 1380
    assert sum(row.share for row in rows) == pytest.approx(1.0)
    # the most samples: warps 1-15 at the block barrier after the slot depths (the kernel's line 134, inlined
    # from every_slot at line 188), every one of them a barrier stall
    top = rows[0]
    assert top.chain == ("tree_sample.cu:188", "tree_sample.cu:134") and top.samples == 215
    assert top.top_reasons() == [("barrier", 215)]
    # a chain runs from the kernel into the headers, below kernels/ (common/ptx.cuh: the 16-byte load)
    loads = [row for row in rows if row.chain[-1:] == ("common/ptx.cuh:29",)]
    assert loads and all(row.chain[0].startswith("tree_sample.cu:") for row in loads)
    assert loads[0].top_reasons()[0][0] == "long_sb"
    assert [row.samples for row in rows] == sorted((row.samples for row in rows), reverse=True)


def test_frames_are_named_below_kernels_or_by_file():
    assert source_stalls.frame("/repo/kernels/tree_sample/draw.cuh", "561") == "tree_sample/draw.cuh:561"
    assert source_stalls.frame("/a/kernels/b/kernels/common/ptx.cuh", 29) == "common/ptx.cuh:29"
    assert source_stalls.frame("/usr/local/cuda-13.0/include/sm_30_intrinsics.hpp", 122) == \
        "sm_30_intrinsics.hpp:122"


def test_a_page_of_two_kernels_and_other_lines():
    page = ("==PROF== Connected\n"
            '"Kernel Name","first",\n"Address","Source","Warp Stall Sampling (All Samples)","stall_barrier",'
            '"stall_barrier (Not Issued)"\n"0x100","NOP","3","2","9"\n"0x110","BAR","1,024","1,000","9"\n'
            "something the child printed\n"
            '"Kernel Name","second",\n"Address","Source","Warp Stall Sampling (All Samples)","stall_wait"\n'
            '"0x7f00","LDG","5","5"\n')
    pages = source_stalls.source_page(page)
    assert [(i.offset, i.samples, i.reasons) for i in pages["first"]] == [(0, 3, {"barrier": 2}),
                                                                          (16, 1024, {"barrier": 1000})]
    assert [(i.offset, i.samples, i.reasons) for i in pages["second"]] == [(0, 5, {"wait": 5})]
    rows = source_stalls.by_chain(pages["first"], {16: ("k.cu:7",)})
    assert [(row.chain, row.samples) for row in rows] == [(("k.cu:7",), 1024), ((), 3)]


def test_the_second_run_keeps_the_same_launches_and_exports_a_report():
    line = source_stalls.ncu_command("ncu", "regex:^(a|b)$", 2, 2, "/tmp/x/source", ["python3", "-m", "kdt"])
    assert line[line.index("--launch-skip") + 1] == "2" and line[line.index("--launch-count") + 1] == "2"
    assert line[line.index("--export") + 1] == "/tmp/x/source" and "SourceCounters" in line
    assert line[-3:] == ["python3", "-m", "kdt"]
    assert source_stalls.import_command("ncu", "r.ncu-rep") == ["ncu", "--import", "r.ncu-rep", "--page", "source",
                                                                "--csv", "--print-source", "sass"]


@pytest.mark.compile
def test_nvdisasm_line_table_of_a_cubin_built_here(tmp_path):
    from kdt import build

    nvdisasm = toolkit.find_cuda_tool("nvdisasm")
    if nvdisasm is None:
        pytest.skip("no nvdisasm")
    (tmp_path / "probe.cu").write_text(
        "__device__ __forceinline__ float twice(float x) {\n"
        "    return x * 2.0f + 1.0f;\n"                               # line 2: inlined into the kernel
        "}\n"
        'extern "C" __global__ void probe(const float* in, float* out) {\n'
        "    out[threadIdx.x] = twice(in[threadIdx.x]);\n"             # line 5
        "}\n")
    cubin = build.build("probe", "sm_90a", kernels_dir=tmp_path).cubin
    text = subprocess.run([str(nvdisasm), "-gi", "-c", str(cubin)], capture_output=True, text=True).stdout
    chains = source_stalls.instruction_chains(text, "probe")
    assert chains and set(chains) == {offset for offset in chains if offset % 16 == 0}
    assert ("probe.cu:5", "probe.cu:2") in set(chains.values())   # the kernel's line, then the inlined one


def _lines_fake(found):
    def run(child, functions, **options):
        assert child[:4] == [child[0], "-m", "kdt", "bench"] and functions == [FWD, COMBINE]
        return found
    return run


def test_profile_lines_prints_and_writes_the_chains(monkeypatch, capsys, tmp_path):
    _command_fakes(monkeypatch, _plan("verify-attn", FWD, COMBINE), fake_ncu(log_form(VERIFY_ATTN_CSV)))
    monkeypatch.setattr(toolkit, "find_cuda_tool", lambda name, **kw: f"/cuda/bin/{name}")
    monkeypatch.setattr("kdt.build.build", lambda spec, arch: type("R", (), {"cubin": tmp_path / "v.cubin"})())
    row = source_stalls.LineStalls(("verify_attn.cu:120", "verify_attn/mainloop_wgmma.cuh:88"), 40, 0.4,
                                   {"barrier": 30, "wait": 10})
    found = source_stalls.SourceStalls(["ncu"], 0, "", {FWD: [row], COMBINE: []})
    monkeypatch.setattr(source_stalls, "run", _lines_fake(found))
    out_json = tmp_path / "p.json"
    code, out, err = run_kdt(monkeypatch, capsys, "profile", "verify-attn", "--shape", "G1_H8_N8_prefix1*",
                             "--lines", "5", "--json", str(out_json))
    assert code == 0, out + err
    flat = " ".join(out.split())
    assert "where its warps stall" in flat and "verify_attn.cu:120 > verify_attn/mainloop_wgmma.cuh:88" in flat
    assert "barrier 30, wait 10" in flat and "40.0%" in flat
    assert json.loads(out_json.read_text())["lines"][FWD][0]["samples"] == 40


def test_profile_lines_without_counters_is_a_failed_check(monkeypatch, capsys, tmp_path):
    _command_fakes(monkeypatch, _plan("verify-attn", FWD, COMBINE), fake_ncu(log_form(VERIFY_ATTN_CSV)))
    monkeypatch.setattr(toolkit, "find_cuda_tool", lambda name, **kw: f"/cuda/bin/{name}")
    monkeypatch.setattr("kdt.build.build", lambda spec, arch: type("R", (), {"cubin": tmp_path / "v.cubin"})())
    monkeypatch.setattr(source_stalls, "run", _lines_fake(source_stalls.SourceStalls(["ncu"], 1, "==ERROR== no")))
    code, out, err = run_kdt(monkeypatch, capsys, "profile", "verify-attn", "--shape", "G1_H8_N8_prefix1*",
                             "--lines", "5")
    assert code == 1 and "gave no source counters (ncu exited 1)" in " ".join(out.split())
    assert "Traceback" not in err


def test_profile_lines_needs_nvdisasm(monkeypatch, capsys):
    _command_fakes(monkeypatch, _plan("verify-attn", FWD, COMBINE), fake_ncu(log_form(VERIFY_ATTN_CSV)))
    monkeypatch.setattr(toolkit, "find_cuda_tool", lambda name, **kw: None)
    code, out, err = run_kdt(monkeypatch, capsys, "profile", "verify-attn", "--shape", "G1_H8_N8_prefix1*",
                             "--lines", "5")
    assert code == 2 and "nvdisasm not found" in " ".join((out + err).split())


@pytest.mark.gpu
@pytest.mark.slow
def test_profile_lines_on_the_gpu(root, tmp_path):
    import sys

    from kdt import profile

    if profile.find_ncu() is None or toolkit.find_cuda_tool("nvdisasm") is None:
        pytest.skip("no ncu or no nvdisasm")
    out_json = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, "-m", "kdt", "profile", "topk", "--shape", "G1_K7_vocab163840_V8_f32",
                           "--lines", "5", "--json", str(out_json)], capture_output=True, text=True, cwd=root,
                          timeout=900, env={**__import__("os").environ, "COLUMNS": "200"})
    if done.returncode == 2 and profile.PERMISSION in done.stderr:
        pytest.skip("ncu may not read the performance counters here (ERR_NVGPUCTRPERM)")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = json.loads(out_json.read_text())["lines"]
    rows = [row for function in lines.values() for row in function]
    assert rows and any(row["chain"] and row["chain"][0].startswith("topk.cu:") for row in rows[:5])
    assert sum(row["share"] for function in lines.values() for row in function) == pytest.approx(len(lines))
