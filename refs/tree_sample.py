"""`tree-sample`: lossless sampling acceptance with temperature, top-k and top-p (contract section `tree-sample`).

At each node of the walk the target's token is drawn from its filtered distribution (a Gumbel-max over the kept
set, its noise from Philox4x32-10 keyed by seed and absolute position); the first child carrying that token is
accepted, and the walk goes on from it; otherwise the drawn token is the bonus. Every draw also reports its
decision margin (the contract's "Decision margins"), so a case generator can keep only decisive draws.

Everything a draw decides is computed exactly or in float64: the Philox words in integers (uint64 products of
uint32 words), the uniforms from them exactly, z, the softmax, the cumulative sums and the Gumbel scores in
float64.
"""

from __future__ import annotations

import numpy as np

from .errors import BadInput, require, require_dtype, require_shape
from .tree_accept import LOGIT_DTYPES, NONE, check_tree

EPS = 1e-4                          # the contract's decision margin
PHILOX_ROUNDS = 10
PHILOX_M = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))   # Random123's round multipliers
PHILOX_W = (np.uint64(0x9E3779B9), np.uint64(0xBB67AE85))   # its key increments (golden ratio, sqrt(3) - 1)
WORD = np.uint64(0xFFFFFFFF)
CHUNK_ELEMENTS = 1 << 20            # rows are drawn in chunks of about this many logits, to bound the temporaries


def _philox_words(c0, c1, c2, c3, k0, k1) -> tuple[np.ndarray, ...]:
    """Philox4x32-10 on uint64 arrays holding 32-bit words; each 32 x 32-bit product is exact in uint64."""
    for round_ in range(PHILOX_ROUNDS):
        if round_:
            k0, k1 = (k0 + PHILOX_W[0]) & WORD, (k1 + PHILOX_W[1]) & WORD
        p0, p1 = PHILOX_M[0] * c0, PHILOX_M[1] * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & WORD, (p0 >> 32) ^ c3 ^ k1, p0 & WORD
    return c0, c1, c2, c3


def _integers(values, argument: str, bits: int) -> np.ndarray:
    """`values` (ints or an integer array) as uint64, each required in [0, 2^bits)."""
    array = np.asarray(values)
    require(array.dtype.kind in "ui", argument, "integers", array.dtype)
    # Negative values wrap in the cast, but fail >= 0; two shifts, as one by 64 bits is undefined.
    inside = (array >= 0) & (array.astype(np.uint64) >> (bits - 1) >> 1 == 0)
    if not inside.all():
        raise BadInput(argument, f"integers in [0, 2^{bits})", array.flat[int(np.argmin(inside))])
    return array.astype(np.uint64)


def philox4x32_10(counter, key) -> np.ndarray:
    """Philox4x32-10 as in Random123 and cuRAND.

    Parameters
    ----------
    counter : array_like of int, shape (..., 4)
        The four 32-bit counter words.
    key : array_like of int, shape (..., 2)
        The two 32-bit key words; broadcast against `counter`'s leading axes.

    Returns
    -------
    numpy.ndarray of uint32, shape (..., 4)
        The four output words.
    """
    counter, key = _integers(counter, "counter", 32), _integers(key, "key", 32)
    require(counter.ndim >= 1 and counter.shape[-1] == 4, "counter", "shape (..., 4)", counter.shape)
    require(key.ndim >= 1 and key.shape[-1] == 2, "key", "shape (..., 2)", key.shape)
    words = _philox_words(*np.moveaxis(counter, -1, 0), *np.moveaxis(key, -1, 0))
    return np.stack(np.broadcast_arrays(*words), axis=-1).astype(np.uint32)


def uniforms(seed, position, vocab: int) -> np.ndarray:
    """The contract's uniform u_t of every token t < vocab for a draw at `position` under `seed`.

    Word t % 4 of Philox4x32-10 with counter (t // 4, 0, position mod 2^32, position div 2^32) and key
    (seed mod 2^32, seed div 2^32), mapped to ((w >> 8) + 0.5) * 2^-24. That value needs 25 significant bits, so it
    is returned in float64 (exact); float32 would round the largest words up to 1.

    Parameters
    ----------
    seed : int or array_like of int
        In [0, 2^64).
    position : int or array_like of int
        In [0, 2^63); broadcast against `seed`.
    vocab : int
        Tokens per draw, >= 1.

    Returns
    -------
    numpy.ndarray of float64, shape (broadcast(seed, position).shape + (vocab,))
        Strictly inside (0, 1).
    """
    seed, position = np.broadcast_arrays(_integers(seed, "seed", 64), _integers(position, "position", 63))
    require(isinstance(vocab, (int, np.integer)) and vocab >= 1, "vocab", "an integer >= 1", vocab)
    blocks = np.arange(-(-vocab // 4), dtype=np.uint64)
    words = _philox_words(blocks, np.uint64(0), (position & WORD)[..., None], (position >> 32)[..., None],
                          (seed & WORD)[..., None], (seed >> 32)[..., None])
    words = np.stack(np.broadcast_arrays(*words), axis=-1).reshape(*seed.shape, -1)[..., :vocab]
    return ((words >> 8).astype(np.float64) + 0.5) * 2.0**-24


def _require_each(ok: np.ndarray, argument: str, expected: str, values: np.ndarray) -> None:
    if not ok.all():
        bad = int(np.argmin(ok))
        raise BadInput(f"{argument}[{bad}]", expected, values[bad])


def _check_params(temperature, top_k, top_p, seed, position, count: int, vocab: int) -> None:
    """The per-request (or per-row) sampling parameters: dtypes, shapes [count] and the contract's ranges."""
    for name, array, dtype in (("temperature", temperature, np.float32), ("top_k", top_k, np.int32),
                               ("top_p", top_p, np.float32), ("seed", seed, np.uint64),
                               ("position", position, np.int64)):
        require(isinstance(array, np.ndarray), name, f"a numpy array of {np.dtype(dtype)}", type(array).__name__)
        require_dtype(array, name, dtype)
        require_shape(array, name, (count,))
    # The contract lists temperature < 0 and NaN; +inf goes too: it makes every -inf logit NaN (-inf / inf).
    _require_each(np.isfinite(temperature) & (temperature >= 0), "temperature", "a finite value >= 0 (0: greedy)",
                  temperature)
    _require_each((top_k >= 0) & (top_k <= vocab), "top_k", f"0 (off) or 1..vocab={vocab}", top_k)
    _require_each((top_p > 0) & (top_p <= 1), "top_p", "a value in (0, 1] (1: off)", top_p)
    _require_each(position >= 0, "position", "an absolute position >= 0", position)


def _row_values(rows: np.ndarray, label) -> np.ndarray:
    """The rows as float32, each required free of NaN and +inf and to hold a logit above -inf (else its kept set is
    empty); `label(i)` names row i in the error."""
    values = rows.astype(np.float32)
    for bad, expected, found in ((np.isnan(values).any(axis=1), "logits without NaN", "NaN"),
                                 (np.isposinf(values).any(axis=1), "logits without +inf", "+inf"),
                                 (np.isneginf(values).all(axis=1), "a logit above -inf (a non-empty kept set)",
                                  "all -inf")):
        if bad.any():
            raise BadInput(label(int(np.argmax(bad))), expected, found)
    return values


def _band(z):
    """Half-width of the knife's-edge band around z: EPS * max(1, |z|)."""
    return EPS * np.maximum(1.0, np.abs(z))


def _top_k(values, z, order, rank, top_k):
    """(kept, in doubt) [D, vocab] for top-k.

    In doubt: z within EPS * max(1, |z_k|) of the k-th largest z_k. Exact ties (equal logits) are ordered by id the
    same way everywhere, so a band holding one logit value is no knife's edge; a band holding two is one for every
    token in it, the k-th's own ties included (one of them may swap with a near-equal token below the k-th).
    """
    vocab = z.shape[1]
    k = np.where((top_k == 0) | (top_k >= vocab), vocab, top_k).astype(np.int64)
    kept = rank < k[:, None]
    kth = np.take_along_axis(order, (k - 1)[:, None], axis=1)
    z_k, logit_k = np.take_along_axis(z, kth, axis=1), np.take_along_axis(values, kth, axis=1)
    with np.errstate(invalid="ignore"):  # -inf - -inf
        band = np.abs(z - z_k) <= _band(z_k)
    mixed = (band & (values != logit_k)).any(axis=1, keepdims=True)
    # Nothing is in doubt when every token is kept or when z_k = -inf (fewer than k finite tokens, all kept).
    limited = (k < vocab)[:, None] & np.isfinite(z_k)
    return kept, band & mixed & limited


def _count_ahead(zs, bound, strict: bool):
    """For each row of zs [D, V] (descending) and each bound[:, j] (non-increasing in j): how many zs are > bound
    (strict) or >= bound. One stable joint sort: bounds placed before the data sort ahead of data equal to them,
    placed after it behind; bound j has exactly j bounds ahead of it, so its place minus j counts the data ahead."""
    width = zs.shape[1]
    joint = np.concatenate([bound, zs] if strict else [zs, bound], axis=1)
    order = np.argsort(-joint, axis=1, kind="stable")
    place = np.empty_like(order)
    np.put_along_axis(place, order, np.arange(2 * width), axis=1)
    return (place[:, :width] if strict else place[:, width:]) - np.arange(width)


def _top_p(z, order, rank, kept_k, doubt_k, top_p):
    """(kept, surely in, surely out) [D, vocab] for top-p over the kept-by-top-k set.

    Kept: the token at probability rank j when C_{j-1}, the probability of the j-1 more probable ones, is below
    top_p (the shortest prefix whose cumulative probability reaches top_p); top_p = 1 keeps every token.
    The contract: surely in if C_{j-1} <= top_p - EPS, surely out if C_{j-1} >= top_p + EPS. That assumes the
    order and the top-k set are certain; they are not where two tokens of different logits have z within the band
    (nearly equal probabilities, which float32 may round equal and then order by id) or where the top-k set is in
    doubt (another set, another normalisation). So C_{j-1} is bounded over every order and top-k set an
    implementation may reach: `low` counts the surely-kept tokens surely ahead (z above the token's band, or an
    equal logit and a smaller id) over the largest normalisation, `high` every possibly-kept token possibly ahead
    (z not below the band; equal logits only with a smaller id) over the smallest. Without near ties and top-k
    doubt both equal C_{j-1}: the contract's rule.
    """
    off = (top_p >= 1)[:, None]
    if off.all():
        return np.ones_like(kept_k), np.ones_like(kept_k), np.zeros_like(kept_k)
    p = top_p.astype(np.float64)[:, None]
    width = z.shape[1]
    weight = np.exp(z - z.max(axis=1, keepdims=True))  # the row's max is finite: it has a logit above -inf

    def ahead_sums(mask):  # [D, V + 1]: the weight of mask's tokens ahead of each sorted position
        sums = np.zeros((len(z), width + 1))
        np.cumsum(np.take_along_axis(np.where(mask, weight, 0.0), order, axis=1), axis=1, out=sums[:, 1:])
        return sums

    def at(sums, index):
        return np.take_along_axis(sums, index, axis=1)

    exact = ahead_sums(kept_k)
    kept = off | (np.take_along_axis(exact[:, :-1] / exact[:, -1:], rank, axis=1) < p)

    zs = np.take_along_axis(z, order, axis=1)
    finite = np.isfinite(zs)  # -inf tokens weigh nothing; their bounds need only keep the order
    with np.errstate(invalid="ignore"):
        surely_ahead = _count_ahead(zs, np.where(finite, zs + _band(zs), -np.inf), strict=True)
        possibly_ahead = _count_ahead(zs, np.where(finite, zs - _band(zs), -np.inf), strict=False)
    tie_start = _count_ahead(zs, zs, strict=True)   # the sorted span of each token's equal logits
    tie_end = _count_ahead(zs, zs, strict=False)
    sorted_at = np.broadcast_to(np.arange(width), zs.shape)
    sure, maybe = ahead_sums(kept_k & ~doubt_k), ahead_sums(kept_k | doubt_k)
    with np.errstate(divide="ignore", invalid="ignore"):  # nothing surely kept: high is NaN, never surely in
        low = (at(sure, surely_ahead) + at(sure, sorted_at) - at(sure, tie_start)) / maybe[:, -1:]
        high = (at(maybe, possibly_ahead) - at(maybe, tie_end) + at(maybe, sorted_at)) / sure[:, -1:]
    low, high = np.take_along_axis(low, rank, axis=1), np.take_along_axis(high, rank, axis=1)
    return kept, off | (high <= p - EPS), ~off & (low >= p + EPS)


def _margin(score, sure, doubt):
    """(s_w - max s_c) / max(1, |s_w|): s_w the Gumbel winner among the surely-kept tokens, c over the other
    surely-kept and the in-doubt tokens. >= EPS: decisive; -inf when nothing is surely kept."""
    winner = np.where(sure, score, -np.inf).argmax(axis=1)[:, None]
    best = np.take_along_axis(score, winner, axis=1)[:, 0]
    rivals = np.where(sure | doubt, score, -np.inf)
    np.put_along_axis(rivals, winner, -np.inf, axis=1)
    with np.errstate(invalid="ignore"):  # -inf - -inf, where nothing is surely kept
        margin = (best - rivals.max(axis=1)) / np.maximum(1.0, np.abs(best))
    return np.where(sure.any(axis=1) & np.isfinite(best), margin, -np.inf)


def _gumbel_draw(values, temperature, top_k, top_p, seed, position):
    """Draws at temperature > 0: (token, margin)."""
    vocab = values.shape[1]
    z = values.astype(np.float64) / temperature.astype(np.float64)[:, None]
    order = np.argsort(-z, axis=1, kind="stable")  # z descending, equal z (equal logits): smaller id first
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(vocab), axis=1)
    kept_k, doubt_k = _top_k(values, z, order, rank, top_k)
    kept_p, sure_in_p, sure_out_p = _top_p(z, order, rank, kept_k, doubt_k, top_p)
    score = z - np.log(-np.log(uniforms(seed, position, vocab)))
    token = np.where(kept_k & kept_p, score, -np.inf).argmax(axis=1)  # equal scores: smaller id
    sure = kept_k & ~doubt_k & sure_in_p
    doubt = (kept_k | doubt_k) & ~sure_out_p & ~sure
    return token, _margin(score, sure, doubt)


def _draw(values, temperature, top_k, top_p, seed, position):
    """(token int32 [D], margin float64 [D]) of one draw per row of checked float32 `values` [D, vocab]."""
    token = values.argmax(axis=1).astype(np.int32)  # temperature 0: the argmax, equal logits to the smaller id,
    margin = np.full(len(values), np.inf)            # exact in any implementation
    hot = np.flatnonzero(temperature > 0)
    step = max(1, CHUNK_ELEMENTS // values.shape[1])
    for start in range(0, len(hot), step):
        rows = hot[start:start + step]
        token[rows], margin[rows] = _gumbel_draw(values[rows], temperature[rows], top_k[rows], top_p[rows],
                                                 seed[rows], position[rows])
    return token, margin


def sample(rows: np.ndarray, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray, seed: np.ndarray,
           position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One draw of the contract's sample() per row, with its decision margin.

    Parameters
    ----------
    rows : numpy.ndarray, float32 or bfloat16, shape (D, vocab)
        Target logits; each row free of NaN and +inf, with a logit above -inf.
    temperature, top_k, top_p, seed, position : numpy.ndarray, shape (D,)
        float32 (>= 0, 0: greedy), int32 (0: off, else 1..vocab), float32 (in (0, 1], 1: off), uint64, int64
        (>= 0): the parameters and the absolute position of each row's draw.

    Returns
    -------
    token : numpy.ndarray of int32, shape (D,)
    margin : numpy.ndarray of float64, shape (D,)
        (winner - best rival) / max(1, |winner|) in Gumbel score, the contract's decision margin: a draw is
        decisive when it is >= EPS; +inf at temperature 0 and where nothing rivals the winner.
    """
    require(isinstance(rows, np.ndarray) and rows.dtype in LOGIT_DTYPES, "rows", "a float32 or bfloat16 array",
            getattr(rows, "dtype", type(rows).__name__))
    require_shape(rows, "rows", (None, None))
    count, vocab = rows.shape
    require(vocab >= 1, "rows", "a vocabulary of at least 1", vocab)
    _check_params(temperature, top_k, top_p, seed, position, count, vocab)
    return _draw(_row_values(rows, lambda i: f"rows[{i}]"), temperature, top_k, top_p, seed, position)


def _follow(pointers, walking, source, name: str) -> np.ndarray:
    """pointers[walking, source], each required to be -1 or a slot."""
    slots = pointers.shape[1]
    target = pointers[walking, source].astype(np.int64)
    bad = (target != NONE) & ((target < 0) | (target >= slots))
    if bad.any():
        i = int(np.argmax(bad))
        raise BadInput(f"{name}[{walking[i]}, {source[i]}]", f"-1 or a slot in [0, {slots})", int(target[i]))
    return target


def _matching_child(token, first_child, next_sibling, walking, cur, drawn) -> np.ndarray:
    """For each walking request, the first child of its slot cur (in first_child / next_sibling order) whose token
    is the drawn one, or -1; all requests scan their sibling lists in lockstep."""
    slots = token.shape[1]
    found = np.full(len(walking), NONE, np.int64)
    child = _follow(first_child, walking, cur, "first_child")
    scanning = np.flatnonzero(child != NONE)
    for _ in range(slots):
        hit = token[walking[scanning], child[scanning]] == drawn[scanning]
        found[scanning[hit]] = child[scanning[hit]]
        scanning = scanning[~hit]
        child[scanning] = _follow(next_sibling, walking[scanning], child[scanning], "next_sibling")
        scanning = scanning[child[scanning] != NONE]
    if scanning.size:  # still scanning after N slots: the list has a cycle
        raise BadInput(f"next_sibling[{walking[scanning[0]]}]", "sibling lists without cycles",
                       f"a cycle through slot {child[scanning[0]]}")
    return found


def tree_sample(token: np.ndarray, first_child: np.ndarray, next_sibling: np.ndarray, n_nodes: np.ndarray,
                max_depth: int, target_logits: np.ndarray, temperature: np.ndarray, top_k: np.ndarray,
                top_p: np.ndarray, seed: np.ndarray, position: np.ndarray) -> dict[str, np.ndarray]:
    """The sampling walk for every request.

    Parameters
    ----------
    token, first_child, next_sibling : numpy.ndarray of int32, shape (G, N)
        Any tree in this encoding (siblings in any slot order, any token at the root). Pointers are followed only
        inside [0, N); one out of range, or a cycle met on the walk, is a BadInput.
    n_nodes : numpy.ndarray of int32, shape (G,)
        Checked for shape, not read: the walk follows the pointers as written (as `tree-accept`).
    max_depth : int
        K >= 1: at most K nodes are accepted.
    target_logits : numpy.ndarray, float32 or bfloat16, shape (G, N, vocab)
        Row i: the target's logits for the token after slot i. Only the rows the walk visits are checked (no NaN,
        no +inf, a logit above -inf) and read; the others may hold anything.
    temperature, top_k, top_p, seed, position : numpy.ndarray, shape (G,)
        Per request, as in `sample`; position is that of the token drawn at the root (the draw at depth d uses
        position + d, so position + K must stay below 2^63).

    Returns
    -------
    dict of numpy.ndarray
        The contract's outputs `accept_len` int32 [G], `accept_index` int32 [G, K+1] (slot 0, the accepted slots,
        then -1), `accept_tokens` int32 [G, K+1] (the accepted tokens, the bonus token, then -1); and, for case
        generators, `min_margin` float64 [G] (the smallest decision margin of the request's draws) and `decisive`
        bool [G] (min_margin >= EPS: every draw was decisive).
    """
    groups, slots = check_tree(token, first_child, next_sibling, n_nodes, max_depth)
    require(isinstance(target_logits, np.ndarray) and target_logits.dtype in LOGIT_DTYPES, "target_logits",
            "a float32 or bfloat16 array", getattr(target_logits, "dtype", type(target_logits).__name__))
    require_shape(target_logits, "target_logits", (groups, slots, None))
    vocab = target_logits.shape[2]
    require(vocab >= 1, "target_logits", "a vocabulary of at least 1", vocab)
    _check_params(temperature, top_k, top_p, seed, position, groups, vocab)
    last = 2**63 - 1 - int(max_depth)
    _require_each(position <= last, "position", f"at most 2^63 - 1 - max_depth = {last} (position + K fits int64)",
                  position)

    width = int(max_depth) + 1
    accept_len = np.zeros(groups, np.int32)
    accept_index = np.full((groups, width), NONE, np.int32)
    accept_index[:, 0] = 0
    accept_tokens = np.full((groups, width), NONE, np.int32)
    min_margin = np.full(groups, np.inf)
    cur = np.zeros(groups, np.int64)
    walking = np.arange(groups)
    for depth in range(width):  # at depth K every walk stops, drawing its bonus
        here = cur[walking]
        values = _row_values(target_logits[walking, here], lambda i: f"target_logits[{walking[i]}, {here[i]}]")
        drawn, margin = _draw(values, temperature[walking], top_k[walking], top_p[walking], seed[walking],
                              position[walking] + depth)
        min_margin[walking] = np.minimum(min_margin[walking], margin)
        child = (_matching_child(token, first_child, next_sibling, walking, here, drawn) if depth < max_depth
                 else np.full(len(walking), NONE))
        stop = child == NONE
        accept_len[walking[stop]] = depth
        accept_tokens[walking[stop], depth] = drawn[stop]  # the bonus token
        walking, child = walking[~stop], child[~stop]
        if not walking.size:
            break
        looped = (accept_index[walking, : depth + 1] == child[:, None]).any(axis=1)
        if looped.any():
            i = int(np.argmax(looped))
            raise BadInput(f"first_child[{walking[i]}]", "a tree without cycles",
                           f"slot {child[i]} is its own ancestor")
        accept_index[walking, depth + 1] = child
        accept_tokens[walking, depth] = token[walking, child]
        cur[walking] = child
    return {"accept_len": accept_len, "accept_index": accept_index, "accept_tokens": accept_tokens,
            "min_margin": min_margin, "decisive": min_margin >= EPS}
