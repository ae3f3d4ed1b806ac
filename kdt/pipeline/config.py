"""What a pipeline run is asked to do: `PipelineConfig`, its limits, and `validate`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import kdt.refs.topk as ref_topk
import kdt.refs.tree_build as ref_tree_build
from kdt.refs.errors import require

BACKENDS = ("gpu", "cpu")
PROMPT_LEN = 8            # random prompt tokens per request (>= 3: the target reads the last three)
MIN_VOCAB, MAX_VOCAB = 16, 262144
MAX_TARGET_LOGITS = 2**31  # elements of the [G, N, vocab] target logits buffer (8 GiB of float32)
MAX_SEED = 2**64 - 1       # the sampling seed is the contract's uint64


@dataclass(frozen=True)
class PipelineConfig:
    batch: int = 8             # G, requests decoded together
    budget: int = 63           # B, draft tree nodes besides the root
    depth: int = 8             # K, draft positions (the most tokens accepted per step)
    topk: int = 8              # V, candidates kept per draft position
    tokens: int = 128          # tokens generated per request
    seed: int = 0              # the models, the prompts, the drafter and the sampling noise
    backend: str = "gpu"       # one of BACKENDS
    draft_quality: float = 0.8  # how often the drafter's top guess is the target's token (see drafter.py)
    vocab: int = 4096
    temperature: float = 0.0   # 0: greedy (tree-accept); > 0: sampling (tree-sample)
    top_k: int = 0             # sampling: keep the top_k most probable tokens; 0: off
    top_p: float = 1.0         # sampling: keep the smallest set of probability >= top_p; 1: off
    overlap_previous: bool = False  # GPU: every stage's first launch by programmatic dependent launch (else: auto)

    @property
    def knobs(self) -> dict:
        """The launch knobs every kdt stage of the GPU step runs with."""
        return {"overlap_previous": True} if self.overlap_previous else {}

    @property
    def slots(self) -> int:
        """N, the tree's slots: the root and the budget."""
        return self.budget + 1

    @property
    def max_len(self) -> int:
        # room for the prompt, the tokens, and one step's K + 1 writes past the end (see step.append_accepted)
        return PROMPT_LEN + self.tokens + self.depth + 1


def validate(config: PipelineConfig) -> None:
    """Bad options -> BadInput naming the option (exit code 3)."""
    require(config.backend in BACKENDS, "--backend", "gpu or cpu", config.backend)
    require(config.batch >= 1, "--batch", "an integer >= 1", config.batch)
    require(1 <= config.budget <= ref_tree_build.MAX_BUDGET, "--budget",
            f"an integer in [1, {ref_tree_build.MAX_BUDGET}]", config.budget)
    require(1 <= config.depth <= ref_tree_build.MAX_DEPTH, "--depth", f"an integer in [1, {ref_tree_build.MAX_DEPTH}]",
            config.depth)
    require(MIN_VOCAB <= config.vocab <= MAX_VOCAB, "--vocab", f"an integer in [{MIN_VOCAB}, {MAX_VOCAB}]",
            config.vocab)
    require(1 <= config.topk <= min(ref_topk.MAX_K, config.vocab), "--topk",
            f"an integer in [1, min({ref_topk.MAX_K}, --vocab={config.vocab})]", config.topk)
    require(config.tokens >= 1, "--tokens", "an integer >= 1", config.tokens)
    require(config.backend == "gpu" or not config.overlap_previous, "--overlap-previous",
            "the GPU backend (it changes how kernels are launched)", f"--backend {config.backend}")
    require(0 <= config.seed <= MAX_SEED, "--seed", "an integer in [0, 2^64)", config.seed)
    quality = config.draft_quality
    require(isinstance(quality, (int, float)) and 0.0 <= quality <= 1.0, "--draft-quality", "a number in [0, 1]",
            quality)
    _validate_sampling(config)
    elements = config.batch * config.slots * config.vocab
    require(elements <= MAX_TARGET_LOGITS, "--batch/--budget/--vocab",
            f"target logits of at most {MAX_TARGET_LOGITS} elements (batch * (budget + 1) * vocab)", elements)


def _float32(value: float) -> float:
    """The value the sampling rule sees: the contract's parameters are float32 (1e-50 is 0 there, 1e39 inf)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def _validate_sampling(config: PipelineConfig) -> None:
    temperature = _float32(config.temperature)
    require(config.temperature == 0 or (math.isfinite(temperature) and temperature > 0), "--temperature",
            "0 (greedy) or a positive number (finite and non-zero as float32)", config.temperature)
    require(0 <= config.top_k <= config.vocab, "--top-k", f"0 (off) or an integer in [1, --vocab={config.vocab}]",
            config.top_k)
    top_p = _float32(config.top_p)
    require(0 < top_p <= 1, "--top-p", "a number in (0, 1] (1: off; non-zero as float32)", config.top_p)
