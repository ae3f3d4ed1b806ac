"""SGLang's draft-tree encoding to and from kdt's.

SGLang hands a batch of draft trees to its verifiers (`verify_tree_greedy`, `tree_speculative_sampling_target_only`)
as int64 arrays of shape [bs, n], n = draft tokens per request, as `build_tree_kernel_efficient` (EAGLE) and
`reconstruct_indices_from_tree_mask` (ngram) write them
(https://github.com/sgl-project/sglang/blob/main/sgl-kernel/csrc/speculative/eagle_utils.cu,
https://github.com/sgl-project/sglang/blob/main/sgl-kernel/csrc/speculative/ngram_utils.cu):

- `retrive_index[b, i] = b * n + i`: slot i's flat index over the batch, the row its token and its target logits
  take in the flattened [bs * n] arrays, and what SGLang's `accept_index` holds;
- `retrive_next_token[b, i]`: slot i's first child, and `retrive_next_sibling[b, i]`: its next sibling, both as slot
  indices local to request b (the verifiers read `retrive_next_token[b * n + cur]` with a local `cur`), -1 = none;
- the draft tokens, `candidates` [bs, n] (`draft_token` flattened to [bs * n] in EAGLE's verify input): slot 0
  holds the last verified token, the root.

kdt's encoding is the same tree with local int32 pointers (`first_child`, `next_sibling`) and `token` [G, N], so
the conversion is a checked cast; SGLang verifies every slot, so a tree from SGLang has n_nodes = N - 1.
"""

from __future__ import annotations

import numpy as np

from kdt.refs.errors import BadInput, require, require_dtype, require_shape

NONE = -1
INT32 = np.iinfo(np.int32)


def _require_tree(token, first_child, next_sibling, names: tuple[str, str, str], dtype) -> None:
    """Three same-shaped [G, N] arrays of `dtype` forming one tree per request: tokens that fit int32, every pointer
    -1 or a local slot, the root without siblings and pointed at by none, every other slot by at most one (the slots
    the root reaches then form a tree; slots it does not reach, such as kdt's unused ones, are carried as they
    are)."""
    for name, array in zip(names, (token, first_child, next_sibling)):
        require(isinstance(array, np.ndarray), name, f"a numpy array of {np.dtype(dtype)}", type(array).__name__)
        require_dtype(array, name, dtype)
        require_shape(array, name, (None, None))
        require_shape(array, name, token.shape)
    groups, slots = token.shape
    require(slots >= 1, names[0], "at least one slot (the root)", slots)
    for name, array, bad, expected in (
            (names[0], token, (token < INT32.min) | (token > INT32.max), "a token id that fits int32"),
            (names[2], next_sibling[:, :1], next_sibling[:, :1] != NONE, "-1: the root has no siblings")):
        if bad.any():
            g, i = np.argwhere(bad)[0]
            raise BadInput(f"{name}[{g}, {i}]", expected, int(array[g, i]))

    request = np.arange(groups)[:, None]
    pointers = []
    for name, array in zip(names[1:], (first_child, next_sibling)):
        bad = (array != NONE) & ((array < 0) | (array >= slots))
        if bad.any():
            g, i = np.argwhere(bad)[0]
            raise BadInput(f"{name}[{g}, {i}]", f"-1 or a slot in [0, {slots})", int(array[g, i]))
        pointers.append((name, array, np.where(array == NONE, -1, request * slots + array)))
    flat = np.concatenate([targets.ravel() for _, _, targets in pointers])
    incoming = np.bincount(flat[flat >= 0], minlength=groups * slots).reshape(groups, slots)
    incoming[:, 0] += 1  # the root has no parent: one pointer at it is one too many
    if (incoming > 1).any():
        g, slot = (int(v) for v in np.argwhere(incoming > 1)[0])
        # name the last pointer at the slot in first_child-then-next_sibling order, the one that makes it too many
        name, source = [(name, int(i)) for name, array, _ in pointers for i in np.flatnonzero(array[g] == slot)][-1]
        what = "the root" if slot == 0 else f"slot {slot}"
        raise BadInput(f"{name}[{g}, {source}]", "a tree: no pointer at the root, at most one at any other slot",
                       f"{what} pointed at again")


def from_sglang(retrive_index: np.ndarray, retrive_next_token: np.ndarray, retrive_next_sibling: np.ndarray,
                candidates: np.ndarray) -> dict[str, np.ndarray]:
    """SGLang's trees as kdt's `tree-accept` / `tree-sample` inputs.

    Parameters
    ----------
    retrive_index, retrive_next_token, retrive_next_sibling, candidates : numpy.ndarray of int64, shape (bs, n)
        As described in the module docstring: retrive_index[b, i] must be b * n + i; pointers local, -1 = none;
        candidates the slots' tokens (slot 0: the root), each fitting int32.

    Returns
    -------
    dict of numpy.ndarray
        `token`, `first_child`, `next_sibling` int32 [bs, n] and `n_nodes` int32 [bs] (n - 1: SGLang verifies
        every slot).
    """
    names = ("candidates", "retrive_next_token", "retrive_next_sibling")
    _require_tree(candidates, retrive_next_token, retrive_next_sibling, names, np.int64)
    require(isinstance(retrive_index, np.ndarray), "retrive_index", "a numpy array of int64",
            type(retrive_index).__name__)
    require_dtype(retrive_index, "retrive_index", np.int64)
    require_shape(retrive_index, "retrive_index", candidates.shape)
    groups, slots = candidates.shape
    flat = np.arange(groups * slots, dtype=np.int64).reshape(groups, slots)
    if (retrive_index != flat).any():
        g, i = np.argwhere(retrive_index != flat)[0]
        raise BadInput(f"retrive_index[{g}, {i}]", f"the flat slot index b * n + i = {flat[g, i]}",
                       int(retrive_index[g, i]))
    return {"token": candidates.astype(np.int32), "first_child": retrive_next_token.astype(np.int32),
            "next_sibling": retrive_next_sibling.astype(np.int32), "n_nodes": np.full(groups, slots - 1, np.int32)}


def to_sglang(token: np.ndarray, first_child: np.ndarray, next_sibling: np.ndarray) -> dict[str, np.ndarray]:
    """kdt's trees (as `tree-build` emits them, or any tree in that encoding) in SGLang's encoding.

    Parameters
    ----------
    token, first_child, next_sibling : numpy.ndarray of int32, shape (G, N)
        Local pointers, -1 = none. Slots beyond a request's n_nodes (token -1, no pointers) are carried as they
        are: SGLang verifies every slot, so give it trees with n_nodes = N - 1 or ignore those slots' results.

    Returns
    -------
    dict of numpy.ndarray
        `retrive_index`, `retrive_next_token`, `retrive_next_sibling`, `candidates`, int64 [G, N].
    """
    _require_tree(token, first_child, next_sibling, ("token", "first_child", "next_sibling"), np.int32)
    groups, slots = token.shape
    return {"retrive_index": np.arange(groups * slots, dtype=np.int64).reshape(groups, slots),
            "retrive_next_token": first_child.astype(np.int64),
            "retrive_next_sibling": next_sibling.astype(np.int64),
            "candidates": token.astype(np.int64)}


SGLANG_TREE = ("retrive_index", "retrive_next_token", "retrive_next_sibling", "candidates")


def kdt_tree_inputs(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A stage's inputs with a tree in SGLang's encoding (all four of `SGLANG_TREE`, no `token` / `first_child` /
    `next_sibling`) turned into kdt's, `n_nodes` included (N - 1 unless given); any other inputs unchanged. What
    `kdt gen-golden --inputs` applies to captured files, so a batch captured from an SGLang engine runs through
    `tree-accept` as it is."""
    if not any(name in inputs for name in SGLANG_TREE):
        return inputs
    missing = [name for name in SGLANG_TREE if name not in inputs]
    if missing:
        raise BadInput(missing[0], "all of " + ", ".join(SGLANG_TREE) + " (SGLang's tree encoding)", "missing")
    both = [name for name in ("token", "first_child", "next_sibling") if name in inputs]
    if both:
        raise BadInput(both[0], "one tree encoding: kdt's or SGLang's, not both", "both given")
    converted = from_sglang(*(inputs[name] for name in SGLANG_TREE))
    if "n_nodes" in inputs:
        converted.pop("n_nodes")
    return {**{key: value for key, value in inputs.items() if key not in SGLANG_TREE}, **converted}
