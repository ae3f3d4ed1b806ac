"""The synthetic target model: a deterministic next-token model whose logits are exact integers.

The last 1, 2 and 3 tokens are hashed (uint32) into three embedding tables, the sum is clipped (the non-linearity)
and projected to the vocabulary. Every weight is a small integer stored as float32, so every logit is an integer
far below 2**24: the sums are exact in any order, with or without FMA or TF32, and this numpy version and the CUDA
one (kernels/synthetic_target.cu, which exports HIDDEN and CLIP as kdt_synthetic_target_hidden and _clip) agree
bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdt.pipeline.hashing import MASK32, mix

HIDDEN = 64               # the target's hidden width (= kdt_synthetic_target_hidden, fixed in the kernel)
CLIP = 6                  # the non-linearity: clip the hidden state to [-6, 6] (= kdt_synthetic_target_clip)
TABLE = 4096              # hash buckets per n-gram order (a power of two; the kernel takes TABLE - 1 as an argument)
EMB_RANGE = 3             # embedding entries are integers in [-3, 3]
OUT_RANGE = 7             # projection entries are integers in [-7, 7]
ORDER_SALTS = tuple((0x9E3779B9 * order) & MASK32 for order in (1, 2, 3))


@dataclass(frozen=True)
class TargetModel:
    emb: np.ndarray    # float32 [3, TABLE, HIDDEN]: one table per n-gram order, integer entries
    out_t: np.ndarray  # float32 [HIDDEN, vocab]: the projection, integer entries

    @classmethod
    def create(cls, seed: int, vocab: int) -> "TargetModel":
        rng = np.random.default_rng([seed, 1])
        emb = rng.integers(-EMB_RANGE, EMB_RANGE + 1, (3, TABLE, HIDDEN)).astype(np.float32)
        out_t = rng.integers(-OUT_RANGE, OUT_RANGE + 1, (HIDDEN, vocab)).astype(np.float32)
        return cls(emb, out_t)

    @property
    def vocab(self) -> int:
        return self.out_t.shape[1]

    def hidden(self, last3: np.ndarray) -> np.ndarray:
        """last3 int32 [R, 3] (oldest .. newest) -> float32 [R, HIDDEN]."""
        tokens = last3.astype(np.uint32)
        total = np.zeros((last3.shape[0], HIDDEN), np.float32)
        for order in (1, 2, 3):
            x = mix(np.full(last3.shape[0], ORDER_SALTS[order - 1], np.uint32))
            for back in range(order):  # newest first
                x = mix(x ^ tokens[:, 2 - back])
            total += self.emb[order - 1][(x & np.uint32(TABLE - 1)).astype(np.int64)]
        return np.clip(total, -float(CLIP), float(CLIP))

    def logits(self, last3: np.ndarray) -> np.ndarray:
        """last3 int32 [R, 3] -> float32 [R, vocab], every value an exact integer."""
        return self.hidden(last3) @ self.out_t
