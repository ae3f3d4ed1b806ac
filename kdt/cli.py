"""The `kdt` command line (Typer). Each command lives in its own module; this file only wires them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.markup import escape
from rich.table import Table

from kdt import build, envcheck, golden, runtime, stages, toolkit
from kdt.console import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_ENVIRONMENT, EXIT_OK, KdtExit, console, errors
from refs.errors import BadInput

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="kdt: write, prove and tune CUDA kernels for DDTree speculative decoding.")

KernelsArg = typer.Argument(None, help="kernels: " + ", ".join(stages.names()) + " (default: all)")


@app.command("env-check")
def env_check(arch: str = typer.Option(toolkit.DEFAULT_ARCH, help="target arch to check for"),
              as_json: bool = typer.Option(False, "--json", help="print machine-readable JSON"),
              require_gpu: bool = typer.Option(False, "--require-gpu", help="fail unless a GPU of --arch is present")):
    """Check Python packages, nvcc (with a real probe compile), CuPy and the GPUs."""
    if arch not in toolkit.SUPPORTED_ARCHES:
        raise BadInput("--arch", "one of " + ", ".join(toolkit.SUPPORTED_ARCHES), arch)
    checks = envcheck.run_checks(arch, require_gpu)
    if as_json:
        print(json.dumps(envcheck.as_json(checks), indent=2))
    else:
        table = Table(title=f"kdt env-check (target {arch})")
        for column in ("check", "status", "finding", "fix"):
            table.add_column(column, overflow="fold")
        for check in checks:
            status = "[green]ok[/]" if check.ok else ("[red]FAIL[/]" if check.required else "[yellow]missing[/]")
            table.add_row(escape(check.name), status, escape(check.finding), escape(check.fix))
        console.print(table)
    raise typer.Exit(EXIT_OK if envcheck.passed(checks) else EXIT_CHECK_FAILED)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=errors, transient=False)


@app.command("gen-golden")
def gen_golden(kernels: Optional[list[str]] = KernelsArg,
               golden_dir: Path = typer.Option(Path("golden"), "--golden-dir", help="where <kernel>.h5 live"),
               check: bool = typer.Option(False, "--check", help="regenerate in memory and report drift (exit 1)"),
               inputs: Optional[Path] = typer.Option(None, "--inputs", help="an inputs-only file captured from an engine"),
               out: Optional[Path] = typer.Option(None, "--out", help="with --inputs: the golden file to write")):
    """Generate the golden HDF5 files from the references (deterministic, atomic)."""
    if inputs is not None or out is not None:
        raise typer.Exit(_golden_from_inputs(kernels, inputs, out))
    specs = stages.select(kernels)
    fresh = {}
    with _progress() as progress:
        for spec in specs:
            task = progress.add_task(f"{spec.name}: cases", total=None)
            cases = spec.make_cases()
            progress.update(task, total=len(cases), description=f"{spec.name}: reference")
            fresh[spec.name] = golden.expected_for(spec, cases, lambda: progress.advance(task))
            if not check:
                golden.write(golden.default_path(golden_dir, spec.name), spec, fresh[spec.name])
    if not check:
        for spec in specs:
            path = golden.default_path(golden_dir, spec.name)
            console.print(f"wrote {path} ({len(fresh[spec.name])} cases, {path.stat().st_size / 1e6:.1f} MB)")
        raise typer.Exit(EXIT_OK)
    drifts = [d for spec in specs for d in golden.drift(spec, golden.default_path(golden_dir, spec.name), fresh[spec.name])]
    if not drifts:
        console.print(f"[green]no drift[/]: {', '.join(s.name for s in specs)} match the references bit for bit")
        raise typer.Exit(EXIT_OK)
    table = Table(title="golden drift")
    for column in ("kernel", "case", "item", "detail"):
        table.add_column(column, overflow="fold")
    for d in drifts:
        table.add_row(*(escape(text) for text in (d.kernel, d.case, d.item, d.detail)))
    console.print(table)
    raise typer.Exit(EXIT_CHECK_FAILED)


def _golden_from_inputs(kernels: Optional[list[str]], inputs: Optional[Path], out: Optional[Path]) -> int:
    if inputs is None or out is None:
        raise BadInput("--inputs/--out", "both, together", f"--inputs={inputs} --out={out}")
    captured = golden.read(inputs, expect_outputs=False)
    if kernels and kernels != [captured.kernel]:
        raise BadInput("KERNEL", f"the file's own kernel {captured.kernel!r} (or none)", kernels)
    spec = stages.get(captured.kernel)
    from kdt.dtypes import name as dtype_name

    for item in captured.cases:  # a missing input or parameter, a wrong dtype or rank: named, before the reference
        case = item.case
        try:
            spec.check_layout({key: tuple(a.shape) for key, a in case.inputs.items()},
                              {key: dtype_name(a.dtype) for key, a in case.inputs.items()}, dict(case.params))
        except BadInput as error:
            raise BadInput(f"{inputs} case {case.name!r}: {error.argument}", error.expected, error.actual) from None
    with _progress() as progress:
        task = progress.add_task(f"{spec.name}: reference", total=len(captured.cases))
        computed = golden.expected_for(spec, [item.case for item in captured.cases], lambda: progress.advance(task))
    golden.write(out, spec, computed)
    console.print(f"wrote {out} ({len(computed)} cases from {inputs})")
    return EXIT_OK


def _arches(arch: Optional[list[str]]) -> list[str]:
    if not arch:
        found = runtime.default_arches()
        for item in found:
            if item not in toolkit.SUPPORTED_ARCHES:
                raise runtime.GpuMissing(f"this GPU is {item}; kdt builds its kernels for "
                                         f"{', '.join(toolkit.SUPPORTED_ARCHES)} only (--arch builds for another)")
        return found
    for item in arch:
        if item not in toolkit.SUPPORTED_ARCHES:
            raise BadInput("--arch", "one of " + ", ".join(toolkit.SUPPORTED_ARCHES), item)
    return arch


def _build_table(results: list[build.BuildResult]) -> Table:
    table = Table(title="kdt build: resources per kernel function (ptxas)")
    for column in ("kernel", "arch", "function", "registers", "smem B", "stack B", "spill st/ld B", "cache"):
        table.add_column(column, justify="right" if column.endswith(("B", "registers")) else "left")
    for result in results:
        for r in result.resources or [None]:
            if r is None:
                table.add_row(result.kernel, result.arch, "-", "", "", "", "", "hit" if result.cached else "built")
                continue
            spill = f"{r.spill_store_bytes}/{r.spill_load_bytes}"
            table.add_row(result.kernel, result.arch, r.function, str(r.registers), str(r.shared_bytes),
                          str(r.stack_bytes), f"[red]{spill}[/]" if r.spill_store_bytes else spill,
                          "hit" if result.cached else "built")
    return table


ArchOption = typer.Option(None, "--arch", help="target arch, repeatable (default: the GPU's, else sm_120)")


@app.command("build")
def build_command(kernels: Optional[list[str]] = KernelsArg, arch: Optional[list[str]] = ArchOption,
                  force: bool = typer.Option(False, "--force", help="ignore the cache")):
    """Compile kernels to cubins with nvcc (cached; warnings are errors) and show their resources."""
    specs, arches = stages.select(kernels), _arches(arch)
    results = [build.build(spec, target, force=force) for spec in specs for target in arches]
    console.print(_build_table(results))


def _print_failures(result) -> None:
    if result.error:
        console.print(f"  [red]{escape(result.error)}[/]")
        return
    for field_result in result.fields:
        if field_result.ok or not field_result.diffs:
            continue
        table = Table(title=f"{result.kernel} / {result.case}: {field_result.name} "
                            f"({field_result.mismatches} of {field_result.checked} mismatch) {field_result.worst}")
        for column in ("index", "expected", "got", "expected bits", "got bits", "ulp / note"):
            table.add_column(column)
        for d in field_result.diffs:
            table.add_row(str(tuple(d.index)), repr(d.expected), repr(d.got), d.expected_bits, d.got_bits,
                          d.note or ("" if d.ulp is None else str(d.ulp)))
        console.print(table)


@app.command("verify")
def verify_command(kernels: list[str] = typer.Argument(..., help="a kernel name or 'all'"),
                   golden_file: Optional[Path] = typer.Option(None, "--golden", help="default golden/<kernel>.h5"),
                   case: Optional[str] = typer.Option(None, "--case", help="only cases matching this glob"),
                   arch: Optional[list[str]] = ArchOption,
                   max_diffs: int = typer.Option(10, "--max-diffs", min=0, help="mismatches shown per output"),
                   json_file: Optional[Path] = typer.Option(None, "--json", help="write the results as JSON"),
                   junit_file: Optional[Path] = typer.Option(None, "--junit", help="write JUnit XML"),
                   graph: bool = typer.Option(False, "--graph", help="capture each launch in a CUDA graph, replay it"),
                   regressions: bool = typer.Option(False, "--regressions",
                                                    help="also run golden/regressions/<kernel>.h5 (found by kdt fuzz)")):
    """Run kernels on the GPU against the golden files, outputs poisoned; bit-exact diffs of any mismatch."""
    from kdt import fuzz, report, verify

    specs = stages.select(kernels)
    if golden_file is not None and len(specs) != 1:
        raise BadInput("--golden", "a single kernel to go with it", [s.name for s in specs])
    runtime.cupy()  # no GPU: exit 2 before building anything
    for target in _arches(arch):
        for spec in specs:
            build.build(spec, target)
    results = []
    for spec in specs:
        paths = [golden_file or golden.default_path("golden", spec.name)]
        if regressions and golden_file is None and fuzz.regressions_path(spec.name).exists():
            paths.append(fuzz.regressions_path(spec.name))
        for path in paths:
            table = Table(title=f"kdt verify {spec.name} ({path})")
            for column in ("case", "result", "time us", "outputs"):
                table.add_column(column)
            cases = verify.verify_file(spec, path, case, max_diffs, graph)
            if not cases and path == paths[0]:
                raise BadInput("--case", f"a pattern matching a case in {path}", case)
            for r in cases:
                detail = r.error or ", ".join(f"{f.name} {f.mismatches}/{f.checked}" if not f.ok else f.name
                                              for f in r.fields)
                table.add_row(r.case, "[green]pass[/]" if r.passed else "[red]FAIL[/]",
                              "" if r.time_us is None else f"{r.time_us:.1f}", escape(detail))
            console.print(table)
            for r in cases:
                if not r.passed:
                    _print_failures(r)
            results.extend(cases)
    failed = [r for r in results if not r.passed]
    console.print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    if json_file:
        report.write_atomically(json_file, report.verify_json(results))
    if junit_file:
        report.write_atomically(junit_file, report.verify_junit(results))
    raise typer.Exit(EXIT_CHECK_FAILED if failed else EXIT_OK)


@app.command("bench")
def bench_command(kernels: list[str] = typer.Argument(..., help="a kernel name or 'all'"),
                  quick: bool = typer.Option(False, "--quick", help="only the headline shapes"),
                  shape: Optional[str] = typer.Option(None, "--shape", help="only shapes matching this glob"),
                  json_file: Optional[Path] = typer.Option(None, "--json", help="write the results as JSON"),
                  baseline: Optional[Path] = typer.Option(None, "--baseline", help="an earlier --json to compare with"),
                  max_regression: float = typer.Option(10.0, "--max-regression", min=0,
                                                       help="with --baseline: exit 1 if a shape is slower by more than PCT"),
                  plot_file: Optional[Path] = typer.Option(None, "--plot", help="draw time against size to FILE.png"),
                  no_graph: bool = typer.Option(False, "--no-graph", help="eager launches only"),
                  no_baselines: bool = typer.Option(False, "--no-baselines", help="skip the CPU and PyTorch baselines")):
    """Time kernels (CUDA events, graph mode, rotated inputs) against the machine's measured peaks."""
    import fnmatch

    from kdt import bench, peaks, report

    specs = stages.select(kernels)
    before = None
    if baseline is not None:
        try:
            before = json.loads(baseline.read_text())
        except (OSError, ValueError) as error:
            raise BadInput("--baseline", "a JSON file written by kdt bench --json", f"{baseline} ({error})") from None
    if plot_file is not None:
        if importlib.util.find_spec("matplotlib") is None:
            raise KdtExit(EXIT_ENVIRONMENT, "--plot needs matplotlib: python3 -m pip install -e '.[plot]'")
    runtime.cupy()
    for spec in specs:
        build.build(spec, runtime.device_arch())
    machine = peaks.get()
    console.print(f"peaks on {machine.gpu}: copy {machine.copy_gbps:,.0f} GB/s, matmul {machine.matmul_tflops:,.0f} "
                  f"TFLOP/s ({machine.matmul_how})")
    results = []
    for spec in specs:
        if spec.bench_shapes is None:
            console.print(f"{spec.name}: no benchmark shapes defined")
            continue
        chosen = [s for s in spec.bench_shapes(quick) if shape is None or fnmatch.fnmatch(s.name, shape)]
        table = Table(title=f"kdt bench {spec.name}: us per launch (graph mode is the headline)")
        for column in ("shape", "graph us", "eager us", "p10-p90 us", "GB/s", "% copy", "TFLOP/s", "% mma",
                       "CPU ref us", "x CPU", "torch us", "x torch"):
            table.add_column(column, justify="left" if column == "shape" else "right")
        for item in chosen:
            r = bench.bench_shape(spec, item, machine, graph=not no_graph, baselines=not no_baselines)
            results.append(r)
            spread = r.graph or r.eager
            table.add_row(r.shape, f"{r.graph.median_us:.2f}" if r.graph else "-", f"{r.eager.median_us:.2f}",
                          f"{spread.p10_us:.2f}-{spread.p90_us:.2f}", f"{r.gbps:,.0f}", f"{r.pct_copy_peak:.1f}",
                          f"{r.tflops:.1f}" if r.flops else "-", f"{r.pct_matmul_peak:.1f}" if r.flops else "-",
                          f"{r.cpu_reference_us:,.0f}" if r.cpu_reference_us else "-",
                          f"{r.cpu_reference_us / r.headline_us:,.0f}" if r.cpu_reference_us else "-",
                          f"{r.torch_us:.2f}" if r.torch_us else "-",
                          f"{r.torch_us / r.headline_us:.1f}" if r.torch_us else "-")
        console.print(table)
    if json_file:
        report.write_atomically(json_file, bench.results_json(results, machine))
    if plot_file:
        bench.plot(results, plot_file)
    if before is not None:
        slower = bench.regressions(results, before, max_regression)
        for kernel, name, old, new in slower:
            console.print(f"[red]regression[/] {kernel} {name}: {old:.2f} us -> {new:.2f} us (+{100 * (new / old - 1):.0f}%)")
        if slower:
            raise typer.Exit(EXIT_CHECK_FAILED)
        console.print(f"no shape slower than the baseline by more than {max_regression:g}%")
    raise typer.Exit(EXIT_OK)


@app.command("pipeline")
def pipeline_command(batch: int = typer.Option(8, "--batch", help="requests decoded together (G)"),
                     budget: int = typer.Option(63, "--budget", help="tree nodes per request and step, root excluded (B)"),
                     depth: int = typer.Option(8, "--depth", help="draft positions per step (K)"),
                     topk: int = typer.Option(8, "--topk", help="candidates kept per position (V)"),
                     tokens: int = typer.Option(128, "--tokens", help="tokens to generate per request"),
                     seed: int = typer.Option(0, "--seed", help="seeds the models, the prompts and the drafter"),
                     backend: str = typer.Option("gpu", "--backend", help="gpu (kdt kernels in a CUDA graph) or cpu (the references)"),
                     draft_quality: float = typer.Option(0.8, "--draft-quality",
                                                         help="0..1: how often the drafter's top guess is the target's token"),
                     vocab: int = typer.Option(4096, "--vocab", help="vocabulary of the target and the drafter"),
                     json_file: Optional[Path] = typer.Option(None, "--json", help="write every number as JSON")):
    """DDTree speculative decoding end to end on a synthetic target/drafter pair; exit 1 unless lossless."""
    from kdt import pipeline

    config = pipeline.PipelineConfig(batch=batch, budget=budget, depth=depth, topk=topk, tokens=tokens, seed=seed,
                                     backend=backend, draft_quality=draft_quality, vocab=vocab)
    raise typer.Exit(pipeline.command(config, json_file))


from kdt.cli_stress import fuzz_command, sanitize_command  # noqa: E402  (they use the helpers above)

app.command("fuzz")(fuzz_command)
app.command("sanitize")(sanitize_command)


def _is_usage_error(error: Exception) -> bool:
    """Click's usage errors, whether from click itself or the copy newer Typer releases vendor."""
    return hasattr(error, "show") and hasattr(error, "exit_code") and hasattr(error, "format_message")


def main() -> None:
    """Entry point: user mistakes end with a clear message and their exit code, never a traceback."""
    try:
        code = app(standalone_mode=False)
    except typer.Exit as done:
        code = done.exit_code
    except typer.Abort:
        errors.print("aborted")
        code = EXIT_BAD_INPUT
    except (BadInput, stages.UnknownStage) as error:
        errors.print(f"[red]error:[/] {escape(str(error))}")
        code = EXIT_BAD_INPUT
    except golden.GoldenError as error:
        errors.print(f"[red]golden file error:[/] {escape(str(error))}")
        code = EXIT_CHECK_FAILED
    except KdtExit as error:
        errors.print(error.message)
        code = error.code
    except build.BuildError as error:
        errors.print(f"[red]compile error[/] in {error.kernel} for {error.arch}:\n{escape(error.log)}")
        code = EXIT_ENVIRONMENT
    except (toolkit.ToolkitMissing, runtime.GpuMissing) as error:
        errors.print(f"[red]cannot run here:[/] {escape(str(error))}")
        code = EXIT_ENVIRONMENT
    except OSError as error:  # a read-only directory, a full disk: the file system said no
        errors.print(f"[red]file system error:[/] {escape(str(error))}")
        code = EXIT_ENVIRONMENT
    except Exception as error:
        if not _is_usage_error(error):
            raise
        error.show()
        code = EXIT_BAD_INPUT
    sys.exit(code or 0)
