"""The acceptance rule, in one place: greedy (temperature 0), or sampling with a temperature, top-k and top-p.

Three things follow from the rule, and every other module takes them from here: the token the target emits for
its logits at an absolute position (`next_token`), the plain decoding (one token per target call) speculative
decoding must reproduce token for token (`plain_decode`), and which draft tokens of a tree the target keeps, with
the bonus token (`accept` on the CPU, `accept_on_gpu` through kdt.ops).

Greedy is the contract's `tree-accept`, sampling its `tree-sample` (refs/tree_sample.py): the token for absolute
position p is drawn with Philox noise keyed by (seed, p, token), so the speculative walk and plain decoding draw
the same token there. At temperature 0 tree-sample is tree-accept; the greedy rule stays on tree-accept's
reference all the same, as that is what the GPU's tree-accept kernel is checked against. Every request samples
with the run's one seed, as an engine does for a batch submitted with one seed (their prompts differ). On the GPU
the sampling parameters and positions are device arrays (`gpu_sampling_inputs`), so the tree-sample kernel reads
each step's positions when a captured graph replays.
"""

from __future__ import annotations

import numpy as np

import kdt.refs.tree_accept as ref_tree_accept
import kdt.refs.tree_sample as ref_tree_sample
from kdt.pipeline.config import PipelineConfig
from kdt.stages.tree_accept import OUTPUTS


def is_greedy(config: PipelineConfig) -> bool:
    return config.temperature == 0


def stage_name(config: PipelineConfig) -> str:
    """The contract stage that accepts: tree-accept (greedy) or tree-sample."""
    return "tree-accept" if is_greedy(config) else "tree-sample"


def stage_label(config: PipelineConfig, stage: str) -> str:
    """A step's stage as printed: the acceptance step (keyed "tree-accept" in timings and disagreements) by the
    contract stage it ran."""
    return stage_name(config) if stage == "tree-accept" else stage


def baseline_name(config: PipelineConfig) -> str:
    """What the speculative output is checked against, in words."""
    return "the target's greedy decoding" if is_greedy(config) else "the target's plain sampling with the same seed"


def describe(config: PipelineConfig) -> str:
    """The rule and its parameters, for the report's title."""
    if is_greedy(config):
        return "greedy"
    top_k = config.top_k if config.top_k else "off"
    top_p = f"{config.top_p:g}" if config.top_p < 1 else "off"
    return f"sampling T={config.temperature:g} top-k={top_k} top-p={top_p}"


def greedy(xp, logits):
    """argmax over the last axis, equal logits to the smaller id (stated, not left to the library)."""
    vocab = logits.shape[-1]
    best = logits.max(axis=-1, keepdims=True)
    ids = xp.arange(vocab, dtype=xp.int32)
    return xp.where(logits == best, ids, np.int32(vocab)).min(axis=-1).astype(xp.int32)


def _sampling_arrays(config: PipelineConfig, position: np.ndarray) -> dict[str, np.ndarray]:
    """The contract's per-request sampling parameters, one row per entry of `position` (int64: the absolute
    position of the token drawn)."""
    count = len(position)
    return {"temperature": np.full(count, config.temperature, np.float32),
            "top_k": np.full(count, config.top_k, np.int32),
            "top_p": np.full(count, config.top_p, np.float32),
            "seed": np.full(count, config.seed, np.uint64),
            "position": position.astype(np.int64)}


def next_token(config: PipelineConfig, logits: np.ndarray, position: np.ndarray) -> np.ndarray:
    """The target's token for each row of logits [R, vocab], drawn for the absolute positions `position` [R].
    -> int32 [R]."""
    if is_greedy(config):
        return greedy(np, logits)
    token, _margin = ref_tree_sample.sample(logits, **_sampling_arrays(config, position))
    return token


def plain_decode(config: PipelineConfig, model, prompts: np.ndarray) -> np.ndarray:
    """The target alone (a TargetModel), one token per call: what speculative decoding must reproduce.
    -> int32 [G, config.tokens]."""
    groups, prompt_len = prompts.shape
    sequence = prompts.astype(np.int32)
    out = np.empty((groups, config.tokens), np.int32)
    for generated in range(config.tokens):
        position = np.full(groups, prompt_len + generated, np.int64)
        nxt = next_token(config, model.logits(sequence[:, -3:]), position)
        out[:, generated] = nxt
        sequence = np.concatenate([sequence[:, -2:], nxt[:, None]], axis=1)
    return out


def _walk(config: PipelineConfig, tree: dict[str, np.ndarray]) -> tuple:
    """The tree and depth arguments both references take first."""
    return tree["token"], tree["first_child"], tree["next_sibling"], tree["n_nodes"], config.depth


def _sampled_walk(config: PipelineConfig, tree: dict[str, np.ndarray], target_logits: np.ndarray,
                  position: np.ndarray) -> dict[str, np.ndarray]:
    """tree-sample's reference on one step, its decision margins included."""
    return ref_tree_sample.tree_sample(*_walk(config, tree), target_logits, **_sampling_arrays(config, position))


def accept(config: PipelineConfig, tree: dict[str, np.ndarray], target_logits: np.ndarray,
           position: np.ndarray) -> dict[str, np.ndarray]:
    """The reference (numpy): tree-build's outputs, the target's logits at every slot and the absolute position
    [G] of the token drawn at the root (the committed length) -> accept_len, accept_index, accept_tokens (the
    accepted tokens, then the bonus)."""
    if is_greedy(config):
        return ref_tree_accept.tree_accept(*_walk(config, tree), target_logits=target_logits)
    out = _sampled_walk(config, tree, target_logits, position)
    return {name: out[name] for name in OUTPUTS}


def draw_margins(config: PipelineConfig, tree: dict[str, np.ndarray], target_logits: np.ndarray,
                 position: np.ndarray) -> np.ndarray:
    """Sampling: each request's smallest decision margin along its walk, float64 [G]. Below refs' EPS one of its
    draws is on a knife's edge, which the contract lets a float32 kernel round either way."""
    return _sampled_walk(config, tree, target_logits, position)["min_margin"]


def gpu_sampling_inputs(cp, config: PipelineConfig) -> dict:
    """tree-sample's per-request inputs as CuPy arrays (empty when greedy: tree-accept takes none). The kernel reads
    them at every launch, so a captured graph replays with what they hold then: the backend writes each step's
    committed lengths into `position` before the replay."""
    if is_greedy(config):
        return {}
    start = np.zeros(config.batch, np.int64)
    return {name: cp.asarray(array) for name, array in _sampling_arrays(config, start).items()}


def _gpu_inputs(tree, target_logits, sampling: dict) -> dict:
    return {"token": tree.token, "first_child": tree.first_child, "next_sibling": tree.next_sibling,
            "n_nodes": tree.n_nodes, "target_logits": target_logits, **sampling}


def accept_on_gpu(config: PipelineConfig, tree, target_logits, sampling: dict, *, out=None, workspace=None):
    """`accept` with the kernel of `stage_name(config)` (kdt.ops.tree_accept's or kdt.ops.tree_sample's launch):
    `tree` a kdt.ops.Tree of CuPy arrays, `sampling` from `gpu_sampling_inputs` -> kdt.ops.Acceptance."""
    from kdt import ops

    inputs = _gpu_inputs(tree, target_logits, sampling)
    return ops.Acceptance(**ops.run(stage_name(config), inputs, {"max_depth": config.depth}, out=out,
                                    workspace=workspace, knobs=config.knobs))


def gpu_workspace(config: PipelineConfig, tree, target_logits, sampling: dict):
    """The workspace `accept_on_gpu` needs for these arrays (None if none)."""
    from kdt import ops

    return ops.workspace_for(stage_name(config), _gpu_inputs(tree, target_logits, sampling),
                             {"max_depth": config.depth}, knobs=config.knobs)
