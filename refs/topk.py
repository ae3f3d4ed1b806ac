"""`topk`: drafter logits to per-position top-V log-probabilities (contract section `topk`)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import require, require_shape

MAX_K = 1024
LOGIT_DTYPES = (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16))


def topk(logits: np.ndarray, k: int) -> dict[str, np.ndarray]:
    """logits float32 or bfloat16 [G, K, vocab] -> top_ids int32, top_logp float32, both [G, K, k].

    Ids are ordered by logit descending, equal logits by smaller id; log-probs are computed in float64
    and rounded once to float32.
    """
    require(isinstance(logits, np.ndarray) and logits.dtype in LOGIT_DTYPES, "logits",
            "a float32 or bfloat16 array", getattr(logits, "dtype", type(logits).__name__))
    require_shape(logits, "logits", (None, None, None))
    groups, depth, vocab = logits.shape
    require(vocab >= 1, "logits", "a vocabulary of at least 1", vocab)
    require(isinstance(k, (int, np.integer)) and 1 <= k <= min(vocab, MAX_K), "k",
            f"an integer in [1, min(vocab={vocab}, {MAX_K})]", k)
    values = logits.astype(np.float64)
    require(not np.isnan(values).any(), "logits", "no NaN", "NaN")
    rows = values.reshape(-1, vocab)
    finite_rows = np.isfinite(rows).any(axis=1) & ~(rows == np.inf).any(axis=1)
    if rows.shape[0] and not finite_rows.all():
        bad = int(np.flatnonzero(~finite_rows)[0])
        require(False, "logits", "every row with a finite logit and no +inf",
                f"row (g={bad // depth}, d={bad % depth}) without one")

    # A stable sort of the negated logits puts equal logits in ascending id order.
    order = np.argsort(-rows, axis=1, kind="stable")[:, :k]
    picked = np.take_along_axis(rows, order, axis=1)
    row_max = rows.max(axis=1, keepdims=True)
    lse = row_max + np.log(np.exp(rows - row_max).sum(axis=1, keepdims=True))
    return {
        "top_ids": order.astype(np.int32).reshape(groups, depth, k),
        "top_logp": (picked - lse).astype(np.float32).reshape(groups, depth, k),
    }
