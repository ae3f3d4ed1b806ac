"""`verify-attn`: spec, golden cases and launch-time layout checks."""

from __future__ import annotations

import numpy as np

import kdt.refs.verify_attn as reference
from kdt.compare import AbsTol, RowScaledTol
from kdt.dtypes import to_bf16
from kdt.spec import Case, OutputLayout, StageSpec
from kdt.stages._util import require_layout, require_same
from kdt.stages.tree_build import drafter_topk
from kdt.refs.errors import BadInput
from kdt.refs.tree_build import mask_words, tree_build

KEY_DIM = 576    # MLA latent (512) + rope (64)
VALUE_DIM = 512
PAGE_SIZE = reference.PAGE_SIZE
OUT_RTOL, OUT_FLOOR, OUT_GLOBAL_RTOL = 8e-3, 1e-3, 4e-3
LSE_ATOL = 2e-3
TP8_HEADS = 8    # heads per GPU of the deployment: Kimi K2.6's 64 under tensor parallelism 8 (issue 17)


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


def scale_pages(inputs: dict[str, np.ndarray], pages: list[tuple[int, int, float]]) -> dict[str, np.ndarray]:
    """`inputs` with the keys of some prefix pages scaled: (request, page of its prefix, factor), a power of two so
    bf16 holds the product exactly. A loud page late in a prefix moves a row's running max far past the earlier
    tiles' (the sm_90a softmax keeps its max until a tile's exceeds it by MAX_SLACK), so O is rescaled mid-stream."""
    kv_cache = inputs["kv_cache"].copy()
    for g, page, factor in pages:
        row = int(inputs["block_table"][g, page])
        kv_cache[row] = (kv_cache[row].astype(np.float32) * np.float32(factor)).astype(kv_cache.dtype)
    return {**inputs, "kv_cache": kv_cache}


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
        # the deployment's own shapes (H = 8 heads per GPU under TP 8, small batches: issue 17) for the split plans of
        # G = 1 and of a ragged G = 4; prefixes short enough for the file (a page is 57 KB compressed, and an N=64
        # request at H=8 is 1.4 MB of q and out alone), long enough that sm_90a splits the first two today
        _case("tp8_g4_n8_ragged", "TP8: G=4 H=8 N=8, prefixes 129 / 0 / 1000 (16 pages) / 63, pages shuffled", 407,
              attention_inputs(rng(407), [129, 0, 1000, 63], TP8_HEADS, 7, 8, 7, spare_pages=2)),
        _case("tp8_g1_n16", "TP8: G=1 H=8 N=16, prefix 577 (10 pages, one key on the last), pages shuffled", 408,
              attention_inputs(rng(408), [577], TP8_HEADS, 7, 8, 15, spare_pages=1)),
        _case("tp8_g1_n64", "TP8: G=1 H=8 N=64, prefix 65 (one key on the second page)", 409,
              attention_inputs(rng(409), [65], TP8_HEADS, 15, 8, 63, spare_pages=1)),
        # every third page louder than the ones before it (scores of standard deviation 4-32x the others'): where a
        # split holds three tiles or more, a row's max jumps past the sm_90a softmax's slack inside it. The default
        # plan on 132 SMs gives this prefix one tile a split; `--knob splits=5` (three a split) or `splits=7` do it.
        _case("max_jumps", "G=1 H=8 N=16, prefix 769: keys of pages 2 / 5 / 8 / 11 scaled 4 / 8 / 16 / 32x", 410,
              scale_pages(attention_inputs(rng(410), [769], TP8_HEADS, 7, 8, 15, spare_pages=1),
                          [(0, 2, 4.0), (0, 5, 8.0), (0, 8, 16.0), (0, 11, 32.0)])),
    ]


def random_case(rng: np.random.Generator) -> Case:
    """Random shape within the limits: G 1..3, N = B + 1 with B in {1, 7, 15, 40, 63} (N not a multiple of
    any tile), H in {1, 2, 8, 16}, ragged prefixes of 0..3000 tokens (empty, one token, page edges), pages
    shuffled (now and then in order), trees of every shape the builder makes (chains, stars, fewer nodes than
    slots), and now and then a few loud pages (keys scaled 4-16x: a row's running max jumps mid-stream)."""
    groups = int(rng.integers(1, 4))
    budget = int(rng.choice([1, 7, 15, 40, 63]))
    heads = int(rng.choice([1, 2, 8, 16]))
    edges = (0, 1, 63, 64, 65, 127, 128, 2999, 3000)
    prefix = [int(rng.choice(edges)) if rng.random() < 0.4 else int(rng.integers(0, 3001)) for _ in range(groups)]
    depth, fanout = int(rng.choice([1, 3, 7, 15])), int(rng.choice([1, 2, 4, 8]))
    shuffle = bool(rng.random() < 0.8)
    inputs = attention_inputs(rng, prefix, heads, depth, fanout, budget, shuffle_pages=shuffle,
                              spare_pages=int(rng.integers(1, 5)))
    loud = []
    if rng.random() < 0.3:  # a few loud pages: a row's running max jumps mid-stream
        chosen = set()  # each page once: a page scaled twice (256x) puts lse where fp32's scores are ~1e-3 apart
        for _ in range(int(rng.integers(1, 4))):
            g = int(rng.integers(0, groups))
            if prefix[g] > 0:
                chosen.add((g, int(rng.integers(0, (prefix[g] + PAGE_SIZE - 1) // PAGE_SIZE))))
        loud = [(g, page, float(rng.choice([4.0, 8.0, 16.0]))) for g, page in sorted(chosen)]
        inputs = scale_pages(inputs, loud)
    seed = int(rng.integers(0, 2**31))
    return _case(f"random_{seed}", f"random G={groups} H={heads} B={budget} K={depth} V={fanout} prefixes {prefix}"
                 + ("" if shuffle else ", pages in order") + (f", loud pages {loud}" if loud else ""), seed, inputs)


def shrink_case(case: Case):
    """Smaller variants of a failing case, for `kdt fuzz`: one request (the paged cache stays shared),
    fewer heads, shorter prefixes (all empty, halved, one request at a time: empty, halved, page-aligned,
    one token less), fewer slots (the first N' of a tree whose parents precede their children), and the
    cache cut down to the pages the block table names."""
    from kdt.fuzz import batch_variants, smaller_sizes, with_inputs

    yield from batch_variants(case, shared=("kv_cache",))
    x = case.inputs
    q, prefix = x["q"], x["prefix_len"]
    groups, slots, heads, _ = q.shape
    for fewer in smaller_sizes(heads):
        yield with_inputs(case, q=q[:, :, :fewer])
    options = [np.zeros_like(prefix), prefix // 2]
    for g in range(groups):
        for value in (0, prefix[g] // 2, prefix[g] // PAGE_SIZE * PAGE_SIZE, prefix[g] - 1):
            if 0 <= value < prefix[g]:
                changed = prefix.copy()
                changed[g] = value
                options.append(changed)
    tried = {prefix.tobytes()}
    for option in options:
        if option.tobytes() not in tried:
            tried.add(option.tobytes())
            yield with_inputs(case, prefix_len=option.astype(np.int32))
    for fewer in smaller_sizes(slots):
        mask = x["mask"][:, :fewer, :mask_words(fewer)].copy()
        if fewer % 32:
            mask[:, :, -1] &= np.uint32((1 << (fewer % 32)) - 1)
        yield with_inputs(case, q=q[:, :fewer], kv_tree=x["kv_tree"][:, :fewer], mask=mask,
                          n_nodes=np.minimum(x["n_nodes"], fewer - 1).astype(np.int32))
    pages = x["kv_cache"].shape[0]
    needed = max(1, (int(prefix.max(initial=0)) + PAGE_SIZE - 1) // PAGE_SIZE)
    table = x["block_table"][:, :needed]
    valid = (table >= 0) & (table < pages)
    used = np.unique(table[valid])
    if needed < x["block_table"].shape[1] or used.size < pages:
        renumbered = np.where(valid, np.searchsorted(used, np.where(valid, table, 0)), table).astype(np.int32)
        yield with_inputs(case, kv_cache=x["kv_cache"][used], block_table=renumbered)


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


MAX_GROUPS = 65535   # the kernel's grid y


def check_launch(shapes, dtypes, params) -> None:
    """The kernel's limits: the MLA shape 576/512 only, at most 65535 requests per launch."""
    groups, _, _, key_dim = shapes["q"]
    if key_dim != KEY_DIM:
        raise BadInput("q", f"Dqk = {KEY_DIM} (the verify-attn kernel supports the MLA shape 576/512 only)", key_dim)
    if int(params["d_v"]) != VALUE_DIM:
        raise BadInput("d_v", f"{VALUE_DIM} (the verify-attn kernel supports the MLA shape 576/512 only)",
                       params["d_v"])
    if groups > MAX_GROUPS:
        raise BadInput("q", f"at most {MAX_GROUPS} requests per launch (the kernel's grid y)", groups)


def run_reference(inputs, params):
    names = ("q", "kv_cache", "block_table", "prefix_len", "kv_tree", "mask", "n_nodes")
    return reference.verify_attn(*(inputs[name] for name in names), softmax_scale=float(params["softmax_scale"]),
                                 d_v=int(params["d_v"]))


def _device_inputs(cp, groups: int, heads: int, slots: int, prefix: int, seed: int) -> dict:
    """Bench inputs made on the GPU (a 131072-token prefix is gigabytes): a shared paged cache with each
    request's pages scattered, trees from the reference builder."""
    from kdt.bench import device_bf16
    from kdt.verify import upload

    rng = cp.random.default_rng(seed)
    pages_each = (prefix + PAGE_SIZE - 1) // PAGE_SIZE
    total_pages = max(groups * pages_each, 1)
    order = np.random.default_rng(seed).permutation(total_pages).astype(np.int32)
    block_table = order[: groups * pages_each].reshape(groups, pages_each) if pages_each else np.zeros((groups, 1), np.int32)
    lp, ids = drafter_topk(np.random.default_rng(seed), groups, 15, 8)
    tree = tree_build(lp, ids, slots - 1)
    host = {"block_table": np.ascontiguousarray(block_table), "prefix_len": np.full(groups, prefix, np.int32),
            "mask": tree["mask"], "n_nodes": tree["n_nodes"]}
    device = upload(host)
    device["q"] = device_bf16(cp, rng.standard_normal((groups, slots, heads, KEY_DIM), dtype=cp.float32))
    device["kv_cache"] = device_bf16(cp, rng.standard_normal((total_pages, PAGE_SIZE, KEY_DIM), dtype=cp.float32))
    device["kv_tree"] = device_bf16(cp, rng.standard_normal((groups, slots, KEY_DIM), dtype=cp.float32))
    return device


def _bench_shape(groups: int, heads: int, slots: int, prefix: int):
    """One bench shape: G requests of `slots` tree slots and `heads` heads over a `prefix`-token paged prefix each.
    Model: every key (prefix and tree) read once per request, q read and out (float32) and lse written once; flops
    2*H*N*(prefix+N)*(Dqk+Dv) per request (S = Q K^T and P V)."""
    from kdt.bench import BenchShape

    keys = groups * (prefix + slots) * KEY_DIM * 2
    moved = keys + groups * slots * heads * (KEY_DIM * 2 + VALUE_DIM * 4 + 4)
    flops = 2 * heads * slots * (prefix + slots) * (KEY_DIM + VALUE_DIM) * groups
    pages = (prefix + PAGE_SIZE - 1) // PAGE_SIZE
    layout = {"q": ((groups, slots, heads, KEY_DIM), "bfloat16"),
              "kv_cache": ((max(groups * pages, 1), PAGE_SIZE, KEY_DIM), "bfloat16"),
              "block_table": ((groups, max(pages, 1)), "int32"), "prefix_len": ((groups,), "int32"),
              "kv_tree": ((groups, slots, KEY_DIM), "bfloat16"),
              "mask": ((groups, slots, mask_words(slots)), "uint32"), "n_nodes": ((groups,), "int32")}
    return BenchShape(f"G{groups}_H{heads}_N{slots}_prefix{prefix}",
                      lambda cp: _device_inputs(cp, groups, heads, slots, prefix, seed=groups + heads + slots),
                      {"softmax_scale": float(1.0 / np.sqrt(KEY_DIM)), "d_v": VALUE_DIM, "out_dtype": "float32"},
                      layout, moved, flops, cpu_baseline=False, size=flops, size_label="flops (model)")


def bench_shapes(quick: bool):
    """The default set: heads 8 to 64, batches 1 to 32, prefixes 1K to 128K."""
    headline = [_bench_shape(1, 64, 256, 32768), _bench_shape(8, 8, 8, 131072)]
    if quick:
        return headline
    grid = [_bench_shape(g, h, n, p) for g, h, n, p in [
        (1, 8, 8, 1024), (1, 8, 16, 8192), (1, 16, 64, 8192), (1, 64, 64, 32768), (1, 16, 256, 131072),
        (8, 16, 64, 8192), (8, 64, 8, 32768), (8, 64, 256, 8192), (8, 8, 64, 131072),
        (32, 8, 8, 1024), (32, 16, 8, 8192), (32, 64, 64, 1024), (32, 8, 256, 32768)]]
    return headline + grid


TP8_GROUPS, TP8_SLOTS, TP8_PREFIXES = (1, 4, 16), (8, 16, 64, 256), (1024, 8192, 32768, 131072)
# --quick: the shapes of issue 17's table
TP8_HEADLINE = ((1, 8, 1024), (1, 16, 8192), (1, 16, 32768), (1, 64, 32768), (4, 16, 8192), (4, 8, 32768),
                (16, 8, 8192), (1, 256, 32768))


def tp8_bench_shapes(quick: bool):
    """The deployment's own shapes (`--set tp8`): H = 8 heads per GPU, small batches, G x N x prefix in full. The
    largest, G16_H8_N256_prefix131072, holds 2.5 GB of inputs (the cache: 32768 pages); making them on the GPU
    and the SDPA baseline's gathered keys and mask take a few times that, far below an H200's 141 GB."""
    chosen = TP8_HEADLINE if quick else [(g, n, p) for g in TP8_GROUPS for n in TP8_SLOTS for p in TP8_PREFIXES]
    return [_bench_shape(g, TP8_HEADS, n, p) for g, n, p in chosen]


def torch_baseline(inputs, params):
    """PyTorch's scaled_dot_product_attention with a boolean mask on the same inputs (prefix gathered to a
    contiguous tensor beforehand, outside the timing): its memory-efficient backend takes 576-dim heads."""
    import torch

    def as_torch(value):
        return torch.from_dlpack(value.bits.view("int16")).view(torch.bfloat16)

    q = as_torch(inputs["q"])                      # [G, N, H, Dqk]
    groups, slots, heads, key_dim = q.shape
    cache = as_torch(inputs["kv_cache"])
    table = torch.from_dlpack(inputs["block_table"]).long()
    prefix = int(torch.from_dlpack(inputs["prefix_len"]).max().item())
    pages = (prefix + PAGE_SIZE - 1) // PAGE_SIZE
    prefix_keys = cache[table[:, :pages]].reshape(groups, pages * PAGE_SIZE, key_dim)[:, :prefix]
    keys = torch.cat([prefix_keys, as_torch(inputs["kv_tree"])], dim=1)        # [G, T, Dqk]
    words = torch.from_dlpack(inputs["mask"]).to(torch.int64)                  # [G, N, W]
    bits = (words[..., :, None] >> torch.arange(32, device=words.device)) & 1
    tree_allowed = bits.reshape(groups, slots, -1)[:, :, :slots].bool()
    allowed = torch.cat([torch.ones(groups, slots, prefix, dtype=torch.bool, device=q.device), tree_allowed], 2)
    query = q.permute(0, 2, 1, 3)                                             # [G, H, N, Dqk]
    key = keys[:, None].expand(groups, heads, -1, key_dim)
    value = keys[:, None, :, : int(params["d_v"])].expand(groups, heads, -1, int(params["d_v"]))
    mask = allowed[:, None]
    scale = float(params["softmax_scale"])
    return lambda: torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)


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
    random_case=random_case,
    shrink=shrink_case,
    bench_shapes=bench_shapes,
    bench_sets={"tp8": tp8_bench_shapes},
    torch_baseline=torch_baseline,
    check_launch=check_launch,
)
