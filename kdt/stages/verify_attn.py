"""`verify-attn`: spec, golden cases and launch-time layout checks."""

from __future__ import annotations

import numpy as np

import refs.verify_attn as reference
from kdt.compare import AbsTol, RowScaledTol
from kdt.dtypes import to_bf16
from kdt.spec import Case, OutputLayout, StageSpec
from kdt.stages._util import require_layout, require_same
from kdt.stages.tree_build import drafter_topk
from refs.errors import BadInput
from refs.tree_build import mask_words, tree_build

KEY_DIM = 576    # MLA latent (512) + rope (64)
VALUE_DIM = 512
PAGE_SIZE = reference.PAGE_SIZE
OUT_RTOL, OUT_FLOOR, OUT_GLOBAL_RTOL = 8e-3, 1e-3, 4e-3
LSE_ATOL = 2e-3


def attention_inputs(rng: np.random.Generator, prefix_lens: list[int], heads: int, depth: int, fanout: int,
                     budget: int, shuffle_pages: bool = True, spare_pages: int = 3) -> dict[str, np.ndarray]:
    """Inputs as an engine would hold them: a paged cache shared by the batch with the pages of each
    request scattered (non-contiguous block table), trees from the reference builder."""
    groups = len(prefix_lens)
    slots = budget + 1
    pages_each = [(n + PAGE_SIZE - 1) // PAGE_SIZE for n in prefix_lens]
    max_pages = max(max(pages_each), 1)
    total_pages = sum(pages_each) + spare_pages
    order = rng.permutation(total_pages) if shuffle_pages else np.arange(total_pages)
    block_table = np.full((groups, max_pages), -1, np.int32)
    cursor = 0
    for g, count in enumerate(pages_each):
        block_table[g, :count] = order[cursor: cursor + count]
        cursor += count
    # unused block-table entries point at a real page too, as engines leave them; only the prefix counts
    block_table[block_table < 0] = order[-1]
    lp, ids = drafter_topk(rng, groups, depth, fanout)
    tree = tree_build(lp, ids, budget)
    scale = np.float32(1.0)  # unit latents: scaled scores of standard deviation ~1
    return {
        "q": to_bf16(rng.standard_normal((groups, slots, heads, KEY_DIM), dtype=np.float32) * scale),
        "kv_cache": to_bf16(rng.standard_normal((total_pages, PAGE_SIZE, KEY_DIM), dtype=np.float32) * scale),
        "block_table": block_table,
        "prefix_len": np.asarray(prefix_lens, np.int32),
        "kv_tree": to_bf16(rng.standard_normal((groups, slots, KEY_DIM), dtype=np.float32) * scale),
        "mask": tree["mask"],
        "n_nodes": tree["n_nodes"],
    }


def _case(name, description, seed, inputs) -> Case:
    return Case(name, description, seed, {"softmax_scale": float(np.float32(1.0 / np.sqrt(KEY_DIM))),
                                          "d_v": VALUE_DIM}, inputs)


def make_cases() -> list[Case]:
    rng = np.random.default_rng
    return [
        _case("ragged_h8_b15", "G=3 ragged prefixes 100 / 1000 / 64, H=8, K=7 V=8 B=15 trees", 401,
              attention_inputs(rng(401), [100, 1000, 64], 8, 7, 8, 15)),
        _case("prefix_zero", "a request with an empty prefix: the tree attends to its ancestors only", 402,
              attention_inputs(rng(402), [0, 130], 8, 5, 4, 15)),
        _case("h1_g1", "H=1, G=1, prefix 777, B=31", 403, attention_inputs(rng(403), [777], 1, 7, 8, 31)),
        _case("h16_b63", "H=16, B=63 (N=64), prefix 1500", 404,
              attention_inputs(rng(404), [1500], 16, 15, 8, 63)),
        _case("contiguous_pages_b7", "an in-order block table, B=7, H=8", 405,
              attention_inputs(rng(405), [320, 250], 8, 7, 8, 7, shuffle_pages=False)),
        _case("b40_unaligned_slots", "N=41 (not a multiple of any tile), H=16, prefix 500", 406,
              attention_inputs(rng(406), [500], 16, 7, 8, 40)),
    ]


def output_layout(shapes, params) -> dict[str, OutputLayout]:
    groups, slots, heads, _ = shapes["q"]
    return {"out": OutputLayout((groups, slots, heads, int(params["d_v"])), params.get("out_dtype", "float32")),
            "lse": OutputLayout((groups, slots, heads), "float32")}


def check_layout(shapes, dtypes, params) -> None:
    groups, slots, heads, key_dim = require_layout(shapes, dtypes, "q", 4, ("bfloat16",))
    pages, page_size, cache_dim = require_layout(shapes, dtypes, "kv_cache", 3, ("bfloat16",))
    require_same("kv_cache", (page_size, cache_dim), (PAGE_SIZE, key_dim))
    require_layout(shapes, dtypes, "kv_tree", 3, ("bfloat16",))
    require_same("kv_tree", shapes["kv_tree"], (groups, slots, key_dim))
    table = require_layout(shapes, dtypes, "block_table", 2, ("int32",))
    require_same("block_table", table[:1], (groups,))
    require_layout(shapes, dtypes, "prefix_len", 1, ("int32",))
    require_same("prefix_len", shapes["prefix_len"], (groups,))
    require_layout(shapes, dtypes, "mask", 3, ("uint32",))
    require_same("mask", shapes["mask"], (groups, slots, mask_words(slots)))
    require_layout(shapes, dtypes, "n_nodes", 1, ("int32",))
    require_same("n_nodes", shapes["n_nodes"], (groups,))
    d_v = params.get("d_v")
    if not isinstance(d_v, (int, np.integer)) or not 1 <= d_v <= key_dim:
        raise BadInput("d_v", f"an integer in [1, Dqk={key_dim}] (Dqk < Dv is bad input)", d_v)
    if params.get("out_dtype", "float32") not in ("float32", "bfloat16"):
        raise BadInput("out_dtype", "float32 or bfloat16", params.get("out_dtype"))


def run_reference(inputs, params):
    names = ("q", "kv_cache", "block_table", "prefix_len", "kv_tree", "mask", "n_nodes")
    return reference.verify_attn(*(inputs[name] for name in names), softmax_scale=float(params["softmax_scale"]),
                                 d_v=int(params["d_v"]))


SPEC = StageSpec(
    name="verify-attn",
    position=4,
    params=("softmax_scale", "d_v"),
    inputs=("q", "kv_cache", "block_table", "prefix_len", "kv_tree", "mask", "n_nodes"),
    outputs={"out": RowScaledTol(OUT_RTOL, OUT_FLOOR, OUT_GLOBAL_RTOL), "lse": AbsTol(LSE_ATOL)},
    reference_module=reference,
    run_reference=run_reference,
    make_cases=make_cases,
    output_layout=output_layout,
    check_layout=check_layout,
    description="MLA tree-verify attention over a paged prefix and the tree's own keys",
)
