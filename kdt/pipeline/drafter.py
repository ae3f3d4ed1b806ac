"""The drafter: logits for the next K positions, of a tunable quality, written once for numpy and CuPy (`xp`).

For each of the K positions the truth is the target's greedy token given the committed text and the drafter's own
earlier guesses. With probability `quality` the drafter's top choice is the truth; otherwise it is a wrong token,
and then, with probability `quality` again, the truth is its second choice (a near miss the tree can still
accept), else the truth gets no mass at all (-inf), so a quality-0 drafter is never accepted and a quality-1
drafter is accepted to the full depth K. Three more candidates and a quantised noise floor give the tree
alternatives. All randomness is a counter-based hash of (seed, step, request, position, token), so the numpy and
CuPy drafters produce the same logits.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from kdt.pipeline.hashing import counter_key, hash_of, mix, uniform

# A noise floor in [0, 2) quantised to 2**-12 (so every sum below is exact in float32), three spread candidates,
# the near-miss truth and the top guess. The top guess leads the next candidate by at least 4 nats, so a
# full-depth chain of top guesses (K <= 64) outscores every alternative: with B >= K the tree holds the drafter's
# whole top-1 chain.
NOISE_SHIFT = 19          # 32 - 13 bits of noise
NOISE_SCALE = 2.0**-12
GUESS_BOOST = 16.0
NEAR_BOOST = 12.0
SPREAD_BOOSTS = (10.0, 9.0, 8.0)
SALT_RIGHT, SALT_NEAR, SALT_WRONG, SALT_NOISE, SALT_SPREAD = 0x1001, 0x1002, 0x1003, 0x1004, 0x1010


def _noise(xp, row_key, tokens):
    """The noise floor at `tokens` of rows hashed to `row_key`: k * 2**-12, k in [0, 8192)."""
    bits = mix(row_key ^ tokens.astype(xp.uint32)) >> np.uint32(NOISE_SHIFT)
    return bits.astype(xp.float32) * np.float32(NOISE_SCALE)


def draft_logits(xp, target_greedy: Callable, committed_last3, *, step: int, seed: int, depth: int, vocab: int,
                 quality: float):
    """float32 [G, K, vocab]: the drafter's logits for the next K positions.

    `target_greedy(last3 [G, 3] int32) -> [G] int32` is the target's greedy token; numpy or CuPy (xp).
    """
    groups = committed_last3.shape[0]
    request = xp.arange(groups, dtype=xp.uint32)
    rows = xp.arange(groups, dtype=xp.int64)
    every_token = xp.arange(vocab, dtype=xp.uint32)[None, :]
    logits = xp.empty((groups, depth, vocab), xp.float32)
    context = committed_last3
    for position in range(depth):
        def key(salt: int) -> int:
            return counter_key(seed, salt, step, position)

        truth = target_greedy(context)
        right = uniform(xp, key(SALT_RIGHT), request) < quality
        near = uniform(xp, key(SALT_NEAR), request) < quality
        offset = (hash_of(xp, key(SALT_WRONG), request) % np.uint32(vocab - 1)).astype(xp.int32)
        wrong = (truth + np.int32(1) + offset) % np.int32(vocab)  # never the truth
        guess = xp.where(right, truth, wrong).astype(xp.int32)

        row_key = hash_of(xp, key(SALT_NOISE), request)
        row = _noise(xp, row_key[:, None], every_token)
        # later assignments win: spread candidates, then the truth on a miss, then the top guess
        for rank, boost in enumerate(SPREAD_BOOSTS):
            spread = (hash_of(xp, key(SALT_SPREAD + rank), request) % np.uint32(vocab)).astype(xp.int64)
            row[rows, spread] = _noise(xp, row_key, spread) + np.float32(boost)
        missed = xp.where(near, _noise(xp, row_key, truth) + np.float32(NEAR_BOOST), np.float32(-np.inf))
        row[rows, truth] = xp.where(right, row[rows, truth], missed.astype(xp.float32))
        row[rows, guess] = _noise(xp, row_key, guess) + np.float32(GUESS_BOOST)
        logits[:, position, :] = row
        context = xp.concatenate([context[:, 1:], guess[:, None]], axis=1)
    return logits
