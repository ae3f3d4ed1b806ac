"""`tree-accept`: greedy acceptance of the longest matching path (contract section `tree-accept`)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import BadInput, require, require_dtype, require_shape

LOGIT_DTYPES = (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16))
NONE = -1


def argmax_predict(target_logits: np.ndarray) -> np.ndarray:
    """The target's greedy token at each slot; equal logits go to the smaller id (np.argmax's first)."""
    require(isinstance(target_logits, np.ndarray) and target_logits.dtype in LOGIT_DTYPES, "target_logits",
            "a float32 or bfloat16 array", getattr(target_logits, "dtype", type(target_logits).__name__))
    require_shape(target_logits, "target_logits", (None, None, None))
    require(target_logits.shape[2] >= 1, "target_logits", "a vocabulary of at least 1", target_logits.shape[2])
    values = target_logits.astype(np.float32)
    require(not np.isnan(values).any(), "target_logits", "no NaN", "NaN")
    return values.argmax(axis=2).astype(np.int32)


def _walk(token, first_child, next_sibling, predict, max_depth: int, g: int) -> list[int]:
    """The accepted slots of one request, slot 0 first."""
    slots = token.shape[0]

    def follow(pointer: int, name: str, source: int) -> int:
        if pointer != NONE and not 0 <= pointer < slots:
            raise BadInput(f"{name}[{g}, {source}]", f"-1 or a slot in [0, {slots})", pointer)
        return pointer

    path = [0]
    while len(path) - 1 < max_depth:
        cur = path[-1]
        child = follow(int(first_child[cur]), "first_child", cur)
        seen = set()
        while child != NONE and token[child] != predict[cur]:
            if child in seen:
                raise BadInput(f"next_sibling[{g}]", "sibling lists without cycles", f"a cycle through slot {child}")
            seen.add(child)
            child = follow(int(next_sibling[child]), "next_sibling", child)
        if child == NONE:
            break
        if child in path:
            raise BadInput(f"first_child[{g}]", "a tree without cycles", f"slot {child} is its own ancestor")
        path.append(child)
    return path


def check_tree(token: np.ndarray, first_child: np.ndarray, next_sibling: np.ndarray, n_nodes: np.ndarray,
               max_depth) -> tuple[int, int]:
    """The tree inputs every walk takes (token, first_child, next_sibling int32 [G, N], n_nodes int32 [G],
    max_depth >= 1), checked; returns (G, N)."""
    for name, array in (("token", token), ("first_child", first_child), ("next_sibling", next_sibling)):
        require_dtype(array, name, np.int32)
        require_shape(array, name, (None, None))
        require_shape(array, name, token.shape)
    groups, slots = token.shape
    require(slots >= 1, "token", "at least one slot (the root)", slots)
    require_dtype(n_nodes, "n_nodes", np.int32)
    require_shape(n_nodes, "n_nodes", (groups,))
    require(isinstance(max_depth, (int, np.integer)) and max_depth >= 1, "max_depth", "an integer >= 1", max_depth)
    return groups, slots


def tree_accept(token: np.ndarray, first_child: np.ndarray, next_sibling: np.ndarray, n_nodes: np.ndarray,
                max_depth: int, target_predict: np.ndarray | None = None,
                target_logits: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The greedy walk for every request; exactly one of target_predict / target_logits is given."""
    require((target_predict is None) != (target_logits is None), "target_predict/target_logits",
            "exactly one of the two", "both" if target_predict is not None else "neither")
    groups, slots = check_tree(token, first_child, next_sibling, n_nodes, max_depth)
    if target_logits is not None:
        require_shape(target_logits, "target_logits", (groups, slots, None))
        target_predict = argmax_predict(target_logits)
    require_dtype(target_predict, "target_predict", np.int32)
    require_shape(target_predict, "target_predict", (groups, slots))

    width = max_depth + 1
    accept_len = np.zeros(groups, np.int32)
    accept_index = np.full((groups, width), NONE, np.int32)
    accept_tokens = np.full((groups, width), NONE, np.int32)
    for g in range(groups):
        path = _walk(token[g], first_child[g], next_sibling[g], target_predict[g], max_depth, g)
        accepted = len(path) - 1
        accept_len[g] = accepted
        accept_index[g, : accepted + 1] = path
        accept_tokens[g, :accepted] = token[g, path[1:]]
        accept_tokens[g, accepted] = target_predict[g, path[-1]]
    return {"accept_len": accept_len, "accept_index": accept_index, "accept_tokens": accept_tokens}
