"""Output that fits where it goes (issue 19): with stdout captured, as in every CI log, tables keep every cell whole
(no "…", the longest names intact); `--format markdown` prints GitHub tables and `--format json` one JSON document;
$GITHUB_STEP_SUMMARY gets the findings appended. No GPU: the GPU parts are fakes, as in test_hostile and test_fuzz."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kdt import bench, build, envcheck, limits, paths, peaks, sanitize, stages
from kdt.compare import Diff, FieldResult
from kdt.console import Report, Sheet, append_step_summary, styled
from kdt.verify import CaseResult
from tests.test_hostile import fake_gpu  # noqa: F401 (a fixture: a GPU that is never used)

ELLIPSIS = "…"


@pytest.fixture(autouse=True)
def ci_like(monkeypatch):
    """What CI gives a command: $COLUMNS that rich would take for a width, no step summary unless a test sets one."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)


def run(monkeypatch, capsys, *args):
    """`kdt ARGS` in this process with stdout and stderr captured (not a terminal), the console's width left alone."""
    import kdt.cli as cli

    monkeypatch.setattr(sys, "argv", ["kdt", *args])
    with pytest.raises(SystemExit) as done:
        cli.main()
    captured = capsys.readouterr()
    return done.value.code, captured.out, captured.err


def assert_whole(out: str, names) -> None:
    assert ELLIPSIS not in out
    for name in names:
        assert name in out, f"{name!r} is not whole in:\n{out}"


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def markdown_tables(text: str) -> list[dict]:
    """Every GitHub table in `text` (outside code blocks): header, separator and rows, each row checked to have as
    many cells as the header."""
    tables, current, fenced = [], None, False
    for line in text.splitlines() + [""]:
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("|"):
            if current is None:
                current = {"header": _cells(line), "separator": None, "rows": []}
            elif current["separator"] is None:
                current["separator"] = _cells(line)
                assert all(re.fullmatch(r"-{3,}:?", cell) for cell in current["separator"]), line
                assert len(current["separator"]) == len(current["header"])
            else:
                row = _cells(line)
                assert len(row) == len(current["header"]), line
                current["rows"].append(row)
        elif current is not None:
            assert current["separator"] is not None, current
            tables.append(current)
            current = None
    return tables


def summary_file(tmp_path: Path, monkeypatch) -> Path:
    path = tmp_path / "step-summary.md"
    path.write_text("# an earlier step\n\nits findings")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(path))
    return path


def assert_appended(path: Path, command: str) -> str:
    text = path.read_text()
    assert text.startswith("# an earlier step\n\nits findings\n\n### `kdt " + command), text[:300]
    return text


# --- the helper itself ----------------------------------------------------------------------------------

def test_a_sheet_takes_cells_as_text_and_never_cuts(monkeypatch, capsys):
    from kdt.console import console

    long = "kdt_a_function_name_much_longer_than_any_terminal_would_give_one_column_" * 2
    sheet = Sheet("t [bold]itle[/] | x", ("name", "n"), right=("n",))
    sheet.add_row(long, "1")
    sheet.add_row("[red]not markup[/] a|b", styled("2", "red"))
    console.print(sheet)
    out = capsys.readouterr().out
    assert_whole(out, [long, "[red]not markup[/] a|b", "t [bold]itle[/] | x"])
    (table,) = markdown_tables(sheet.markdown())
    assert table["header"] == ["name", "n"] and table["separator"] == ["---", "---:"]
    assert table["rows"] == [[long, "1"], ["[red]not markup[/] a\\|b", "2"]]
    with pytest.raises(ValueError):
        sheet.add_row("one cell")
    # a terminal narrower than the table: cells fold onto more lines, never end in "…"
    monkeypatch.setattr(console, "_width", 60)
    console.print(sheet)
    narrow = capsys.readouterr().out
    assert ELLIPSIS not in narrow and max(len(line) for line in narrow.splitlines()) <= 60
    assert long[:20] in narrow


def test_report_routes_each_format(capsys):
    sheet = Sheet("numbers", ("a", "b"))
    sheet.add_row("x", "1")
    for output in ("table", "markdown", "json"):
        report = Report("verify", output)
        report.table(sheet)
        report.say("[green]2 passed[/], 0 failed \\[x]")
        report.verbatim(["| a log line", "another"])
        report.document({"ok": True})
        captured = capsys.readouterr()
        if output == "json":
            assert json.loads(captured.out) == {"ok": True}
            assert "2 passed, 0 failed [x]" in captured.err and "a log line" in captured.err
        elif output == "markdown":
            assert captured.out.startswith("### `kdt verify`") and "2 passed, 0 failed [x]" in captured.out
            assert len(markdown_tables(captured.out)) == 1 and "```text\n| a log line\nanother\n```" in captured.out
        else:
            assert "numbers" in captured.out and "2 passed, 0 failed [x]" in captured.out
            assert "  | a log line" in captured.out and "{" not in captured.out
        assert report.markdown().count("| x | 1 |") == 1


def test_step_summary_appends_and_a_failure_is_only_a_warning(tmp_path, capsys):
    path = tmp_path / "summary.md"
    path.write_text("no newline at the end")
    assert append_step_summary(str(path), "### one\n")
    assert append_step_summary(str(path), "### two\n")
    assert path.read_text() == "no newline at the end\n\n### one\n\n### two\n"
    assert not append_step_summary(str(tmp_path), "### into a directory\n")
    assert "warning" in capsys.readouterr().err


# --- build ----------------------------------------------------------------------------------------------

LONG_FUNCTION = "kdt_topk_resident_narrow_bf16_with_a_name_far_longer_than_eighty_columns_allow_x" + "y" * 30


def _fake_build(monkeypatch, violations=()):
    def fake(kernel, arch, **kw):
        functions = [LONG_FUNCTION, "kdt_topk_small_bf16_v8", "kdt_topk_general_f32"]
        return build.BuildResult(build.kernel_name(kernel), arch, Path("/cache/x.cubin"), True,
                                 [build.FunctionResources(f, 40 + i, 16800, 0, 8 * (i == 1), 8 * (i == 1), (8, 4))
                                  for i, f in enumerate(functions)], {"kdt_topk_threads": 256})

    from kdt.commands import build as build_command

    monkeypatch.setattr(build, "build", fake)
    monkeypatch.setattr(build_command, "_plans", lambda result: [])
    monkeypatch.setattr(limits, "check", lambda result, plans: list(violations))
    return 3


def test_build_output_whole_and_formats(monkeypatch, capsys, tmp_path):
    rows = _fake_build(monkeypatch)
    code, out, err = run(monkeypatch, capsys, "build", "topk", "verify-attn", "--arch", "sm_120")
    assert code == 0, out + err
    assert_whole(out, [LONG_FUNCTION, "kdt_topk_small_bf16_v8", "verify-attn", "spill st/ld B", "registers"])
    assert "every function within its arch's limits (sm_120)" in out

    code, out, err = run(monkeypatch, capsys, "build", "topk", "verify-attn", "--arch", "sm_120",
                         "--format", "markdown")
    assert code == 0, err
    (table,) = markdown_tables(out)
    assert table["header"][:3] == ["kernel", "arch", "function"] and len(table["rows"]) == 2 * rows
    assert table["rows"][0][2] == LONG_FUNCTION and table["separator"][3] == "---:"

    code, out, err = run(monkeypatch, capsys, "build", "topk", "--arch", "sm_120", "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    assert document["ok"] and document["violations"] == []
    assert [r["function"] for r in document["results"][0]["resources"]][0] == LONG_FUNCTION
    assert document["results"][0]["cubin"] == "/cache/x.cubin"


def test_build_limit_violation_lands_in_the_step_summary(monkeypatch, capsys, tmp_path):
    violation = limits.Violation("topk", "sm_120", LONG_FUNCTION, "shared memory per block (dynamic + static)",
                                 101376, 142080, "G64_K15_vocab163840_V8_bf16")
    _fake_build(monkeypatch, [violation])
    summary = summary_file(tmp_path, monkeypatch)
    code, out, err = run(monkeypatch, capsys, "build", "topk", "--arch", "sm_120")
    assert code == 2 and "1 limit(s) exceeded" in err
    assert_whole(out, [LONG_FUNCTION, "shared memory per block (dynamic + static)", "G64_K15_vocab163840_V8_bf16",
                       "142,080"])
    text = assert_appended(summary, "build topk --arch sm_120")
    resources, exceeded = markdown_tables(text)
    assert len(resources["rows"]) == 3 and exceeded["header"][-1] == "where"
    assert exceeded["rows"] == [["topk", "sm_120", LONG_FUNCTION, "shared memory per block (dynamic + static)",
                                 "101,376", "142,080", "G64_K15_vocab163840_V8_bf16"]]
    assert text.rstrip().endswith("1 limit(s) exceeded: these cubins would fail on their GPU (the table above)")


def test_build_summary_that_cannot_be_written_is_a_warning(monkeypatch, capsys, tmp_path):
    _fake_build(monkeypatch)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "no" / "such" / "dir" / "summary.md"))
    code, out, err = run(monkeypatch, capsys, "build", "topk", "--arch", "sm_120", "--format", "json")
    assert code == 0 and json.loads(out)["ok"]
    assert "warning" in err and "GITHUB_STEP_SUMMARY" in err and "Traceback" not in err


@pytest.mark.nvcc
def test_build_for_real_with_stdout_a_pipe(tmp_path, root):
    """A real nvcc build of a one-function kernel whose name is longer than rich's default 80 columns."""
    name = "kdt_" + "a_kernel_function_name_that_no_eighty_column_table_could_show_whole_" * 2 + "end"
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "tiny.cu").write_text(f'extern "C" __global__ void {name}(int* out) {{ *out = 1; }}\n')
    env = {**os.environ, "KDT_KERNELS_DIR": str(tmp_path / "kernels"), "KDT_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("COLUMNS", None)
    env.pop("GITHUB_STEP_SUMMARY", None)
    done = subprocess.run([sys.executable, "-m", "kdt", "build", "tiny", "--arch", "sm_120"], capture_output=True,
                          text=True, cwd=root, env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_whole(done.stdout, [name, "spill st/ld B"])
    assert ELLIPSIS not in done.stderr


# --- verify ---------------------------------------------------------------------------------------------

LONG_CASE = "drafter_k15_v8_vocab163840_bf16_and_a_case_name_longer_than_any_eighty_column_table"


def _fake_verify(monkeypatch, failing: bool):
    from kdt import verify

    def verify_cases(spec, selected, max_diffs, graph, progress=None, knobs=None):
        good = FieldResult("top_logp", 96, 0)
        diffs = [Diff((0, 3, 1), 17, 18, "0x00000011", "0x00000012", None, "[id] off by one")] if failing else []
        bad = FieldResult("top_ids", 96, 2 if failing else 0, diffs, "worst: 1 id")
        return [CaseResult(spec.name, LONG_CASE, "long", not failing, 12.5, [good, bad]),
                CaseResult(spec.name, "b1", "small", True, 3.25, [good, FieldResult("top_ids", 8, 0)])]

    monkeypatch.setattr(verify, "select_cases", lambda spec, path, pattern=None: ["a case"])
    monkeypatch.setattr(verify, "verify_cases", verify_cases)


def test_verify_output_whole_formats_and_step_summary(monkeypatch, capsys, tmp_path, fake_gpu):
    _fake_verify(monkeypatch, failing=True)
    summary = summary_file(tmp_path, monkeypatch)
    code, out, err = run(monkeypatch, capsys, "verify", "topk")
    assert code == 1, out + err
    assert_whole(out, [LONG_CASE, "top_ids 2/96", "[id] off by one", "0x00000012", "1 passed, 1 failed",
                       f"topk / {LONG_CASE}"])
    text = assert_appended(summary, "verify topk")
    cases, diffs = markdown_tables(text)
    assert [row[:2] for row in cases["rows"]] == [[LONG_CASE, "FAIL"], ["b1", "pass"]]
    assert diffs["rows"][0][-1] == "[id] off by one"
    assert "1 passed, 1 failed" in text and f"failing cases: topk / {LONG_CASE}" in text

    code, out, err = run(monkeypatch, capsys, "verify", "topk", "--format", "markdown")
    assert code == 1
    cases, diffs = markdown_tables(out)
    assert len(cases["rows"]) == 2 and len(diffs["rows"]) == 1 and cases["header"] == ["case", "result", "time us",
                                                                                        "outputs"]
    assert summary.read_text().count("### `kdt verify") == 2     # every run appends, whatever the format

    code, out, err = run(monkeypatch, capsys, "verify", "topk", "--format", "json")
    assert code == 1
    document = json.loads(out)
    assert not document["passed"] and [c["case"] for c in document["cases"]] == [LONG_CASE, "b1"]
    assert "1 passed, 1 failed" in err


def test_verify_clean_run_json_and_markdown(monkeypatch, capsys, fake_gpu):
    _fake_verify(monkeypatch, failing=False)
    code, out, err = run(monkeypatch, capsys, "verify", "all", "--format", "json")
    assert code == 0 and json.loads(out)["passed"] and len(json.loads(out)["cases"]) == 2 * len(stages.names())
    code, out, err = run(monkeypatch, capsys, "verify", "all", "--format", "markdown")
    assert code == 0 and len(markdown_tables(out)) == len(stages.names())


# --- bench ----------------------------------------------------------------------------------------------

def _fake_bench(monkeypatch):
    monkeypatch.setattr(peaks, "get", lambda: peaks.Peaks("NVIDIA H200 [fake]", 4012.0, 756.0, "torch bf16"))

    def bench_shape(spec, item, machine, graph=True, baselines=True, knobs=None):
        timing = bench.Timing(12.345, 11.5, 14.25, 100)
        bound = peaks.roofline_bound(item.bytes_moved, item.flops, 12.345, machine)
        return bench.ShapeResult(spec.name, item.name, dict(item.params), item.bytes_moved, item.flops,
                                 item.size or item.bytes_moved, item.size_label, timing, timing if graph else None,
                                 12.345, 1234.5, 30.8, 1.5 if item.flops else 0.0, 0.2 if item.flops else 0.0,
                                 *bound, 12345.0, 99.0, knobs=dict(knobs or {}), path="resident-narrow", arch="sm_90",
                                 multiprocessors=132)

    monkeypatch.setattr(bench, "bench_shape", bench_shape)
    return {spec.name: [s.name for s in spec.bench_shapes(False)] for spec in stages.select(["all"])
            if spec.bench_shapes is not None}


def test_bench_all_output_whole(monkeypatch, capsys, tmp_path, fake_gpu):
    shapes = _fake_bench(monkeypatch)
    summary = summary_file(tmp_path, monkeypatch)
    code, out, err = run(monkeypatch, capsys, "bench", "all")
    assert code == 0, out + err
    names = [name for kernel in shapes.values() for name in kernel]
    assert_whole(out, names + ["graph us", "eager us", "p10-p90 us", "% copy", "TFLOP/s", "% mma", "bound us",
                               "% of bound", "CPU ref us", "x CPU", "torch us", "x torch", "resident-narrow",
                               "NVIDIA H200 [fake]"])
    text = assert_appended(summary, "bench all")
    tables = markdown_tables(text)
    assert [len(t["rows"]) for t in tables] == [len(names) for names in shapes.values()]
    assert max(names, key=len) in text


def test_bench_notes_follow_their_table(monkeypatch, capsys, fake_gpu):
    shapes = _fake_bench(monkeypatch)
    plain = bench.bench_shape
    first = shapes["topk"][0]

    def noted(spec, item, machine, **kwargs):
        result = plain(spec, item, machine, **kwargs)
        if item.name == first:
            result.notes.append("graph replay 1.84x the eager median")
        return result

    monkeypatch.setattr(bench, "bench_shape", noted)
    code, out, err = run(monkeypatch, capsys, "bench", "topk", "--sweep", "many_rows_waves=2,4")
    assert code == 0, out + err
    lines = [line for line in out.splitlines() if "1.84x the eager median" in line]
    assert [line.split(":")[0].strip() for line in lines] == [f"topk {first} 2", f"topk {first} 4"]
    assert out.index(lines[0]) > out.index(shapes["topk"][-1])   # after the table


def test_bench_markdown_json_and_a_regression(monkeypatch, capsys, tmp_path, fake_gpu):
    shapes = _fake_bench(monkeypatch)
    code, out, err = run(monkeypatch, capsys, "bench", "tree-build", "--format", "markdown")
    assert code == 0, err
    (table,) = markdown_tables(out)
    assert table["header"][:3] == ["shape", "path", "graph us"] and len(table["rows"]) == len(shapes["tree-build"])
    assert [row[0] for row in table["rows"]] == shapes["tree-build"]

    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"results": [{"kernel": "tree-build", "shape": shapes["tree-build"][0],
                                                 "headline_us": 1.0}]}))
    code, out, err = run(monkeypatch, capsys, "bench", "tree-build", "--format", "json", "--baseline", str(baseline))
    assert code == 1
    document = json.loads(out)
    assert len(document["results"]) == len(shapes["tree-build"]) and document["peaks"]["gpu"] == "NVIDIA H200 [fake]"
    assert document["regressions"] == [{"kernel": "tree-build", "shape": shapes["tree-build"][0], "baseline_us": 1.0,
                                        "now_us": 12.345}]
    assert "regression" in err


def test_bench_roofline_columns_and_the_tp8_set(monkeypatch, capsys, fake_gpu):
    """--set tp8: the deployment's shapes, the set named in the title and the JSON; every row with its roofline bound
    (max(bytes / copy, flops / matmul) at the peaks) and % of bound (bound / measured)."""
    _fake_bench(monkeypatch)
    tp8 = [s.name for s in stages.get("verify-attn").bench_set("tp8")]
    code, out, err = run(monkeypatch, capsys, "bench", "verify-attn", "--set", "tp8", "--format", "markdown")
    assert code == 0, err
    (table,) = markdown_tables(out)
    assert "kdt bench verify-attn --set tp8:" in out
    assert table["header"] == ["shape", "path", "graph us", "eager us", "p10-p90 us", "GB/s", "% copy", "TFLOP/s",
                               "% mma", "bound us", "% of bound", "CPU ref us", "x CPU", "torch us", "x torch"]
    rows = {row[0]: dict(zip(table["header"], row)) for row in table["rows"]}
    assert list(rows) == tp8
    # issue 17: G1 N8 prefix 1024 is bound by its bytes, 1,393,920 B at 4,012 GB/s; 12.345 us measured
    assert rows["G1_H8_N8_prefix1024"]["bound us"] == "0.347" and rows["G1_H8_N8_prefix1024"]["% of bound"] == "2.8"

    code, out, err = run(monkeypatch, capsys, "bench", "verify-attn", "--set", "tp8", "--quick", "--shape", "G1_*",
                         "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    assert document["set"] == "tp8"
    assert [r["shape"] for r in document["results"]] == ["G1_H8_N8_prefix1024", "G1_H8_N16_prefix8192",
                                                         "G1_H8_N16_prefix32768", "G1_H8_N64_prefix32768",
                                                         "G1_H8_N256_prefix32768"]
    first = document["results"][0]
    assert first["bound_us"] == pytest.approx(1_393_920 / 4012e3) and first["pct_of_bound"] == pytest.approx(
        100 * first["bound_us"] / 12.345)
    code, out, err = run(monkeypatch, capsys, "bench", "tree-build", "--format", "json")
    assert json.loads(out)["set"] == "default" and all(r["bound_us"] > 0 for r in json.loads(out)["results"])


@pytest.mark.parametrize("args, named", [
    (("bench", "verify-attn", "--set", "tp9"), "a bench shape set of verify-attn: default, tp8, got 'tp9'"),
    (("bench", "all", "--set", "tp8"), "a bench shape set of topk: default, wide, got 'tp8'"),
    (("plan", "verify-attn", "--set", "tp9"), "a bench shape set of verify-attn: default, tp8, got 'tp9'"),
    (("plan", "verify-attn", "--set", "tp8", "--case", "tp8_*"), "no --set with --case"),
    (("profile", "verify-attn", "--set", "tp8", "--case", "tp8_g1_n16"), "no --set with --case"),
    (("profile", "verify-attn", "--set", "tp9", "--shape", "G1_*"), "a bench shape set of verify-attn: default, tp8"),
])
def test_an_unknown_shape_set_is_bad_input_before_anything_runs(monkeypatch, capsys, args, named):
    code, out, err = run(monkeypatch, capsys, *args)
    assert code == 3 and "--set" in err and named in " ".join(err.split()), err


def test_bench_plot_hint_keeps_its_brackets(monkeypatch, capsys, fake_gpu):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    code, out, err = run(monkeypatch, capsys, "bench", "topk", "--plot", "x.png")
    assert code == 2 and paths.install_command("plot") in " ".join(err.split()), err


# --- gen-golden -----------------------------------------------------------------------------------------

def test_gen_golden_write_summary_check_and_drift(monkeypatch, capsys, tmp_path):
    import h5py

    code, out, err = run(monkeypatch, capsys, "gen-golden", "tree-accept", "--golden-dir", str(tmp_path), "--format",
                         "json")
    assert code == 0, err
    (written,) = json.loads(out)["written"]
    assert written["kernel"] == "tree-accept" and written["cases"] > 0 and Path(written["path"]).exists()

    summary = summary_file(tmp_path, monkeypatch)
    code, out, err = run(monkeypatch, capsys, "gen-golden", "tree-accept", "--check", "--golden-dir", str(tmp_path))
    assert code == 0 and "no drift" in out
    assert "no drift: tree-accept match the references bit for bit" in assert_appended(summary, "gen-golden")

    with h5py.File(tmp_path / "tree-accept.h5", "r+") as f:
        case = sorted(f.keys(), key=len)[-1]
        f[case].attrs["description"] = "changed"
        name = sorted(f[case]["expected"].keys())[0]
        f[case]["expected"][name][...] = f[case]["expected"][name][...] + 1
    summary.write_text("# an earlier step\n\nits findings")
    code, out, err = run(monkeypatch, capsys, "gen-golden", "tree-accept", "--check", "--golden-dir", str(tmp_path))
    assert code == 1
    assert_whole(out, [case, f"expected/{name}", "description or seed differ"])
    (table,) = markdown_tables(assert_appended(summary, "gen-golden"))
    assert {row[2] for row in table["rows"]} == {"attrs", f"expected/{name}"}

    code, out, err = run(monkeypatch, capsys, "gen-golden", "tree-accept", "--check", "--golden-dir", str(tmp_path),
                         "--format", "markdown")
    assert code == 1 and len(markdown_tables(out)[0]["rows"]) == 2
    code, out, err = run(monkeypatch, capsys, "gen-golden", "tree-accept", "--check", "--golden-dir", str(tmp_path),
                         "--format", "json")
    document = json.loads(out)
    assert code == 1 and not document["ok"] and {d["case"] for d in document["drifts"]} == {case}


# --- fuzz and sanitize ----------------------------------------------------------------------------------

def test_fuzz_formats(monkeypatch, capsys, tmp_path):
    from kdt.commands import common, fuzz as fuzz_command
    from tests.test_fuzz import fake_kernel, healthy, topk_bug

    monkeypatch.setattr(common, "preflight", lambda specs: None)
    monkeypatch.setattr(fuzz_command, "device_hooks", lambda graph, knobs: (fake_kernel(topk_bug), healthy))
    code, out, err = run(monkeypatch, capsys, "fuzz", "topk", "--seed", "7", "--cases", "40", "--golden-dir",
                         str(tmp_path), "--max-failures", "1", "--format", "json")
    assert code == 1, err
    document = json.loads(out)
    (failure,) = document["kernels"][0]["failures"]
    assert failure["replay"].startswith("kdt fuzz topk --seed 7 --start") and "logits" in failure["shrunk"]
    assert not document["ok"] and document["failed"] == 1

    monkeypatch.setattr(fuzz_command, "device_hooks", lambda graph, knobs: (fake_kernel(), healthy))
    code, out, err = run(monkeypatch, capsys, "fuzz", "tree-accept", "tree-build", "--cases", "3", "--golden-dir",
                         str(tmp_path), "--format", "markdown")
    assert code == 0, err
    (table,) = markdown_tables(out)
    assert [row[0] for row in table["rows"]] == ["tree-accept", "tree-build"] and "generator bugs" in table["header"]
    code, out, err = run(monkeypatch, capsys, "fuzz", "tree-accept", "--cases", "3", "--golden-dir", str(tmp_path))
    assert_whole(out, ["done (cases)", "generator bugs", "shrink runs", "3 cases, 0 failed, 0 generator bugs"])


def test_sanitize_formats_and_no_summary_from_the_verify_inside(monkeypatch, capsys, tmp_path):
    from tests.test_sanitize import INITCHECK_UNINITIALISED, MEMCHECK_CLEAN, RACECHECK_CLEAN, _command_fakes

    logs = {("tree-accept", t): (0, RACECHECK_CLEAN if t == "racecheck" else MEMCHECK_CLEAN) for t in sanitize.TOOLS}
    logs[("tree-accept", "initcheck")] = (sanitize.ERROR_EXITCODE, INITCHECK_UNINITIALISED)
    _command_fakes(monkeypatch, logs)
    fake, envs = sanitize.run_process, []
    monkeypatch.setattr(sanitize, "run_process", lambda line, timeout_s, env, cwd: envs.append(env) or
                        fake(line, timeout_s, env, cwd))
    summary = summary_file(tmp_path, monkeypatch)
    code, out, err = run(monkeypatch, capsys, "sanitize", "tree-accept", "--jobs", "1")
    assert code == 1, out + err
    assert_whole(out, ["verify inside", "Uninitialized __global__ memory read of size 4 bytes", "12 passed, 0 failed"])
    assert envs and all("GITHUB_STEP_SUMMARY" not in env for env in envs)
    assert os.environ["GITHUB_STEP_SUMMARY"] == str(summary) and "### " not in summary.read_text()

    code, out, err = run(monkeypatch, capsys, "sanitize", "tree-accept", "--jobs", "1", "--format", "markdown")
    (table,) = markdown_tables(out)
    assert code == 1 and table["header"] == ["kernel", *sanitize.TOOLS, "verify inside"] and len(table["rows"]) == 1
    assert "```text" in out and "Uninitialized __global__ memory read" in out
    code, out, err = run(monkeypatch, capsys, "sanitize", "tree-accept", "--jobs", "1", "--format", "json")
    document = json.loads(out)
    assert code == 1 and document["exit_code"] == 1 and len(document["results"]) == len(sanitize.TOOLS)
    assert [r["status"] for r in document["results"] if r["status"] != "clean"] == ["findings"]


# --- env-check, plan, pipeline --------------------------------------------------------------------------

def test_env_check_formats_and_escaped_hints(monkeypatch, capsys):
    hint = "python3 -m pip install -e '.[plot]' (the [bold] extra)"
    long_finding = "nvcc 13.0.88 at /usr/local/cuda-13.0/bin/nvcc (PATH); probe compile for sm_120 ok " * 2
    monkeypatch.setattr(envcheck, "run_checks", lambda arch, require_gpu: [
        envcheck.Check("package matplotlib", False, False, "not installed", hint),
        envcheck.Check("nvcc", True, True, long_finding.strip())])
    code, out, err = run(monkeypatch, capsys, "env-check")
    assert code == 0, err
    assert_whole(out, [hint, long_finding.strip(), "package matplotlib", "missing"])
    code, out, err = run(monkeypatch, capsys, "env-check", "--format", "markdown")
    (table,) = markdown_tables(out)
    assert table["rows"][0] == ["package matplotlib", "missing", "not installed", hint]
    code, as_json, err = run(monkeypatch, capsys, "env-check", "--json")
    code, as_format, err = run(monkeypatch, capsys, "env-check", "--format", "json")
    assert json.loads(as_json) == json.loads(as_format) and json.loads(as_json)["checks"][0]["fix"] == hint
    code, out, err = run(monkeypatch, capsys, "env-check", "--json", "--format", "markdown")
    assert code == 3 and "--json" in err
    code, out, err = run(monkeypatch, capsys, "env-check", "--format", "yaml")
    assert code == 3 and "Traceback" not in err


@pytest.mark.nvcc
def test_plan_formats(monkeypatch, capsys):
    code, out, err = run(monkeypatch, capsys, "plan", "tree-accept", "--arch", "sm_120")
    assert code == 0, err
    shapes = [s.name for s in stages.get("tree-accept").bench_shapes(False)]
    assert_whole(out, shapes + ["workspace B", "what it changes (default)"])
    code, out, err = run(monkeypatch, capsys, "plan", "tree-accept", "--arch", "sm_120", "--format", "markdown")
    plans, knobs = markdown_tables(out)
    assert [row[0] for row in plans["rows"] if row[0]] == shapes and knobs["header"][0] == "knob"
    code, out, err = run(monkeypatch, capsys, "plan", "tree-accept", "--arch", "sm_120", "--format", "json")
    document = json.loads(out)
    assert [p["name"] for p in document["plans"]] == shapes and document["arch"] == "sm_120"


@pytest.mark.nvcc
def test_plan_takes_the_bench_sets(monkeypatch, capsys):
    code, out, err = run(monkeypatch, capsys, "plan", "verify-attn", "--set", "tp8", "--arch", "sm_90a", "--sms", "132",
                         "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    assert document["set"] == "tp8" and (document["arch"], document["multiprocessors"]) == ("sm_90a", 132)
    assert document["sets"] == ["default", "tp8"]
    assert [p["name"] for p in document["plans"]] == [s.name for s in stages.get("verify-attn").bench_set("tp8")]
    code, out, err = run(monkeypatch, capsys, "plan", "verify-attn", "--set", "tp8", "--shape", "G16_*_prefix1024",
                         "--arch", "sm_90a", "--format", "markdown")
    plans, _ = markdown_tables(out)
    assert "kdt plan verify-attn --set tp8: sm_90a" in out and "verify-attn bench shape sets (--set NAME" in out
    assert [row[0] for row in plans["rows"] if row[0]] == [f"G16_H8_N{n}_prefix1024" for n in (8, 16, 64, 256)]


def test_pipeline_tables_whole(monkeypatch, capsys):
    code, out, err = run(monkeypatch, capsys, "pipeline", "--backend", "cpu", "--batch", "2", "--tokens", "8",
                         "--vocab", "512", "--budget", "15", "--depth", "4", "--topk", "4")
    assert code == 0, err
    assert_whole(out, ["kdt stages (topk + tree-build + tree-accept)", "lossless (= the target's greedy decoding)",
                       "mean accepted length (bonus excluded)"])


def test_markdown_cells_escape_what_could_open_html_and_keep_comparisons_readable():
    from kdt.console import md_escape

    assert md_escape("select where every log-prob <= 0") == "select where every log-prob <= 0"
    assert md_escape("a < b | c") == "a < b \\| c"
    for raw in ("<script>", "</b>", "<!-- x -->", "<?xml", "<https://example.com>"):
        assert not md_escape(raw).startswith("<"), raw
    assert md_escape("one\ntwo") == "one<br>two"
