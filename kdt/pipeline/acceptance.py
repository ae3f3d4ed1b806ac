"""The acceptance rule, in one place: greedy.

Three things follow from the rule, and every other module takes them from here: the token the target emits for
its logits (`greedy`), the plain decoding speculative decoding must reproduce (`greedy_decode`), and which draft
tokens of a tree the target keeps, with the bonus token (`accept` on the CPU, `accept_on_gpu` through kdt.ops).
Another rule (sampling with a temperature, top-k, top-p) is another version of this module.
"""

from __future__ import annotations

import numpy as np

import kdt.refs.tree_accept as ref_tree_accept


def greedy(xp, logits):
    """argmax over the last axis, equal logits to the smaller id (stated, not left to the library)."""
    vocab = logits.shape[-1]
    best = logits.max(axis=-1, keepdims=True)
    ids = xp.arange(vocab, dtype=xp.int32)
    return xp.where(logits == best, ids, np.int32(vocab)).min(axis=-1).astype(xp.int32)


def greedy_decode(model, prompts: np.ndarray, tokens: int) -> np.ndarray:
    """The target alone (a TargetModel), one token at a time: what speculative decoding must reproduce.
    -> int32 [G, tokens]."""
    sequence = prompts.astype(np.int32)
    out = np.empty((prompts.shape[0], tokens), np.int32)
    for position in range(tokens):
        nxt = greedy(np, model.logits(sequence[:, -3:]))
        out[:, position] = nxt
        sequence = np.concatenate([sequence[:, -2:], nxt[:, None]], axis=1)
    return out


def accept(tree: dict[str, np.ndarray], target_logits: np.ndarray, max_depth: int) -> dict[str, np.ndarray]:
    """The reference (numpy): tree-build's outputs and the target's logits at every slot -> accept_len,
    accept_index, accept_tokens (the accepted tokens, then the bonus)."""
    return ref_tree_accept.tree_accept(tree["token"], tree["first_child"], tree["next_sibling"], tree["n_nodes"],
                                       max_depth, target_logits=target_logits)


def _gpu_inputs(tree, target_logits) -> dict:
    return {"token": tree.token, "first_child": tree.first_child, "next_sibling": tree.next_sibling,
            "n_nodes": tree.n_nodes, "target_logits": target_logits}


def accept_on_gpu(tree, target_logits, max_depth: int, *, out=None, workspace=None):
    """`accept` with the tree-accept kernel: `tree` a kdt.ops.Tree of CuPy arrays -> kdt.ops.Acceptance."""
    from kdt import ops

    return ops.Acceptance(**ops.run("tree-accept", _gpu_inputs(tree, target_logits), {"max_depth": max_depth},
                                    out=out, workspace=workspace))


def gpu_workspace(tree, target_logits, max_depth: int):
    """The workspace `accept_on_gpu` needs for these arrays (None if none)."""
    from kdt import ops

    return ops.workspace_for("tree-accept", _gpu_inputs(tree, target_logits), {"max_depth": max_depth})
