"""`kdt bench`: time kernels the way engines run them.

Per shape: CUDA events around each launch after warm-up, median and spread of at least 100 runs, inputs
rotated over enough copies that the L2 cache cannot hold them all; and a graph mode that captures
GRAPH_LAUNCHES launches in one CUDA graph and times its replays (engines run these stages in graphs, where
launch gaps vanish: graph mode is the headline). Achieved GB/s and TFLOP/s come from each shape's byte
and flop model and are set against the peaks measured on this machine (kdt.peaks), and so is the roofline bound:
the least time the model allows there, and the measured time's distance from it. Baselines in the same run: the
CPU reference, and the obvious PyTorch version where PyTorch is installed. The SM clock is read while a shape is
timed (kdt.clocks), and a note says where the board's power or thermal limit held it down.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from kdt import clocks, ops, runtime, verify
from kdt.peaks import roofline_bound
from kdt.spec import DEFAULT_BENCH_SET, StageSpec

MIN_RUNS = 100
WARMUP = 10
GRAPH_LAUNCHES = 20
GRAPH_BELOW_US = 200.0             # graph mode only where launch gaps could matter: kernels under this
PROBE_REPLAYS = 5                  # replays of a one-launch graph that measure a kernel's own time
GRAPH_SUSPECT_RATIO = 1.25         # a graph replay this much slower than eager launches: the machine, not the kernel
L2_ROTATE_BYTES = 2 * 60 * 2**20   # rotate buffers until twice the H200's 60 MB L2 is covered
MAX_ROTATE = 16
CPU_REPEATS = 3
BASELINE_RUNS = 20                 # PyTorch baselines can take tens of milliseconds a call


@dataclass(frozen=True)
class BenchShape:
    """One benchmark size: how to make its inputs on the GPU, its parameters, and its cost model."""

    name: str
    make_inputs: Callable[[object], dict]   # (cupy) -> device inputs (CuPy arrays, ops.Bf16)
    params: dict
    layout: dict                             # input name -> (shape, dtype name): what a launch plan needs
    bytes_moved: int                         # the fewest bytes the stage must move through device memory
    flops: int = 0
    cpu_baseline: bool = True                # run the reference on the CPU as a baseline (small shapes only)
    size: int = 0                            # x axis of the plot (defaults to bytes_moved)
    size_label: str = "bytes moved (model)"  # what `size` counts


@dataclass
class Timing:
    median_us: float
    p10_us: float
    p90_us: float
    runs: int


@dataclass
class ShapeResult:
    kernel: str
    shape: str
    params: dict
    bytes_moved: int
    flops: int
    size: int
    size_label: str
    eager: Timing
    graph: Timing | None
    headline_us: float
    gbps: float
    pct_copy_peak: float
    tflops: float
    pct_matmul_peak: float
    bound_us: float                             # the roofline: max(bytes / copy, flops / matmul) at the peaks
    pct_of_bound: float                         # 100 * bound / headline: 100 is at the roofline
    cpu_reference_us: float | None = None
    torch_us: float | None = None
    notes: list[str] = field(default_factory=list)
    knobs: dict = field(default_factory=dict)   # the launch knobs set for this run (a sweep's point)
    path: str = ""                              # the launch plan's path
    arch: str = ""                              # the cubins that ran (sm_90a, sm_120-emu, ...)
    multiprocessors: int = 0                    # the SM count the plan was made for
    sm_clock: clocks.ClockReport | None = None  # the SM clock while timed (None without nvidia-ml-py / NVML)


def _summary(samples_us: list[float]) -> Timing:
    ordered = sorted(samples_us)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return Timing(statistics.median(ordered), pick(0.1), pick(0.9), len(ordered))


def _nbytes(value) -> int:
    return int(verify.raw(value).nbytes)


def _event_us(cp, stream, step: Callable[[int], None], count: int) -> list[float]:
    """step(0), ..., step(count - 1), each between two events recorded on `stream`: microseconds each."""
    events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(count)]
    for i, (start, stop) in enumerate(events):
        start.record(stream)
        step(i)
        stop.record(stream)
    events[-1][1].synchronize()
    return [cp.cuda.get_elapsed_time(a, b) * 1000.0 for a, b in events]


def time_eager(cp, launch: Callable[[int], None], rotate: int, runs: int = MIN_RUNS) -> Timing:
    for i in range(min(WARMUP, runs)):
        launch(i % rotate)
    return _summary(_event_us(cp, cp.cuda.get_current_stream(), lambda i: launch(i % rotate), runs))


def _captured(cp, launch: Callable[[int], None], launches: int, rotate: int):
    """A non-blocking stream and a CUDA graph of `launches` launches captured on it (inputs rotated), after one
    launch outside capture (module and workspace ready)."""
    cp.cuda.Device().synchronize()  # inputs were made on the default stream, which this one does not wait for
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        launch(0)
        stream.synchronize()
        stream.begin_capture()
        for i in range(launches):
            launch(i % rotate)
        return stream, stream.end_capture()


def kernel_us(cp, launch: Callable[[int], None]) -> float:
    """A kernel's own time, without the host's launch overhead: the fastest of PROBE_REPLAYS replays of one
    launch captured in a graph. Eager event timing counts the host's submission gap when the host is slower
    than the kernel (a busy host made 20-us kernels read 280 us), so it must not decide on graph mode."""
    stream, graph = _captured(cp, launch, 1, 1)
    graph.launch(stream)
    return min(_event_us(cp, stream, lambda _: graph.launch(stream), PROBE_REPLAYS))


def time_graph(cp, launch: Callable[[int], None], rotate: int, runs: int = MIN_RUNS) -> Timing:
    stream, graph = _captured(cp, launch, GRAPH_LAUNCHES, rotate)
    for _ in range(3):
        graph.launch(stream)
    return _summary([us / GRAPH_LAUNCHES for us in _event_us(cp, stream, lambda _: graph.launch(stream), runs)])


def graph_note(eager: Timing, graphed: Timing | None) -> str | None:
    """A warning where the graph replay's median is GRAPH_SUSPECT_RATIO or more times the eager one. Replays drop the
    launch gaps, so they are never slower on a steady GPU: the headline of such a row measures the machine (seen
    once: plans/perf-notes.md, eighteenth session)."""
    if graphed is None or graphed.median_us < GRAPH_SUSPECT_RATIO * eager.median_us:
        return None
    return (f"graph replay {graphed.median_us / eager.median_us:.2f}x the eager median ({graphed.median_us:.2f} "
            f"against {eager.median_us:.2f} us): the GPU ran slower under sustained replay (clocks, power?); "
            f"this headline is the machine's, not the kernel's")


def bench_shape(spec: StageSpec, shape: BenchShape, peaks, graph: bool = True, baselines: bool = True,
                knobs: dict | None = None) -> ShapeResult:
    """Time one shape (with the launch `knobs`, if any); its buffers (gigabytes for long prefixes) go back to the
    driver before the next."""
    try:
        return _bench_shape(spec, shape, peaks, graph, baselines, dict(knobs or {}))
    finally:
        runtime.cupy().get_default_memory_pool().free_all_blocks()


@dataclass
class _Buffers:
    """One shape's device buffers: `rotate` copies of its inputs (together more than the L2 holds), one set of
    outputs, the workspace."""

    input_sets: list[dict]
    params: dict
    outputs: dict
    workspace: object

    @property
    def rotate(self) -> int:
        return len(self.input_sets)

    def launcher(self, spec: StageSpec, knobs: dict, kernels_dir=None) -> Callable[[int], None]:
        """launch(i): one call on input set i (with the kernels built from `kernels_dir`, if given)."""
        def launch(i: int) -> None:
            with runtime.sources(kernels_dir) if kernels_dir is not None else contextlib.nullcontext():
                ops.run(spec, self.input_sets[i], self.params, out=self.outputs, workspace=self.workspace, knobs=knobs)
        return launch


def _buffers(cp, spec: StageSpec, shape: BenchShape, knobs: dict) -> _Buffers:
    first = shape.make_inputs(cp)
    set_bytes = sum(_nbytes(v) for v in first.values())
    rotate = max(1, min(MAX_ROTATE, math.ceil(L2_ROTATE_BYTES / max(set_bytes, 1))))
    params = dict(shape.params)
    return _Buffers([first] + [{k: _copy(cp, v) for k, v in first.items()} for _ in range(rotate - 1)], params,
                    verify.allocate_outputs(spec, first, params), ops.workspace_for(spec, first, params, knobs=knobs))


def _bench_shape(spec: StageSpec, shape: BenchShape, peaks, graph: bool, baselines: bool, knobs: dict) -> ShapeResult:
    cp = runtime.cupy()
    buffers = _buffers(cp, spec, shape, knobs)
    first, params, rotate = buffers.input_sets[0], buffers.params, buffers.rotate
    path = ops.plan(spec, first, params, knobs=knobs).path
    launch = buffers.launcher(spec, knobs)

    with clocks.ClockMonitor(cp.cuda.Device().pci_bus_id) as monitor:
        eager = time_eager(cp, launch, rotate)
        small = graph and (eager.median_us < GRAPH_BELOW_US or kernel_us(cp, launch) < GRAPH_BELOW_US)
        graphed = time_graph(cp, launch, rotate) if small else None
    headline = (graphed or eager).median_us
    gbps = shape.bytes_moved / headline / 1e3
    tflops = shape.flops / headline / 1e6 if shape.flops else 0.0
    bound_us, pct_of_bound = roofline_bound(shape.bytes_moved, shape.flops, headline, peaks)
    result = ShapeResult(spec.name, shape.name, params, shape.bytes_moved, shape.flops, shape.size or shape.bytes_moved,
                         shape.size_label if shape.size else "bytes moved (model)", eager, graphed, headline, gbps, 100 * gbps / peaks.copy_gbps, tflops,
                         100 * tflops / peaks.matmul_tflops if shape.flops else 0.0, bound_us, pct_of_bound,
                         knobs=knobs, path=path, arch=runtime.device_arch(), multiprocessors=runtime.multiprocessors(),
                         sm_clock=monitor.report)
    for note in (graph_note(eager, graphed), monitor.report.note() if monitor.report else None):
        if note:
            result.notes.append(note)
    if baselines and shape.cpu_baseline:
        host = {k: verify.download(v) for k, v in first.items()}
        spec.reference(host, params)  # warm: first call pays imports
        samples = []
        for _ in range(CPU_REPEATS):
            started = time.perf_counter()
            spec.reference(host, params)
            samples.append((time.perf_counter() - started) * 1e6)
        result.cpu_reference_us = statistics.median(samples)
    if baselines and spec.torch_baseline is not None:
        if importlib.util.find_spec("torch") is None:
            result.notes.append("PyTorch not installed: no PyTorch baseline")
        else:
            try:
                run_torch = spec.torch_baseline(first, params)
                if run_torch is not None:
                    result.torch_us = time_eager(cp, lambda i: run_torch(), 1, BASELINE_RUNS).median_us
            except (RuntimeError, MemoryError) as error:  # e.g. out of memory at the largest shapes: one cell lost
                first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
                result.notes.append(f"PyTorch baseline failed ({first_line[:120]}): no PyTorch column")
    return result


@dataclass
class Comparison:
    """One shape timed with kdt's kernels and with another build's (kdt bench --against), interleaved in rounds
    on the same inputs: ratio = ours / theirs (below 1: ours is faster), per round, summarised."""

    kernel: str
    shape: str
    against: str
    mode: str                      # "graph" (replays of GRAPH_LAUNCHES launches) or "eager"
    ours: Timing
    theirs: Timing
    ratio: float                   # median over rounds of (our round median / their round median)
    ratio_p10: float
    ratio_p90: float
    rounds: int
    path: str = ""


COMPARE_ROUNDS = 12                # alternating rounds: drift of the GPU's clocks hits both builds alike
COMPARE_RUNS = 20                  # timed runs per build and round


def compare_shape(spec: StageSpec, shape: BenchShape, against: "Path", label: str, graph: bool = True,
                  knobs: dict | None = None, rounds: int = COMPARE_ROUNDS) -> Comparison:
    """Time `shape` with the current build and with the kernels built from the sources in `against`, alternating
    round by round on the same inputs and outputs."""
    try:
        return _compare_shape(spec, shape, against, label, graph, dict(knobs or {}), rounds)
    finally:
        runtime.cupy().get_default_memory_pool().free_all_blocks()


def _workspace_for_both(spec: StageSpec, buffers: _Buffers, knobs: dict, against) -> object:
    """The scratch for both builds of a comparison: the other build's plan may split differently (its cubins export
    other constants) and need more than this build's, which ops.run would refuse as too small."""
    with runtime.sources(against):
        theirs = ops.workspace_for(spec, buffers.input_sets[0], buffers.params, knobs=knobs)
    ours = buffers.workspace
    return theirs if ours is None or (theirs is not None and theirs.nbytes > ours.nbytes) else ours


def _compare_shape(spec, shape, against, label, graph, knobs, rounds) -> Comparison:
    cp = runtime.cupy()
    buffers = _buffers(cp, spec, shape, knobs)
    buffers.workspace = _workspace_for_both(spec, buffers, knobs, against)
    rotate = buffers.rotate
    builds = {"ours": None, "theirs": against}
    launches = {name: buffers.launcher(spec, knobs, where) for name, where in builds.items()}
    small = graph and all(kernel_us(cp, launch) < GRAPH_BELOW_US for launch in launches.values())
    if small:
        captured = {name: _captured(cp, launch, GRAPH_LAUNCHES, rotate) for name, launch in launches.items()}
        step = {name: (lambda s, g: lambda _: g.launch(s))(*captured[name]) for name in builds}
        streams = {name: captured[name][0] for name in builds}
        scale = GRAPH_LAUNCHES
    else:
        for launch in launches.values():
            for i in range(WARMUP):
                launch(i % rotate)
        step = {name: (lambda launch: lambda i: launch(i % rotate))(launch) for name, launch in launches.items()}
        streams = {name: cp.cuda.get_current_stream() for name in builds}
        scale = 1
    samples = {name: [] for name in builds}
    ratios = []
    for _ in range(rounds):
        medians = {}
        for name in builds:
            times = [us / scale for us in _event_us(cp, streams[name], step[name], COMPARE_RUNS)]
            samples[name] += times
            medians[name] = statistics.median(times)
        ratios.append(medians["ours"] / medians["theirs"])
    spread = _summary(ratios)
    path = ops.plan(spec, buffers.input_sets[0], buffers.params, knobs=knobs).path
    return Comparison(spec.name, shape.name, label, "graph" if small else "eager", _summary(samples["ours"]),
                      _summary(samples["theirs"]), spread.median_us, spread.p10_us, spread.p90_us, rounds, path)


def sources_of(revision: str, repository: "Path", into: "Path") -> "Path":
    """The kernel sources to compare with: a directory (its kernels/ folder, or itself), or a git revision of
    `repository` exported into `into` (git archive REV kernels). BadInput naming --against otherwise."""
    from pathlib import Path

    from kdt.refs.errors import BadInput
    from kdt.tree_compare import export_revision

    given = Path(revision)
    if given.is_dir():
        found = given / "kernels" if (given / "kernels").is_dir() else given
        if not any(found.glob("*.cu")):
            raise BadInput("--against", "a git revision, or a directory of kernel sources (*.cu)", revision)
        return found
    export_revision(repository, revision, into, "kernels",
                    expected=f"a git revision of {repository} that has kernels/, or a directory of sources")
    return into / "kernels"


def _copy(cp, value):
    return ops.Bf16(value.bits.copy()) if isinstance(value, ops.Bf16) else value.copy()


def results_json(results: list[ShapeResult], peaks, shape_set: str = DEFAULT_BENCH_SET) -> str:
    """--json: the peaks, the shape set (--set) and every result."""
    return json.dumps({"peaks": asdict(peaks), "set": shape_set, "results": [asdict(r) for r in results]}, indent=2)


def regressions(results: list[ShapeResult], baseline: dict, max_regression_pct: float) -> list[tuple[str, str, float, float]]:
    """(kernel, shape, baseline us, now us) for every shape slower than the baseline by more than PCT."""
    before = {}
    for r in baseline.get("results", []):   # by arch where the baseline says which (older files do not)
        key = (r["kernel"], r["shape"], _knob_key(r.get("knobs", {})))
        before[(*key, r.get("arch"))] = r["headline_us"]
        before.setdefault((*key, None), r["headline_us"])
    slower = []
    for r in results:
        key = (r.kernel, r.shape, _knob_key(r.knobs))
        old = before.get((*key, r.arch), before.get((*key, None)))
        if old is not None and r.headline_us > old * (1 + max_regression_pct / 100):
            slower.append((r.kernel, r.shape, old, r.headline_us))
    return slower


def _knob_key(knobs: dict) -> str:
    return ",".join(f"{name}={value}" for name, value in sorted(knobs.items()))


def plot(results: list[ShapeResult], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernels = list(dict.fromkeys(r.kernel for r in results))
    figure, axes = plt.subplots(1, len(kernels), figsize=(5 * len(kernels), 4), squeeze=False)
    for axis, kernel in zip(axes[0], kernels):
        mine = sorted((r for r in results if r.kernel == kernel), key=lambda r: r.size)
        axis.loglog([r.size for r in mine], [r.headline_us for r in mine], "o-", label="kdt (graph mode under 200 us)")
        if any(r.cpu_reference_us for r in mine):
            axis.loglog([r.size for r in mine if r.cpu_reference_us], [r.cpu_reference_us for r in mine if r.cpu_reference_us],
                        "s--", label="CPU reference")
        if any(r.torch_us for r in mine):
            axis.loglog([r.size for r in mine if r.torch_us], [r.torch_us for r in mine if r.torch_us], "^--", label="PyTorch")
        axis.set_title(kernel)
        axis.set_xlabel(mine[0].size_label if mine else "")
        axis.set_ylabel("time per launch (us)")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def device_bf16(cp, values) -> "ops.Bf16":
    """float32 CuPy array -> bf16 bits, round to nearest even (finite inputs), as ml_dtypes does on the host."""
    bits = cp.ascontiguousarray(values, dtype=cp.float32).view(cp.uint32)
    rounded = (bits + cp.uint32(0x7FFF) + ((bits >> cp.uint32(16)) & cp.uint32(1))) >> cp.uint32(16)
    return ops.Bf16(rounded.astype(cp.uint16))


def upload_host(cp, arrays: dict) -> dict:
    return verify.upload(arrays)
