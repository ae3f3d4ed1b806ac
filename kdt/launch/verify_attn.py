"""Launch plan for `kernels/verify_attn.cu` (stage `verify-attn`): MLA tree-verify attention over a paged prefix.

  kdt_verify_attn_fwd      grid (ceil(N*H/rows) * value_split, G, splits), 256 threads, kdt_verify_attn_smem_bytes of
                           dynamic smem (rows = kdt_verify_attn_rows: 64, or 32 on the sm_120 configuration)
  kdt_verify_attn_combine  grid (N*H, G), combine_group_threads threads a group, one group per combine_unroll splits
                           (at most combine_max_groups); only when splits > 1; discards the partials it read from
                           L2 where the call's keys overflow it (`discard_partials`)

Split (flash-decoding): when G * ceil(N*H/rows) CTAs cannot fill the GPU, the key tiles of each request are split
over `splits` CTAs (grid z) that write normalised partials and their lse to the workspace, and the combine kernel
merges them. `splits` is a function of the shapes and the multiprocessor count only (the per-split tile ranges
follow the actual prefix_len on the device). The workspace carries nothing between launches: the combine reads
only words the same launch's main kernel wrote. Where the main kernel leaves half the SMs or more idle, the
combine is a programmatic dependent launch (`overlaps_previous`): its blocks start on the idle SMs and wait on the
device for the partials.

Pair merge (sm_90a, kdt_verify_attn_pair_merge = 1; `pair_splits`): splits 2c and 2c + 1 run as a cluster of two
(kdt_verify_attn_fwd_paired) that merges their partials over distributed shared memory into one, slot c: the
workspace, the stores and the combine's reads are half as large (an odd split count made even by one more split,
or by one fewer where one more would need a second wave).

Tensor keys (sm_90a, kdt_verify_attn_tensor_keys = 1; `tensor_keys`): the main kernel copies the prefix tiles whole
in their page by the tensor-copy engine through a tensor map of kv_cache (a `TensorMap` argument, made at launch).

Value split (sm_90a, kdt_verify_attn_value_split_max = 2): where even the doubled grid leaves SMs idle, two CTAs
share each query tile and split, each computing S and writing half the value columns: half the partial bytes and
half the P V a CTA, which is what a split of one or a few key tiles spends its time on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdt.launch.plan import (ArraySpec, KernelLaunch, LaunchKnobs, LaunchPlan, NULL, Target, TensorMap, Workspace, cdiv,
                             knob)

LOG2E = 1.4426950408889634
FWD = "kdt_verify_attn_fwd"
FWD_PAIRED = "kdt_verify_attn_fwd_paired"
COMBINE = "kdt_verify_attn_combine"


@dataclass(frozen=True)
class Knobs(LaunchKnobs):
    min_tiles_per_split: int = knob(3, "a split streams at least this many key tiles of kdt_verify_attn_kv_tile "
                                       "keys (3 pages on sm_90a, 48 keys on the sm_120 configuration): it "
                                       "amortises its Q load and its partial write")
    splits: int | None = knob(None, "key-tile splits per (request, query tile); None: enough CTAs for one wave")
    min_ctas: int = knob(64, "splits may hold fewer than min_tiles_per_split tiles (down to one) where that is "
                             "what it takes for this many CTAs: a short prefix at G = 1 would run 6 CTAs")
    overlap_combine: bool = knob(True, "launch the combine by programmatic dependent launch where the main "
                                       "kernel leaves half the SMs or more idle: its blocks start there while the "
                                       "main kernel runs (on a fuller GPU it measured up to 1.19x slower)")
    fill_splits: int = knob(32, "the most splits min_ctas may ask for: past 32 a split's share of the combine "
                                "costs more than the shorter mainloop gains")
    split_values: float = knob(1.0, "split each query tile's value columns over two CTAs (sm_90a) where the "
                                    "doubled grid fills at most this fraction of the SMs; 0: never")
    pair_splits: bool = knob(True, "merge the partials of splits 2c and 2c + 1 in a cluster of two over distributed "
                                   "shared memory (sm_90a, no value split, 4 or more splits that fit one wave "
                                   "once even): half the partial bytes to store and to combine")
    tensor_keys: bool = knob(True, "a split's prefix key tiles whole in their page, from its third on, by the "
                                   "tensor-copy engine (one thread, a tensor map of kv_cache; sm_90a, kv_cache "
                                   "16-byte aligned); the others by cp.async")
    discard_partials_mb: float = knob(50.0, "the combine drops the partials it has read from L2 unwritten where "
                                            "the call streams more than this many MB of keys (the H200's L2: "
                                            "its dirty partials would be written back to DRAM before the next "
                                            "call); 0: always")


def num_splits(groups: int, slots: int, heads: int, max_pages: int, target: Target, knobs: Knobs) -> int:
    """Splits per (request, query tile) of its key tiles: the prefix's at the block table's width, then the
    tree's (the kernel's order). Each split holds `per` tiles, min_tiles_per_split or fewer (down to one) where
    that is what it takes for min_ctas CTAs (up to fill_splits splits asked for that way), never so few that the
    splits need a second wave; and no split is left without a tile (splits = ceil(tiles / per))."""
    base = groups * cdiv(slots * heads, target.constant("kdt_verify_attn_rows"))
    if knobs.splits is not None:
        return max(1, knobs.splits)
    if base == 0 or base >= target.multiprocessors:
        return 1
    kv_tile = target.constant("kdt_verify_attn_kv_tile")
    tiles = max_pages * target.constant("kdt_verify_attn_page") // kv_tile + cdiv(slots, kv_tile)
    for_min_ctas = cdiv(tiles, min(cdiv(knobs.min_ctas, base), knobs.fill_splits)) if knobs.min_ctas else tiles
    per = max(min(knobs.min_tiles_per_split, for_min_ctas), cdiv(tiles, target.multiprocessors // base))
    return cdiv(tiles, per)


def value_split(ctas: int, target: Target, knobs: Knobs) -> int:
    """CTAs sharing each (query tile, split) by value columns: the build's most (2 on sm_90a, else 1) where the
    grid of `ctas` CTAs that many times over fills at most split_values of the SMs, else 1."""
    most = target.constant("kdt_verify_attn_value_split_max")
    return most if most > 1 and ctas * most <= knobs.split_values * target.multiprocessors else 1


def paired_splits(ctas_per_split: int, splits: int, values: int, target: Target, knobs: Knobs) -> int:
    """The split count with which splits 2c and 2c + 1 run as a cluster of two that merges their partials
    (kdt_verify_attn_fwd_paired), or 0 where they do not: where the cubin has it (sm_90a), without a value split,
    with 4 or more splits (the combine still merges two or more slots). An odd count is made even by one more split
    where that still fits one wave, else by one fewer (G4 N8 P32768: 33 -> 32 splits of 17 tiles, 0.94-0.96 of
    33 unpaired on the H200)."""
    if not (knobs.pair_splits and target.constant("kdt_verify_attn_pair_merge") == 1 and values == 1
            and splits >= 4):
        return 0
    even = splits + splits % 2
    if ctas_per_split * even > target.multiprocessors:
        even = splits - splits % 2
    return even if even >= 4 and ctas_per_split * even <= target.multiprocessors else 0


def discard_partials(groups: int, slots: int, max_pages: int, target: Target, knobs: Knobs) -> bool:
    """Whether the combine discards the partials from L2 after reading them: where the keys the call streams (the
    block table's width and the tree's, every request) exceed discard_partials_mb, the partials' dirty lines would
    be evicted to DRAM, a write as large as the partials themselves; below it they stay in L2 and the next call
    overwrites them there (discarding measured 0.3-0.5 us slower at G = 1 on the H200)."""
    key_bytes = groups * (max_pages * target.constant("kdt_verify_attn_page") + slots) * target.constant(
        "kdt_verify_attn_dqk") * 2
    return key_bytes > knobs.discard_partials_mb * 2**20


def tensor_keys(kv_cache: ArraySpec, target: Target, knobs: Knobs) -> bool:
    """Whether the main kernel copies whole prefix tiles by tensor copy: where its cubin can (sm_90a), the knob
    asks for it, kv_cache's address is 16-byte aligned (a tensor map's requirement) and its rows fit the copies'
    32-bit coordinates."""
    rows = kv_cache.shape[0] * target.constant("kdt_verify_attn_page")
    return (knobs.tensor_keys and target.constant("kdt_verify_attn_tensor_keys") == 1 and kv_cache.alignment % 16 == 0
            and rows <= 2**31)


def plan(inputs: dict[str, ArraySpec], params: dict, target: Target, knobs: Knobs) -> LaunchPlan:
    groups, slots, heads, _ = inputs["q"].shape
    max_pages = inputs["block_table"].shape[1]
    words = inputs["mask"].shape[2]
    if groups == 0 or slots == 0 or heads == 0:
        return LaunchPlan("verify-attn", "empty", (), knobs=knobs)
    c = lambda name: target.constant("kdt_verify_attn_" + name)
    rows_per_cta = c("rows")
    tiles = cdiv(slots * heads, rows_per_cta)
    splits = num_splits(groups, slots, heads, max_pages, target, knobs)
    values = value_split(groups * tiles * splits, target, knobs)
    # paired, the kernel spreads the tiles over the even count; a last, empty split gives its slot to its partner
    even = paired_splits(groups * tiles, splits, values, target, knobs)
    paired, splits = even > 0, even or splits
    partials = splits // 2 if paired else splits   # partials written (a pair writes one)
    discard = splits > 1 and discard_partials(groups, slots, max_pages, target, knobs)
    tma = tensor_keys(inputs["kv_cache"], target, knobs)
    out_bf16 = np.int32(1 if params.get("out_dtype", "float32") == "bfloat16" else 0)
    scale_log2 = np.float32(float(params["softmax_scale"]) * LOG2E)
    if splits > 1:
        partial_values = partials * groups * tiles * rows_per_cta * c("dv")
        part_o, part_lse = Workspace(0), Workspace(4 * partial_values)
        workspace = partials * groups * tiles * rows_per_cta * (c("dv") + 1) * 4
    else:
        part_o = part_lse = NULL      # not touched when splits == 1
        workspace = 0
    # plain in captured graphs too (the knob overlap_previous's auto): overlapped, the tp8 set ran 0.97-1.06 by shape
    # (H200, plans/perf-notes.md, "Programmatic dependent launch")
    fwd = KernelLaunch(FWD_PAIRED if paired else FWD, (tiles * values, groups, splits), c("threads"),
                       ("q", "kv_cache", TensorMap("kv_cache", c("page"), 64, encode=tma), np.int32(tma),
                        "block_table", "prefix_len", "kv_tree", "mask", "n_nodes",
                        np.int32(groups), np.int32(slots), np.int32(heads), np.int32(max_pages), np.int32(words),
                        scale_log2, np.int32(splits), np.int32(values), out_bf16, "out", "lse", part_o, part_lse),
                       c("smem_bytes"), cluster=2 if paired else 1)
    launches = (fwd,)
    if splits > 1:
        # one row a block, a group of warps per combine_unroll splits: every group's loads are in flight at once
        warp_groups = min(c("combine_max_groups"), cdiv(partials, c("combine_unroll")))
        launches += (KernelLaunch(COMBINE, (slots * heads, groups, 1), c("combine_group_threads") * warp_groups,
                                  (part_o, part_lse, "n_nodes", np.int32(groups), np.int32(slots), np.int32(heads),
                                   np.int32(partials), np.int32(tiles * rows_per_cta),
                                   np.int32(discard), out_bf16, "out", "lse"),
                                  overlaps_previous=knobs.overlap_combine
                                  and fwd.blocks <= target.multiprocessors // 2),)
    path = "split prefix + combine" if splits > 1 else "one CTA per query tile"
    facts = (("query tiles", tiles), ("splits", splits), ("value split", values),
             ("paired splits", paired), ("partials discarded", discard), ("keys by tensor copy", tma))
    return LaunchPlan("verify-attn", path, launches, workspace, facts, knobs)

