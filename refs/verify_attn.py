"""`verify-attn`: MLA (absorbed) attention of the tree over the paged prefix and itself, in float64."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import require, require_dtype, require_shape

PAGE_SIZE = 64
MASK_BITS = 32
BF16 = np.dtype(ml_dtypes.bfloat16)


def unpack_mask(mask: np.ndarray, slots: int) -> np.ndarray:
    """uint32 [..., W] -> bool [..., slots]: bit j is bit j % 32 of word j // 32."""
    bits = (mask[..., :, None] >> np.arange(MASK_BITS, dtype=np.uint32)) & np.uint32(1)
    return bits.reshape(*mask.shape[:-1], -1)[..., :slots].astype(bool)


def validate(q, kv_cache, block_table, prefix_len, kv_tree, mask, n_nodes, d_v) -> None:
    for name, array in (("q", q), ("kv_cache", kv_cache), ("kv_tree", kv_tree)):
        require_dtype(array, name, BF16)
    require_shape(q, "q", (None, None, None, None))
    groups, slots, _, key_dim = q.shape
    require_shape(kv_cache, "kv_cache", (None, PAGE_SIZE, key_dim))
    require_shape(kv_tree, "kv_tree", (groups, slots, key_dim))
    require_dtype(block_table, "block_table", np.int32)
    require_shape(block_table, "block_table", (groups, None))
    require_dtype(prefix_len, "prefix_len", np.int32)
    require_shape(prefix_len, "prefix_len", (groups,))
    require_dtype(mask, "mask", np.uint32)
    require_shape(mask, "mask", (groups, slots, (slots + MASK_BITS - 1) // MASK_BITS))
    require_dtype(n_nodes, "n_nodes", np.int32)
    require_shape(n_nodes, "n_nodes", (groups,))
    require(isinstance(d_v, (int, np.integer)) and 1 <= d_v <= key_dim, "d_v",
            f"an integer in [1, Dqk={key_dim}] (Dqk < Dv is bad input)", d_v)
    require(((n_nodes >= 0) & (n_nodes < slots)).all(), "n_nodes", f"values in [0, N-1={slots - 1}]",
            n_nodes.tolist())
    capacity = block_table.shape[1] * PAGE_SIZE
    for g in range(groups):
        length = int(prefix_len[g])
        require(0 <= length <= capacity, f"prefix_len[{g}]",
                f"a length in [0, {capacity}] (block_table holds {block_table.shape[1]} pages of {PAGE_SIZE})",
                length)
        used = block_table[g, : (length + PAGE_SIZE - 1) // PAGE_SIZE]
        bad = used[(used < 0) | (used >= kv_cache.shape[0])]
        require(bad.size == 0, f"block_table[{g}]", f"page ids in [0, {kv_cache.shape[0]})",
                bad[:1].tolist())


def verify_attn(q, kv_cache, block_table, prefix_len, kv_tree, mask, n_nodes, softmax_scale: float,
                d_v: int) -> dict[str, np.ndarray]:
    """out float32 [G, N, H, Dv] and lse float32 [G, N, H], computed in float64 from the bf16 inputs."""
    validate(q, kv_cache, block_table, prefix_len, kv_tree, mask, n_nodes, d_v)
    groups, slots, heads, _ = q.shape
    out = np.zeros((groups, slots, heads, d_v), np.float32)
    lse = np.full((groups, slots, heads), -np.inf, np.float32)
    allowed_tree = unpack_mask(mask, slots)
    for g in range(groups):
        length = int(prefix_len[g])
        pages = block_table[g, : (length + PAGE_SIZE - 1) // PAGE_SIZE]
        prefix_keys = kv_cache[pages].reshape(-1, kv_cache.shape[2])[:length]
        keys = np.concatenate([prefix_keys, kv_tree[g]]).astype(np.float64)
        live = int(n_nodes[g]) + 1
        queries = q[g, :live].astype(np.float64)  # [live, H, Dqk]
        scores = softmax_scale * (queries @ keys.T)  # [live, H, T]
        allowed = np.concatenate([np.ones((live, length), bool), allowed_tree[g, :live]], axis=1)
        scores = np.where(allowed[:, None, :], scores, -np.inf)
        row_max = scores.max(axis=2, keepdims=True)
        finite_max = np.where(np.isfinite(row_max), row_max, 0.0)
        weights = np.exp(scores - finite_max)
        total = weights.sum(axis=2, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[g, :live] = np.where(total > 0, (weights @ keys[:, :d_v]) / total, 0.0)
            lse[g, :live] = (finite_max + np.log(total))[..., 0]
    return {"out": out, "lse": lse}
