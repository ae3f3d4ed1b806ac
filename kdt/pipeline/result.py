"""What a run produces, as plain data: the text generated, the accepted lengths, the time of every stage."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from kdt.pipeline.config import PipelineConfig
from kdt.pipeline.step import STAGE_KIND, STAGES


@dataclass
class StageTiming:
    name: str
    kind: str
    ms: list[float] = field(default_factory=list)            # per step, the backend's time
    reference_ms: list[float] = field(default_factory=list)  # gpu backend: the CPU references on the same inputs

    @staticmethod
    def _median(values: list[float]) -> float | None:
        return float(np.median(values)) if values else None

    @property
    def median_ms(self) -> float | None:
        return self._median(self.ms)

    @property
    def reference_median_ms(self) -> float | None:
        return self._median(self.reference_ms)


def stage_timings() -> dict[str, StageTiming]:
    """An empty StageTiming for every stage of a step, in step order."""
    return {name: StageTiming(name, STAGE_KIND[name]) for name in STAGES}


class StageClock:
    """perf_counter laps into StageTiming.ms (or .reference_ms): `lap(name)` charges the time since the last lap
    to stage `name`."""

    def __init__(self, timings: dict[str, StageTiming], reference: bool = False):
        self.timings, self.reference = timings, reference
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        timing = self.timings[name]
        (timing.reference_ms if self.reference else timing.ms).append((now - self.last) * 1e3)
        self.last = now


@dataclass(frozen=True)
class Mismatch:
    """The first generated token unlike the target's plain decoding."""

    request: int
    position: int
    expected: int
    got: int
    requests_affected: int


@dataclass
class PipelineResult:
    config: PipelineConfig
    device: str
    generated: np.ndarray         # int32 [G, tokens], speculative
    plain: np.ndarray             # int32 [G, tokens], the target alone: one token per call, same rule and seed
    accept_lens: list[np.ndarray]  # per step: accept_len of the requests still generating at that step
    request_steps: np.ndarray     # int [G]: steps in which each request was generating
    timings: dict[str, StageTiming]
    graph_ms: list[float] = field(default_factory=list)  # gpu: one replay of the step graph, per step
    disagreements: dict[str, str] = field(default_factory=dict)  # gpu: stage -> first output unlike the reference

    @property
    def steps(self) -> int:
        return len(self.accept_lens)

    @property
    def mismatch(self) -> Mismatch | None:
        wrong = self.generated != self.plain
        if not wrong.any():
            return None
        request = int(np.flatnonzero(wrong.any(axis=1))[0])
        position = int(np.flatnonzero(wrong[request])[0])
        return Mismatch(request, position, int(self.plain[request, position]), int(self.generated[request, position]),
                        int(wrong.any(axis=1).sum()))

    @property
    def lossless(self) -> bool:
        return self.mismatch is None

    @property
    def passed(self) -> bool:
        return self.lossless and not self.disagreements

    @property
    def all_accept_lens(self) -> np.ndarray:
        return np.concatenate(self.accept_lens) if self.accept_lens else np.zeros(0, np.int32)

    @property
    def mean_accept_len(self) -> float:
        lens = self.all_accept_lens
        return float(lens.mean()) if lens.size else 0.0

    @property
    def tokens_generated(self) -> int:
        return int(self.generated.size)

    @property
    def tokens_per_target_call(self) -> float:
        """Tokens per request per target call; plain greedy decoding makes 1."""
        calls = int(self.request_steps.sum())
        return self.tokens_generated / calls if calls else 0.0

    def stage_sum_ms(self, names, reference: bool = False) -> float | None:
        """The sum of the stages' median times (their CPU references' where `reference`); None if one is missing."""
        values = [self.timings[n].reference_median_ms if reference else self.timings[n].median_ms for n in names]
        return None if any(v is None for v in values) else float(sum(values))

    @property
    def graph_median_ms(self) -> float | None:
        return float(np.median(self.graph_ms)) if self.graph_ms else None
