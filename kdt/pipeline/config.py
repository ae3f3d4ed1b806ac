"""What a pipeline run is asked to do: `PipelineConfig`, its limits, and `validate`."""

from __future__ import annotations

from dataclasses import dataclass

import kdt.refs.topk as ref_topk
import kdt.refs.tree_build as ref_tree_build
from kdt.refs.errors import require

BACKENDS = ("gpu", "cpu")
PROMPT_LEN = 8            # random prompt tokens per request (>= 3: the target reads the last three)
MIN_VOCAB, MAX_VOCAB = 16, 262144
MAX_TARGET_LOGITS = 2**31  # elements of the [G, N, vocab] target logits buffer (8 GiB of float32)


@dataclass(frozen=True)
class PipelineConfig:
    batch: int = 8             # G, requests decoded together
    budget: int = 63           # B, draft tree nodes besides the root
    depth: int = 8             # K, draft positions (the most tokens accepted per step)
    topk: int = 8              # V, candidates kept per draft position
    tokens: int = 128          # tokens generated per request
    seed: int = 0
    backend: str = "gpu"       # one of BACKENDS
    draft_quality: float = 0.8  # how often the drafter's top guess is the target's token (see drafter.py)
    vocab: int = 4096

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
    require(config.seed >= 0, "--seed", "an integer >= 0", config.seed)
    quality = config.draft_quality
    require(isinstance(quality, (int, float)) and 0.0 <= quality <= 1.0, "--draft-quality", "a number in [0, 1]",
            quality)
    elements = config.batch * config.slots * config.vocab
    require(elements <= MAX_TARGET_LOGITS, "--batch/--budget/--vocab",
            f"target logits of at most {MAX_TARGET_LOGITS} elements (batch * (budget + 1) * vocab)", elements)
