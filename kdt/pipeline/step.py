"""One decoding step, as both backends take it: its stages, and the pieces that move the requests' text.

A step: the drafter's logits for the next K positions, `topk`, `tree-build`, the target at every slot of the tree
(slot i's context is the committed text plus the path root..i), `tree-accept`, then the accepted tokens and the
bonus are appended. The functions here are written once for numpy and CuPy (`xp`) where the GPU backend uses them.
"""

from __future__ import annotations

import numpy as np

from kdt.pipeline.config import PROMPT_LEN, PipelineConfig

STAGES = ("drafter", "topk", "tree-build", "target", "tree-accept", "append")
KDT_STAGES = ("topk", "tree-build", "tree-accept")
GRAPH_STAGES = ("topk", "tree-build", "target", "tree-accept")  # what one CUDA graph replay runs
STAGE_KIND = {"drafter": "model", "topk": "kdt stage", "tree-build": "kdt stage", "target": "model",
              "tree-accept": "kdt stage", "append": "bookkeeping"}


def make_prompts(seed: int, batch: int, vocab: int) -> np.ndarray:
    """int32 [G, PROMPT_LEN]: each request's random prompt."""
    return np.random.default_rng([seed, 2]).integers(0, vocab, (batch, PROMPT_LEN)).astype(np.int32)


def committed_last3(xp, seq, seq_len):
    """The last three committed tokens of each request, [G, 3] int32 (the last one is the tree's root)."""
    groups = seq.shape[0]
    columns = seq_len[:, None] - 3 + xp.arange(3)[None, :]
    return seq[xp.arange(groups)[:, None], columns].astype(xp.int32)


def slot_contexts(parent: np.ndarray, token: np.ndarray, depth: np.ndarray, last3: np.ndarray) -> np.ndarray:
    """The target's context at every tree slot: the last three tokens of committed text + path root..slot.

    [G, N, 3] int32. The root (and an unused slot) sees the committed text alone. Mirrors the CUDA kernel
    `kdt_pipeline_slot_context` (kernels/synthetic_target.cu).
    """
    groups, slots = parent.shape
    rows = np.arange(groups)[:, None]
    path_len = np.maximum(depth, 0)
    cur = np.broadcast_to(np.arange(slots), (groups, slots)).copy()
    out = np.empty((groups, slots, 3), np.int32)
    for back in range(3):  # newest first
        on_path = back < path_len
        committed = last3[rows, np.clip(2 - (back - path_len), 0, 2)]
        out[:, :, 2 - back] = np.where(on_path, token[rows, cur], committed)
        cur = np.where(on_path, np.clip(parent[rows, cur], 0, slots - 1), cur)
    return out


def append_accepted(xp, seq, seq_len, accept_len, accept_tokens, tokens: int) -> None:
    """Append each request's accepted tokens and its bonus, never past `tokens` generated; in place.

    All K + 1 entries are written at seq_len.. (no data-dependent shapes, no host sync); those past the new
    length are overwritten by the next step before anything reads them (max_len leaves room for them).
    """
    groups, width = accept_tokens.shape
    remaining = (PROMPT_LEN + tokens) - seq_len
    count = xp.minimum(accept_len + 1, remaining).astype(seq_len.dtype)
    flat = (xp.arange(groups) * seq.shape[1])[:, None] + seq_len[:, None] + xp.arange(width)[None, :]
    seq.reshape(-1)[flat] = accept_tokens
    seq_len += count


def check_progress(step: int, config: PipelineConfig) -> None:
    """Every step appends at least the bonus token to each request still generating: more steps than tokens
    means one appended nothing."""
    if step > config.tokens:
        raise RuntimeError(f"kdt pipeline: {step} steps for {config.tokens} tokens: a step appended nothing")
