"""Helpers the stage modules share: input synthesis that looks like a real drafter, and layout checks."""

from __future__ import annotations

import numpy as np

from kdt.refs.errors import BadInput


def drafter_logits(rng: np.random.Generator, groups: int, depth: int, vocab: int,
                   confidence: float = 4.0) -> np.ndarray:
    """float32 [G, K, vocab] logits shaped like a drafter's: a heavy-tailed background with a few strong
    candidates whose lead fades with depth (later positions are less certain)."""
    logits = rng.standard_normal((groups, depth, vocab), dtype=np.float32) * np.float32(1.5)
    strong = min(vocab, 4)
    for d in range(depth):
        lead = (np.log(vocab) + confidence) * (1.0 - d / (depth + 1)) + 0.5
        hot = rng.integers(0, vocab, size=(groups, strong))
        boost = (lead * rng.uniform(0.5, 1.0, size=(groups, strong))).astype(np.float32)
        np.put_along_axis(logits[:, d], hot, np.take_along_axis(logits[:, d], hot, axis=1) + boost, axis=1)
    return logits


def require_layout(shapes: dict, dtypes: dict, name: str, ndim: int, allowed: tuple[str, ...]) -> tuple[int, ...]:
    if name not in shapes:
        raise BadInput(name, f"an input named {name!r}", "missing")
    shape = tuple(shapes[name])
    if len(shape) != ndim:
        raise BadInput(name, f"{ndim} dimensions", f"shape {shape}")
    if dtypes[name] not in allowed:
        raise BadInput(name, f"dtype {' or '.join(allowed)}", dtypes[name])
    return shape


def require_same(name: str, shape: tuple, expected: tuple) -> None:
    if tuple(shape) != tuple(expected):
        raise BadInput(name, f"shape {tuple(expected)}", f"shape {tuple(shape)}")


def quantised_logits(rng: np.random.Generator, groups: int, depth: int, vocab: int) -> np.ndarray:
    """Logits on an integer grid (standard normal, rounded): a quantised vocabulary, where the top V of a wide V
    ends inside a run of hundreds of equal logits (e.g. ~200 at the value 3 in 32768 entries), float32
    [groups, depth, vocab]."""
    return np.round(rng.standard_normal((groups, depth, vocab))).astype(np.float32)
