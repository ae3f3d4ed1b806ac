"""`kdt fuzz`: random cases of random shape through the kernel and the reference, failures shrunk and kept.

Case i of a run with seed S is drawn by the stage's `random_case` from `numpy.random.default_rng([S, i])`,
so (S, i) reproduces it anywhere. Each case is computed by the reference, then run on the GPU with poisoned
outputs (`kdt.verify.verify_case`, both poison patterns) and compared as the contract says. The outcome
of one case is one of:

- pass;
- kernel failure: a mismatch, or an exception from the launch (a CUDA error, a launcher that rejects
  input the reference accepts);
- generator bug: `random_case` raised, or the reference rejected the generated case (BadInput): the case
  is outside the contract, so the generator is wrong, not the kernel. Counted apart.

A failing case is shrunk greedily: the first smaller variant (the stage's `SPEC.shrink`, or a generic
one-request-of-the-batch cut when a stage has none) that still fails the same way (the same exception type,
or a mismatch in at least one of the same outputs) replaces it, until no variant fails or the run budget is
spent. The shrunk case is saved as `fuzz_<seed>_<i>` in `golden/regressions/<kernel>.h5` (a golden file
like any other, so `kdt verify` runs it), which stays a test forever.

A CUDA error such as an illegal address leaves the process's CUDA context unusable: every later launch
fails too, so shrinking would be meaningless. After any exception the device is probed; if it no longer
answers, fuzzing stops, the case is saved unshrunk, and the report says how to replay it in a fresh process.

Nothing here names a stage; the GPU is reached only through the `run_case` and `healthy` callables, which
tests replace with a fake kernel.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from kdt import golden, paths
from kdt.dtypes import name as dtype_name
from kdt.spec import Case, StageSpec
from kdt.refs.errors import BadInput

DEFAULT_SHRINK_RUNS = 200
DEFAULT_MAX_FAILURES = 3
REGRESSIONS_SUBDIR = "regressions"


def regressions_path(kernel: str, golden_dir: Path | str | None = None) -> Path:
    """`<golden>/regressions/<kernel>.h5`: the cases fuzzing found, shrunk, kept as tests (golden_dir None: the
    package's golden files, golden/ in a checkout)."""
    return Path(paths.GOLDEN if golden_dir is None else golden_dir) / REGRESSIONS_SUBDIR / f"{kernel}.h5"


def case_rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, index])


def draw_case(spec: StageSpec, seed: int, index: int) -> Case:
    """Case `index` of a fuzz run with `seed`, exactly as `run_fuzz` draws it."""
    if spec.random_case is None:
        raise ValueError(f"{spec.name} has no random_case generator")
    return spec.random_case(case_rng(seed, index))


# --- shrinking helpers (stage modules call these from their `shrink_case`) ---------------------------------

def smaller_sizes(n: int, low: int = 1) -> list[int]:
    """Sizes below `n` worth trying, smallest first: `low`, then n/2, 3n/4, 7n/8, ... n-1, so a greedy
    shrinker reaches the smallest failing size in about log(n) steps instead of n."""
    sizes = {low, n - 1}
    cut = n // 2
    while cut >= 1:
        sizes.add(n - cut)
        cut //= 2
    return sorted(size for size in sizes if low <= size < n)


def with_inputs(case: Case, params: dict | None = None, **inputs: np.ndarray) -> Case:
    """The case with some inputs (made C-contiguous) and parameters replaced."""
    merged = dict(case.inputs)
    merged.update({name: np.ascontiguousarray(array) for name, array in inputs.items()})
    return dataclasses.replace(case, inputs=merged, params={**case.params, **(params or {})})


def batch_variants(case: Case, shared: Sequence[str] = ()) -> Iterator[Case]:
    """Smaller batches: each single request g, then each half. Every input but those in `shared` (inputs
    the whole batch uses, such as a paged KV cache) has the requests on its leading axis."""
    per_request = [name for name in case.inputs if name not in shared]
    if not per_request:
        return
    groups = case.inputs[per_request[0]].shape[0]
    if groups <= 1:
        return
    picks = [slice(g, g + 1) for g in range(groups)]
    if groups > 3:
        picks += [slice(0, groups // 2), slice(groups // 2, groups)]
    for pick in picks:
        yield with_inputs(case, **{name: case.inputs[name][pick] for name in per_request})


def default_shrink(case: Case) -> Iterator[Case]:
    """For a stage without `shrink`: one request at a time, if every input is batched on axis 0."""
    leading = {array.shape[0] if array.ndim else None for array in case.inputs.values()}
    if len(leading) == 1:
        yield from batch_variants(case)


def summarize(case: Case) -> str:
    """`logits bfloat16[2, 3, 4099], k=16`: the shapes and parameters of a case, for descriptions."""
    arrays = ", ".join(f"{name} {dtype_name(array.dtype)}{list(array.shape)}" for name, array in case.inputs.items())
    params = ", ".join(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
                       for key, value in case.params.items())
    return f"{arrays}; {params}" if params else arrays


def case_size(case: Case) -> int:
    return sum(int(array.size) for array in case.inputs.values())


# --- outcomes -------------------------------------------------------------------------------------------

@dataclass
class GeneratorBug:
    index: int
    where: str      # "random_case" or "reference"
    message: str
    case: str = ""  # summary of the generated case, when there is one


@dataclass
class FuzzFailure:
    index: int
    seed: int
    detail: str                 # what failed (first failing output, or the exception)
    original: Case
    shrunk: Case
    shrink_steps: int = 0
    shrink_runs: int = 0
    saved_as: str | None = None
    saved_to: Path | None = None
    save_error: str | None = None
    signature: tuple = ()
    duplicate_of: int | None = None  # an earlier failure of this run that shrank to the same shape, same way

    @property
    def replay(self) -> str:
        return f"--seed {self.seed} --start {self.index} --cases 1"


@dataclass
class FuzzProgress:
    kernel: str
    phase: str
    cases_run: int
    failures: int
    generator_bugs: int
    elapsed_s: float
    shrink_runs: int

    @property
    def cases_per_s(self) -> float:
        return self.cases_run / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass
class FuzzReport:
    kernel: str
    seed: int
    start: int = 0
    cases_run: int = 0
    elapsed_s: float = 0.0
    failures: list[FuzzFailure] = field(default_factory=list)
    generator_bugs: list[GeneratorBug] = field(default_factory=list)
    redrawn: int = 0              # generated draws redrawn off a knife's edge (Case.redrawn), not failures
    stopped_by: str = ""          # "time", "cases", "failures", "context lost", "no generator"
    context_lost: str | None = None

    @property
    def ok(self) -> bool:
        return not self.failures and not self.generator_bugs and self.context_lost is None

    @property
    def cases_per_s(self) -> float:
        return self.cases_run / self.elapsed_s if self.elapsed_s > 0 else 0.0


class ContextLost(Exception):
    """The GPU stopped answering after a kernel error: nothing more can run in this process."""


@dataclass
class _Outcome:
    kind: str                # "pass", "fail", "invalid"
    detail: str = ""
    signature: tuple = ()
    where: str = ""          # for "invalid": "reference"


def _first_failure(result) -> str:
    if result.error:
        return result.error
    parts = []
    for f in result.fields:
        if f.ok:
            continue
        first = f.diffs[0] if f.diffs else None
        where = f" first at {tuple(first.index)}: expected {first.expected!r}, got {first.got!r}" if first else ""
        parts.append(f"{f.name} {f.mismatches}/{f.checked} mismatch{where}" + (f" ({f.worst})" if f.worst else ""))
    return "; ".join(parts) or "failed"


def failure_signature(result) -> tuple:
    """What kind of failure: ("error", exception type) or ("mismatch", the failing outputs)."""
    if result.error:
        return ("error", result.error.split(":", 1)[0].strip())
    return ("mismatch", frozenset(f.name for f in result.fields if not f.ok))


def same_failure(a: tuple, b: tuple) -> bool:
    if not a or not b or a[0] != b[0]:
        return False
    if a[0] == "mismatch":
        return bool(a[1] & b[1]) or (not a[1] and not b[1])
    return a[1] == b[1]


def _environment_errors() -> tuple[type, ...]:
    from kdt import build, runtime, toolkit

    return (runtime.GpuMissing, build.BuildError, toolkit.ToolkitMissing)


def device_healthy() -> bool:
    """Whether the GPU still runs work in this process (a sticky CUDA error makes every call fail)."""
    try:
        from kdt import runtime

        cp = runtime.cupy()
        cp.cuda.Device().synchronize()
        return int(cp.arange(4, dtype=cp.int32).sum()) == 6
    except Exception:
        return False


def device_runner(graph: bool = False, knobs: dict | None = None) -> Callable:
    """The real `run_case`: `kdt.verify.verify_case` (poisoned outputs, both patterns), eager or in a graph, with the
    launch `knobs` (if any)."""
    from kdt import verify

    def run(spec: StageSpec, item: golden.GoldenCase):
        return verify.verify_case(spec, item, max_diffs=3, graph=graph, knobs=knobs)

    return run


class _Runner:
    """Runs one case: the reference first (a BadInput there means the case is out of contract), then the
    kernel; exceptions from the launch are kernel failures, after which the device is probed."""

    def __init__(self, spec: StageSpec, run_case: Callable, healthy: Callable[[], bool]):
        self.spec, self.run_case, self.healthy = spec, run_case, healthy
        self.environment = _environment_errors()

    def __call__(self, case: Case) -> _Outcome:
        try:
            expected = self.spec.reference(case.inputs, case.params)
        except BadInput as error:
            return _Outcome("invalid", f"reference rejected it: {error}", where="reference")
        except Exception as error:  # the reference crashed: a generator (or reference) bug, not the kernel's
            return _Outcome("invalid", f"reference raised {type(error).__name__}: {error}", where="reference")
        try:
            result = self.run_case(self.spec, golden.GoldenCase(case, expected))
        except self.environment:
            raise
        except Exception as error:
            detail = f"{type(error).__name__}: {error}"
            if not self.healthy():
                raise ContextLost(detail) from None
            return _Outcome("fail", detail, ("error", type(error).__name__))
        if result.passed:
            return _Outcome("pass")
        return _Outcome("fail", _first_failure(result), failure_signature(result))


@dataclass
class ShrinkResult:
    case: Case                  # the smallest case found that still fails the same way
    detail: str | None          # its failure, or None when no variant failed (the original stands)
    steps: int                  # variants taken
    runs: int                   # variants run
    context_lost: str | None = None


def shrink(spec: StageSpec, case: Case, signature: tuple, attempt: Callable[[Case], _Outcome],
           max_runs: int = DEFAULT_SHRINK_RUNS, on_step: Callable[[int], None] | None = None) -> ShrinkResult:
    """Greedy: take the first variant that still fails the same way and start again from it; stop when no
    variant does or `max_runs` variants were run. A lost CUDA context ends it with the best case so far."""
    variants = spec.shrink or default_shrink
    result = ShrinkResult(case, None, 0, 0)
    seen: set[bytes] = {_fingerprint(case)}
    progress = True
    while progress and result.runs < max_runs:
        progress = False
        for candidate in variants(result.case):
            if result.runs >= max_runs:
                break
            key = _fingerprint(candidate)
            if key in seen:
                continue
            seen.add(key)
            result.runs += 1
            try:
                outcome = attempt(candidate)
            except ContextLost as lost:
                result.context_lost = str(lost)
                return result
            finally:
                if on_step:
                    on_step(result.runs)
            if outcome.kind == "fail" and same_failure(signature, outcome.signature):
                result.case, result.detail, result.steps, progress = candidate, outcome.detail, result.steps + 1, True
                break
    return result


def _fingerprint(case: Case) -> bytes:
    import hashlib

    digest = hashlib.sha256(repr(sorted(case.params.items())).encode())
    for name in sorted(case.inputs):
        array = np.ascontiguousarray(case.inputs[name])
        digest.update(name.encode() + str(array.shape).encode() + str(array.dtype).encode())
        digest.update(array.view(np.uint8).tobytes() if array.size else b"")
    return digest.digest()


# --- saving ---------------------------------------------------------------------------------------------

def regression_case(failure: FuzzFailure) -> Case:
    shrunk = failure.shrunk
    how = (f"shrunk in {failure.shrink_steps} step(s) from {summarize(failure.original)}"
           if failure.shrink_steps else "not shrunk")
    description = (f"kdt fuzz --seed {failure.seed} case {failure.index}: {summarize(shrunk)}; {how}; "
                   f"failed with: {failure.detail}")
    return Case(f"fuzz_{failure.seed}_{failure.index}", description[:2000], failure.seed, dict(shrunk.params),
                dict(shrunk.inputs))


def save_regression(path: Path | str, spec: StageSpec, case: Case) -> None:
    """Add (or replace, by name) one case in a regressions file, expected outputs from the reference, the
    whole file rewritten atomically. An unreadable existing file raises GoldenError and is left alone."""
    path = Path(path)
    kept: list[golden.GoldenCase] = []
    if path.exists():
        kept = [item for item in golden.read(path, spec).cases if item.case.name != case.name]
    items = []
    for item in kept:  # expected outputs follow the reference of today, as the file's ref_digest says
        try:
            items.append(golden.GoldenCase(item.case, spec.reference(item.case.inputs, item.case.params)))
        except BadInput:
            items.append(item)
    items.append(golden.GoldenCase(case, spec.reference(case.inputs, case.params)))
    golden.write(path, spec, items)


# --- the run --------------------------------------------------------------------------------------------

def run_fuzz(spec: StageSpec, seconds: float | None = 60.0, seed: int = 0, max_cases: int | None = None,
             on_progress: Callable[[FuzzProgress], None] | None = None, *,
             run_case: Callable | None = None, healthy: Callable[[], bool] | None = None,
             start: int = 0, regressions: Path | str | None = None,
             shrink_runs: int = DEFAULT_SHRINK_RUNS, max_failures: int = DEFAULT_MAX_FAILURES,
             clock: Callable[[], float] = time.perf_counter) -> FuzzReport:
    """Fuzz one stage until `seconds` pass or `max_cases` cases ran (whichever first; None: no limit of
    that kind) or `max_failures` kernel failures were found. `run_case(spec, GoldenCase) -> CaseResult`
    runs one case on the device (default: `verify.verify_case`); `healthy()` says whether the device still
    answers after an exception. Failures are shrunk and, with `regressions`, saved there."""
    report = FuzzReport(spec.name, seed, start)
    if seconds is None and max_cases is None:
        raise ValueError("run_fuzz needs seconds or max_cases")
    if spec.random_case is None:
        report.stopped_by = "no generator"
        return report
    runner = _Runner(spec, run_case or device_runner(), healthy or device_healthy)
    began = clock()
    shrink_total = 0

    def notify(phase: str) -> None:
        report.elapsed_s = clock() - began
        if on_progress:
            on_progress(FuzzProgress(spec.name, phase, report.cases_run, len(report.failures),
                                     len(report.generator_bugs), report.elapsed_s, shrink_total))

    index = start
    while True:
        if max_cases is not None and report.cases_run >= max_cases:
            report.stopped_by = "cases"
            break
        if seconds is not None and clock() - began >= seconds:
            report.stopped_by = "time"
            break
        try:
            case = draw_case(spec, seed, index)
        except Exception as error:
            report.generator_bugs.append(GeneratorBug(index, "random_case", f"{type(error).__name__}: {error}"))
            report.cases_run += 1
            index += 1
            notify("fuzzing")
            continue
        report.redrawn += case.redrawn
        try:
            outcome = runner(case)
        except ContextLost as lost:
            report.cases_run += 1
            failure = FuzzFailure(index, seed, str(lost), case, case)
            report.failures.append(failure)
            report.context_lost = (f"case {index}: {lost}; the CUDA context is unusable after it, so the rest of "
                                   f"the run was skipped")
            _save(failure, spec, regressions)
            report.stopped_by = "context lost"
            notify("context lost")
            break
        report.cases_run += 1
        if outcome.kind == "invalid":
            report.generator_bugs.append(GeneratorBug(index, outcome.where, outcome.detail, summarize(case)))
        elif outcome.kind == "fail":
            failure = FuzzFailure(index, seed, outcome.detail, case, case, signature=outcome.signature)
            report.failures.append(failure)
            before = shrink_total

            def step(runs: int) -> None:
                nonlocal shrink_total
                shrink_total = before + runs
                notify(f"shrinking case {index}")

            notify(f"shrinking case {index}")
            shrunk = shrink(spec, case, outcome.signature, runner, shrink_runs, step)
            failure.shrunk, failure.shrink_steps, failure.shrink_runs = shrunk.case, shrunk.steps, shrunk.runs
            if shrunk.detail:
                failure.detail = shrunk.detail
            for earlier in report.failures[:-1]:
                if same_failure(earlier.signature, failure.signature) and \
                        summarize(earlier.shrunk) == summarize(failure.shrunk):
                    failure.duplicate_of = earlier.index
                    break
            if failure.duplicate_of is None:
                _save(failure, spec, regressions)
            if shrunk.context_lost:
                report.context_lost = (f"while shrinking case {index}: {shrunk.context_lost}; the CUDA context is "
                                       f"unusable after it, so shrinking stopped at the smallest failing case so far")
                report.stopped_by = "context lost"
                notify("context lost")
                break
            if len(report.failures) >= max_failures:
                report.stopped_by = "failures"
                index += 1
                notify("fuzzing")
                break
        index += 1
        notify("fuzzing")
    report.elapsed_s = clock() - began
    return report


def _save(failure: FuzzFailure, spec: StageSpec, regressions: Path | str | None) -> None:
    if regressions is None:
        return
    case = regression_case(failure)
    try:
        save_regression(regressions, spec, case)
    except (golden.GoldenError, OSError) as error:
        failure.save_error = f"not saved: {error}"
        return
    failure.saved_as, failure.saved_to = case.name, Path(regressions)
