"""`kdt verify`: run a kernel on every golden case through `kdt.ops`, outputs poisoned, and compare as the
contract says.

Each case is launched twice, the outputs filled first with one poison pattern and then with another (all
NaN for floats; 0xDEADBEEF-like for integers): an element the kernel does not write keeps the pattern, and
since no value equals both patterns, a skipped element fails at least one of the two runs.
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kdt import build, golden, ops, runtime, toolkit
from kdt.compare import FieldResult
from kdt.dtypes import BF16
from kdt.spec import StageSpec

# Two byte patterns per element width; each is a NaN for floats of that width and an implausible integer.
POISON_PATTERNS = {
    2: (0x7FDB, 0xFFBD),
    4: (0x7FDEADBE, 0xFFBADF00),
    8: (0x7FFDEADBEEFBAD00, 0xFFF0BAD0F00DBAD1),
}


@dataclass
class CaseResult:
    kernel: str
    case: str
    description: str
    passed: bool
    time_us: float | None
    fields: list[FieldResult] = field(default_factory=list)
    error: str | None = None


def poison(array, pattern_index: int) -> None:
    """Fill a CuPy array with the pattern for its element width."""
    cp = runtime.cupy()
    width = array.dtype.itemsize
    bits = {2: cp.uint16, 4: cp.uint32, 8: cp.uint64}[width]
    array.view(bits).fill(POISON_PATTERNS[width][pattern_index])


def upload(inputs: dict[str, np.ndarray]) -> dict:
    """Host arrays to the GPU; bf16 as `ops.Bf16` around its uint16 bits."""
    cp = runtime.cupy()
    device = {}
    for name, array in inputs.items():
        if array.dtype == BF16:
            device[name] = ops.Bf16(cp.asarray(array.view(np.uint16)))
        else:
            device[name] = cp.asarray(array)
    return device


def download(array) -> np.ndarray:
    if isinstance(array, ops.Bf16):
        return array.bits.get().view(BF16)
    return array.get()


def allocate_outputs(spec: StageSpec, device_inputs: dict, params: dict) -> dict:
    """Outputs for one launch, as `ops.run` would make them (bf16 as Bf16)."""
    cp = runtime.cupy()
    shapes = {name: tuple(value.shape) for name, value in device_inputs.items()}
    layout = spec.output_layout(shapes, params)
    out = {}
    for name, want in layout.items():
        if want.dtype == "bfloat16":
            out[name] = ops.Bf16(cp.empty(want.shape, cp.uint16))
        else:
            out[name] = cp.empty(want.shape, np.dtype(want.dtype))
    return out


def raw(array):
    return array.bits if isinstance(array, ops.Bf16) else array


def launch_timed(spec: StageSpec, device_inputs: dict, params: dict, outputs: dict, graph: bool,
                 knobs: dict | None = None) -> float:
    """One launch (or one replay of a graph that holds it); returns the GPU time in microseconds.

    The launch runs on its own non-blocking stream, which does not wait for the legacy default stream
    where the inputs were uploaded and the outputs poisoned: so the device is synchronised first, or the
    poison fill could land after the kernel (seen under compute-sanitizer, whose slower launches let the
    fill overtake the kernel and show every output as unwritten)."""
    cp = runtime.cupy()
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        if graph:
            stream.begin_capture()
            ops.run(spec, device_inputs, params, out=outputs, stream=stream, knobs=knobs)
            executable = stream.end_capture()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        if graph:
            executable.launch(stream)
        else:
            ops.run(spec, device_inputs, params, out=outputs, stream=stream, knobs=knobs)
        stop.record(stream)
        stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) * 1000.0


def verify_case(spec: StageSpec, item: golden.GoldenCase, max_diffs: int = 10, graph: bool = False,
                knobs: dict | None = None) -> CaseResult:
    """One case through `kdt.ops` (with the launch `knobs`, if any), twice, outputs poisoned, compared."""
    case = item.case
    device_inputs = upload(case.inputs)
    params = dict(case.params)
    if "out" in item.expected and "out_dtype" not in params:
        params["out_dtype"] = "float32"
    # a first launch loads the module and allocates the workspace, outside any graph capture
    warm = allocate_outputs(spec, device_inputs, params)
    ops.run(spec, device_inputs, params, out=warm, knobs=knobs)
    runtime.cupy().cuda.Device().synchronize()
    merged: dict[str, FieldResult] = {}  # per output, the worse of the two poisoned runs
    elapsed = []
    for pattern in range(2):
        outputs = allocate_outputs(spec, device_inputs, params)
        for array in outputs.values():
            poison(raw(array), pattern)
        elapsed.append(launch_timed(spec, device_inputs, params, outputs, graph, knobs))
        for name, policy in spec.outputs.items():
            result = policy.compare(name, item.expected[name], download(outputs[name]), max_diffs)
            if pattern and not result.ok:
                result.worst = "; ".join(filter(None, [result.worst, "with the second poison pattern"]))
            if name not in merged or result.mismatches > merged[name].mismatches:
                merged[name] = result
    ordered = list(merged.values())
    return CaseResult(spec.name, case.name, case.description, all(f.ok for f in ordered), min(elapsed), ordered)


def select_cases(spec: StageSpec, path: Path, pattern: str | None = None) -> list[golden.GoldenCase]:
    """The cases of a golden file matching `pattern` (all where None); a file that is missing, truncated, foreign
    or malformed is golden.GoldenError, found without a GPU."""
    golden_file = golden.read(path, spec)
    return [item for item in golden_file.cases if pattern is None or fnmatch.fnmatch(item.case.name, pattern)]


def verify_file(spec: StageSpec, path: Path, pattern: str | None = None, max_diffs: int = 10,
                graph: bool = False, progress=None, knobs: dict | None = None) -> list[CaseResult]:
    return verify_cases(spec, select_cases(spec, path, pattern), max_diffs, graph, progress, knobs)


def verify_cases(spec: StageSpec, selected: list[golden.GoldenCase], max_diffs: int = 10, graph: bool = False,
                 progress=None, knobs: dict | None = None) -> list[CaseResult]:
    results = []
    for item in selected:
        started = time.perf_counter()
        try:
            results.append(verify_case(spec, item, max_diffs, graph, knobs))
        except (runtime.GpuMissing, build.BuildError, toolkit.ToolkitMissing):
            raise
        except Exception as error:  # a launch failure is this case's failure, reported, not a crash
            results.append(CaseResult(spec.name, item.case.name, item.case.description, False, None, [],
                                      f"{type(error).__name__}: {error}"))
        if progress:
            progress(time.perf_counter() - started)
    return results


def environment_failure(kernel: str, error: Exception) -> CaseResult:
    """What a report says for a kernel this machine could not run (no GPU, no nvcc, a compile error)."""
    return CaseResult(kernel, "(environment)", "this machine cannot run the kernel", False, None, [],
                      f"cannot run here: {type(error).__name__}: {error}")


def verify_fresh(spec: StageSpec, case, max_diffs: int = 10, graph: bool = False,
                 knobs: dict | None = None) -> CaseResult:
    """A case that is not in a golden file: the reference computes its expected outputs first."""
    return verify_case(spec, golden.GoldenCase(case, spec.reference(case.inputs, case.params)), max_diffs, graph,
                       knobs)
