"""Launch plans without a GPU: made from the constants the real cubins export (nvcc builds them), for every bench
shape and golden case on both arches, each path's choice, and the knobs."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

from kdt import build, golden, ops, runtime, stages
from kdt.dtypes import name as dtype_name
from kdt.launch import topk as topk_launcher
from kdt.launch.plan import IN_GRAPHS, ArraySpec, Target, TensorMap, make_knobs, parse_knob_options
from kdt.refs.errors import BadInput

pytestmark = pytest.mark.compile   # plans are made from the real cubins' constants

ARCHES = {"sm_90": (132, 227 * 1024, 16), "sm_120": (188, 99 * 1024, 8)}   # SMs, smem per block, largest cluster


@pytest.fixture(scope="module")
def targets():
    """(stage, arch) -> Target with the cubin's constants; the cubins come from the build cache (or nvcc)."""
    cache = {}

    def get(stage: str, arch: str, multiprocessors: int | None = None) -> Target:
        if (stage, arch) not in cache:
            cache[(stage, arch)] = build.build(stage, arch)
        result = cache[(stage, arch)]
        return Target.make(arch, multiprocessors or ARCHES[arch][0], result.constants)

    get.result = lambda stage, arch: cache[(stage, arch)]
    return get


def _items(spec):
    for shape in spec.every_bench_shape():
        yield shape.name, {n: ArraySpec(tuple(s), d) for n, (s, d) in shape.layout.items()}, dict(shape.params)
    for item in golden.read(golden.default_path("golden", spec.name), spec).cases:
        case = item.case
        yield case.name, {n: ArraySpec(tuple(a.shape), dtype_name(a.dtype)) for n, a in case.inputs.items()}, \
            dict(case.params)


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("kernel", stages.names())
def test_every_bench_shape_and_golden_case_has_a_plan_within_the_arch(kernel, arch, targets):
    spec = stages.get(kernel)
    target = targets(kernel, arch)
    functions = {r.function: r for r in targets.result(kernel, arch).resources}
    _, smem_limit, cluster_limit = ARCHES[arch]
    for name, inputs, params in _items(spec):
        plan = ops.plan_for(spec, inputs, params, target)
        assert plan.workspace_bytes >= 0, name
        for launch in plan.launches:
            assert launch.function in functions, f"{name}: {launch.function} is not in the {arch} cubin"
            assert launch.arg_sizes == functions[launch.function].parameters, (name, launch.function)
            assert all(0 < n < 2**31 for n in launch.grid) and launch.grid[1] < 65536 and launch.grid[2] < 65536
            assert 0 < launch.block <= 1024
            assert launch.dynamic_smem + functions[launch.function].shared_bytes <= smem_limit, (name, launch)
            assert launch.cluster <= cluster_limit and launch.grid[0] % launch.cluster == 0, (name, launch)


@pytest.mark.nvcc
@pytest.mark.parametrize("kernel", stages.names())
def test_overlap_previous_makes_only_the_first_launch_overlap(kernel, targets):
    """Every stage has the knob. Auto (the default) keeps the launcher's choice, which may overlap the first launch
    in captured graphs only, never always; true overlaps it always, false never. The launches after the first keep
    their launcher's choice (verify-attn's combine overlaps its main kernel either way)."""
    spec = stages.get(kernel)
    target = targets(kernel, "sm_90")
    for name, inputs, params in _items(spec):
        auto = ops.plan_for(spec, inputs, params, target)
        plain = ops.plan_for(spec, inputs, params, target, {"overlap_previous": "false"})
        overlapping = ops.plan_for(spec, inputs, params, target, {"overlap_previous": "true"})
        if not plain.launches:
            assert not overlapping.launches and not auto.launches, name
            continue
        first = plain.launches[0]
        assert not first.overlaps_previous and not first.overlaps_previous_in_graphs and first.overlap is False, name
        assert overlapping.launches[0] == dataclasses.replace(first, overlaps_previous=True), name
        assert overlapping.rows()[0]["overlaps previous"] is True and overlapping.knobs.overlap_previous
        in_graphs = auto.launches[0].overlaps_previous_in_graphs
        assert auto.launches[0] == dataclasses.replace(first, overlaps_previous_in_graphs=in_graphs), name
        assert auto.rows()[0]["overlaps previous"] == ("in graphs" if in_graphs else False), name
        assert auto.knobs.overlap_previous is None
        assert overlapping.launches[1:] == plain.launches[1:] == auto.launches[1:], name


@pytest.mark.nvcc
def test_auto_overlaps_in_graphs_where_it_measured_faster(targets):
    """The launchers' choices for the knob's auto (plans/perf-notes.md, "Thirtieth session"): tree-build,
    tree-sample and tree-accept overlap every plan in graphs; topk only a launch whose blocks fit one wave (two
    waves of clusters measured slower); verify-attn never."""
    for kernel, expect in (("tree-build", True), ("tree-sample", True), ("tree-accept", True),
                           ("verify-attn", False)):
        spec = stages.get(kernel)
        for name, inputs, params in _items(spec):
            plan = ops.plan_for(spec, inputs, params, targets(kernel, "sm_90"))
            assert not plan.launches or plan.launches[0].overlap == (IN_GRAPHS if expect else False), (kernel, name)
    target = targets("topk", "sm_90")
    for rows, vocab, overlap in ((15, 163840, IN_GRAPHS), (28, 262144, False), (960, 32000, False)):
        first = _topk(target, rows, vocab, 8, "bfloat16").launches[0]
        assert first.overlap == overlap, (rows, vocab, first.function, first.blocks, target.multiprocessors)


def _topk(target, rows, vocab, V, dtype="float32", alignment=256, **knobs):
    return ops.plan_for("topk", {"logits": ArraySpec((1, rows, vocab), dtype, alignment)}, {"k": V}, target,
                        knobs)


@pytest.mark.nvcc
def test_topk_paths_by_rows_and_fan_out(targets):
    h200 = targets("topk", "sm_90")
    few = _topk(h200, 15, 163840, 8, "bfloat16")
    assert few.path == "resident-narrow" and few.workspace_bytes == 0
    assert _topk(h200, 7, 163840, 8).path == "resident-wide"
    assert _topk(h200, 15, 163840, 8, resident=False).path == "cluster"
    assert _topk(h200, 15, 163840, 8, resident=False).launches[0].cluster == 16
    assert _topk(h200, 64 * 15, 163840, 8).path == "small"
    middle = _topk(h200, 8 * 15, 163840, 8)
    assert middle.path == "small" and 1 < middle.fact("splits") < 8 and middle.workspace_bytes > 0
    assert _topk(h200, 15, 163840, 64).path == "gate-split"   # few rows: split (test_topk_gate_splits_...)
    assert _topk(h200, 120, 163840, 64).path == "gate"
    # f32 rows stream through a two-step ring of 1,024 x 4 vectors after the buffer; bf16 and sm_120 load registers
    assert _topk(h200, 15, 163840, 64).launches[0].dynamic_smem == 8 * 2048 + 2 * 4 * 1024 * 16
    assert _topk(h200, 15, 163840, 1024, "bfloat16").launches[0].dynamic_smem == 8 * 4096
    # the one-block bf16 kernel keeps a bf16 maximum of each of up to 32 vectors a thread after the buffer, and takes
    # its gate from them; sm_120's 99 KB cannot hold them (its gate opens at the first step, as f32's everywhere)
    one_block = _topk(h200, 8 * 15, 163840, 1024, "bfloat16")
    assert one_block.path == "gate" and one_block.launches[0].dynamic_smem == 8 * 4096 + 32 * 1024 * 2
    assert one_block.fact("gate from") == "the row's vector maxima"
    assert _topk(h200, 8 * 15, 163840, 64).fact("gate from") == "the first step's vector maxima"
    assert _topk(targets("topk", "sm_120"), 8 * 15, 163840, 1024, "bfloat16").fact("gate from") == \
        "the first step's vector maxima"
    assert _topk(targets("topk", "sm_120"), 15, 163840, 64).launches[0].dynamic_smem == 8 * 2048
    assert _topk(h200, 15, 163840, 64, gate=False).path == "radix"
    assert _topk(h200, 15, 163841, 64).path == "radix"             # rows not a whole number of vectors
    assert _topk(h200, 15, 163840, 64, alignment=8).path == "radix"
    assert _topk(h200, 15, 163840, 8, min_chunk=1 << 18).fact("splits") == 1
    assert _topk(h200, 15, 163840, 32, cluster_min_splits=1 << 30).path == "small"
    sm120 = targets("topk", "sm_120")
    assert _topk(sm120, 15, 163840, 8, resident=False).launches[0].cluster == 8
    wide = _topk(sm120, 8 * 15, 163840, 1024, "bfloat16")
    assert wide.path == "gate" and wide.launches[0].dynamic_smem == 8 * wide.fact("buffer entries") <= 64 * 1024
    # the buffer: max(4 V, 2048) entries (a prune keeps at most 1.5 V; the prune mark is min(2 V + 128, half))
    assert [_topk(sm120, 15, 163840, V).fact("buffer entries") for V in (33, 512, 1024)] == [2048, 2048, 4096]


@pytest.mark.nvcc
def test_topk_gate_splits_rows_that_leave_sms_idle(targets):
    h200 = targets("topk", "sm_90")   # 132 SMs
    # G1 K15: 8 blocks a row fill 120 SMs; V = 1,024 merges at most 4 V best in its 4,096-entry buffer
    assert [_topk(h200, 15, 163840, V).fact("splits") for V in (64, 256)] == [8, 8]
    wide = _topk(h200, 15, 163840, 1024, "bfloat16")
    assert wide.fact("splits") == 4 and wide.launches[0].grid == (60, 1, 1)
    assert wide.fact("chunk") * 4 >= 163840 > wide.fact("chunk") * 3 and wide.fact("chunk") % 64 == 0
    # the workspace: counters, a 32-byte record a split, V composites a split (each part 256-byte aligned)
    assert wide.workspace_bytes == 256 + 2048 + 15 * 4 * 1024 * 8   # 1,920 record bytes, padded
    # one block per row where the rows fill the SMs, or the row is short, or the knob asks for it
    assert _topk(h200, 8 * 15, 163840, 64).fact("splits") == 1
    assert _topk(h200, 8 * 15, 163840, 64).workspace_bytes == 0
    assert _topk(h200, 2, 16384, 64).fact("splits") == 1
    assert _topk(h200, 15, 163840, 64, gate_min_chunk=163840).fact("splits") == 1
    assert _topk(h200, 2, 65536, 64, gate_min_chunk=1024).fact("splits") == 32   # the merge's record warp
    # every split holds columns: S = ceil(vocab / chunk)
    for vocab in (65600, 163776, 131136):
        plan = _topk(h200, 3, vocab, 100)
        S, chunk = plan.fact("splits"), plan.fact("chunk")
        assert S > 1 and (S - 1) * chunk < vocab <= S * chunk


@pytest.mark.nvcc
def test_topk_resident_variant_applies_to_aligned_rows_that_fit(targets):
    h200 = targets("topk", "sm_90")

    def fits(rows, vocab, V, dtype="float32", alignment=256, target=h200):
        plan = _topk(target, rows, vocab, V, dtype, alignment, cluster_min_splits=1)
        if not plan.path.startswith("resident"):
            return None
        (launch,) = plan.launches
        return plan.path.removeprefix("resident-"), launch.cluster, launch.dynamic_smem

    few, more = 7, 8
    assert fits(few, 163840, 8) == ("wide", 16, 40960)                 # 10 vectors per thread
    assert fits(few, 163840, 8, "bfloat16") == ("wide", 16, 20480)     # 5
    assert fits(more, 163840, 8) == ("narrow", 8, 81920)               # 20: the narrow shape's most
    assert fits(more, 163840, 8, "bfloat16") == ("narrow", 8, 40960)
    assert fits(few, 65536, 8, "bfloat16") == ("wide", 16, 8192)       # the survivors' minimum
    assert fits(few, 262144, 8) == ("wide", 16, 65536)                 # 16: the wide shape's most
    assert fits(more, 262144, 8) == ("wide", 16, 65536)                # 32 narrow: only the wide shape fits
    assert fits(more, 262144, 8, "bfloat16") == ("narrow", 8, 65536)
    assert fits(few, 163840, 9) is None                                # V above the resident maximum
    assert fits(few, 163842, 8) is None                                # rows not 16-byte aligned
    assert fits(few, 163840, 8, "bfloat16", alignment=8) is None       # base not 16-byte aligned
    # sm_120: both shapes are 8-block clusters; vocab 262144 f32 fits neither (the plain cluster path runs)
    sm120 = targets("topk", "sm_120")
    assert fits(few, 163840, 8, target=sm120) == ("narrow", 8, 81920)
    assert fits(few, 262144, 8, target=sm120) is None


@pytest.mark.nvcc
def test_tree_build_select_path_by_budget_and_knob(targets):
    target = targets("tree-build", "sm_90")

    def function(budget, V=8, **knobs):
        inputs = {name: ArraySpec((4, 15, V), dtype) for name, dtype in (("top_logp", "float32"), ("top_ids", "int32"))}
        return ops.plan_for("tree-build", inputs, {"budget": budget}, target, knobs).launches[0].function

    assert function(16) == "kdt_tree_build_p1"
    assert function(255) == "kdt_tree_build_p8_select_narrow"
    assert function(255, select_min_budget=1024) == "kdt_tree_build_p8"
    assert function(16, select_min_budget=1) == "kdt_tree_build_p1_select_narrow"
    assert function(255, V=255) == "kdt_tree_build_p8_select_wide"   # wide fan-out: the wide select kind
    wide = {name: ArraySpec((1, 7, 1024), dtype) for name, dtype in (("top_logp", "float32"), ("top_ids", "int32"))}
    # K7 V1024 B1023: the rows and the select scratch do not fit together, so part of the rows stays in global memory
    plan = ops.plan_for("tree-build", wide, {"budget": 1023}, target)
    assert plan.launches[0].function == "kdt_tree_build_p32_g_select_wide"
    assert 1 <= plan.fact("staged ranks") < 1024 and plan.fact("select pool") == plan.fact("select ranked")
    big = {name: ArraySpec((1, 64, 1024), dtype) for name, dtype in (("top_logp", "float32"), ("top_ids", "int32"))}
    big_plan = ops.plan_for("tree-build", big, {"budget": 1023}, target)
    assert big_plan.launches[0].function == "kdt_tree_build_p32_g_select_wide"
    no_select = ops.plan_for("tree-build", big, {"budget": 1023}, target, {"select_min_budget": 1024})
    assert no_select.launches[0].function == "kdt_tree_build_p32_g"


@pytest.mark.nvcc
def test_tree_build_estimates_the_wide_threshold_from_its_budget_and_knob(targets):
    """The estimate argument (after cap3) is 1 only for the wide select kind (V > 32 or rows partly in global
    memory) at B >= select_estimate_min_budget: the narrow kind has none, and small budgets measured slower."""
    target = targets("tree-build", "sm_90")

    def estimate(budget, V, **knobs):
        inputs = {name: ArraySpec((4, 7, V), dtype) for name, dtype in (("top_logp", "float32"), ("top_ids", "int32"))}
        plan = ops.plan_for("tree-build", inputs, {"budget": budget}, target, knobs)
        flag = int(plan.launches[0].args[8])
        assert plan.fact("threshold estimated") == ("yes" if flag else "no")
        return flag

    default = target.constant("kdt_tree_build_select_estimate_min_budget")
    assert 64 < default <= 1023
    assert estimate(1023, 1024) == estimate(1023, 64) == estimate(default, 256) == 1
    assert estimate(default - 1, 256) == estimate(64, 64) == 0
    assert estimate(1023, 8) == estimate(1023, 32) == 0                 # the narrow kind
    assert estimate(64, 64, select_estimate_min_budget=1) == 1
    assert estimate(1023, 1024, select_estimate_min_budget=1024) == 0
    assert estimate(1023, 1024, select_min_budget=1024) == 0            # no select path at all


@pytest.mark.nvcc
def test_verify_attn_splits_fill_the_gpu_from_shapes_alone(targets):
    def plan(groups, heads, slots, prefix, sms=132, arch="sm_90", kv_alignment=256, **knobs):
        pages = prefix // 64
        inputs = {"q": ArraySpec((groups, slots, heads, 576), "bfloat16"),
                  "kv_cache": ArraySpec((groups * pages, 64, 576), "bfloat16", kv_alignment),
                  "block_table": ArraySpec((groups, pages), "int32"), "prefix_len": ArraySpec((groups,), "int32"),
                  "kv_tree": ArraySpec((groups, slots, 576), "bfloat16"),
                  "mask": ArraySpec((groups, slots, (slots + 31) // 32), "uint32"),
                  "n_nodes": ArraySpec((groups,), "int32")}
        params = {"softmax_scale": 0.04, "d_v": 512}
        return ops.plan_for("verify-attn", inputs, params, targets("verify-attn", arch, sms), knobs)

    assert plan(1, 64, 256, 32768).fact("splits") == 1 and len(plan(1, 64, 256, 32768).launches) == 1
    small = plan(8, 8, 8, 131072)
    assert small.fact("splits") == 16 and [k.function for k in small.launches][-1] == "kdt_verify_attn_combine"
    assert small.workspace_bytes == 16 * 8 * 1 * 64 * 513 * 4
    # 1024 prefix tokens and the tree's 8 keys: 17 key tiles of 64
    assert plan(1, 8, 8, 1024, min_ctas=0).fact("splits") == 6     # 3 tiles (pages) a split
    assert plan(1, 8, 8, 1024).fact("splits") == 17                 # one tile a split rather than 6 CTAs
    assert plan(1, 8, 8, 1024, fill_splits=4).fact("splits") == 6   # min_ctas may ask for 4 splits at most
    assert plan(4, 8, 8, 1024).fact("splits") == 9                  # 2 tiles a split: 4 x 16 >= min_ctas
    assert plan(1, 8, 8, 8192).fact("splits") == 43                 # 3 tiles a split (129 tiles)
    assert plan(1, 8, 8, 8192, min_tiles_per_split=4).fact("splits") == 33
    assert plan(1, 8, 64, 1024).fact("splits") == 6                 # 8 query tiles: 3 tiles a split
    assert plan(1, 8, 8, 1024, min_tiles_per_split=1).fact("splits") == 17
    assert plan(1, 8, 8, 1024, arch="sm_120").fact("splits") == 22  # 65 tiles of 16 keys, 3 a split
    # the kernel gives split s the tiles [s * per, (s + 1) * per), per = ceil(tiles / splits): no split is empty
    for groups, slots, prefix in ((1, 8, 1024), (1, 16, 8192), (4, 8, 8192), (1, 8, 32768), (16, 8, 8192)):
        tiles = prefix // 64 + (slots + 63) // 64
        splits = plan(groups, 8, slots, prefix).fact("splits")
        assert (splits - 1) * -(-tiles // splits) < tiles, (groups, slots, prefix, splits)
    assert plan(8, 8, 8, 131072, sms=70).fact("splits") == 8       # an RTX 5070 Ti's 70 SMs
    assert plan(8, 8, 8, 131072, splits=1).workspace_bytes == 0
    # the combine starts by programmatic dependent launch where the main kernel leaves half the SMs idle (it waits
    # for the partials on the device): 8 x 16 = 128 CTAs on 132 SMs do not, 16 do
    # the combine: one row a block, a group of 4 warps per 8 splits (at most 4), all their loads in flight at once
    assert small.launches[1].grid == (64, 8, 1) and small.launches[1].block == 256
    assert plan(1, 8, 8, 1024).launches[1].block == 384 and plan(1, 8, 8, 32768).launches[1].block == 512
    assert plan(1, 8, 64, 1024).launches[1].block == 128
    assert [k.overlaps_previous for k in small.launches] == [False, False]
    assert [k.overlaps_previous for k in plan(1, 8, 8, 1024).launches] == [False, True]
    assert [k.overlaps_previous for k in plan(1, 8, 8, 1024, overlap_combine=False).launches] == [False, False]
    # value split (sm_90a only): two CTAs a query tile and split, each writing half the value columns, where the
    # doubled grid fills at most split_values (1.0) of the SMs: 17 splits x 2 = 34 CTAs of 132
    assert plan(1, 8, 8, 1024).fact("value split") == 1                      # the mma.sync build: never
    one_tile = plan(1, 8, 8, 1024, arch="sm_90a")
    assert one_tile.fact("value split") == 2 and one_tile.launches[0].grid == (2, 1, 17)
    assert one_tile.launches[0].args[16] == 2 and one_tile.launches[0].args[15] == 17
    assert one_tile.workspace_bytes == plan(1, 8, 8, 1024).workspace_bytes   # the partials are as wide as before
    assert plan(1, 8, 16, 1024, arch="sm_90a").fact("value split") == 2     # 2 x 17 x 2 = 68 CTAs <= 132
    assert plan(1, 8, 16, 1024, arch="sm_90a", split_values=0.5).fact("value split") == 1   # 68 > 66
    assert plan(1, 8, 16, 8192, arch="sm_90a").fact("value split") == 1     # 2 x 43 x 2 = 172 > 132
    assert plan(1, 8, 8, 1024, arch="sm_90a", split_values=0.0).fact("value split") == 1
    assert plan(1, 8, 8, 1024, arch="sm_90a", splits=1).launches[0].grid == (2, 1, 1)
    # the combine discards the partials it read from L2 where the call's keys overflow discard_partials_mb (50):
    # 4 x 32,776 keys x 1,152 B = 151 MB do, 1 x 32,776 x 1,152 B = 37.8 MB do not
    discard = lambda made: int(made.launches[1].args[8])
    assert discard(plan(4, 8, 8, 32768)) == 1 and plan(4, 8, 8, 32768).fact("partials discarded") is True
    assert discard(plan(16, 8, 8, 8192)) == 1 and discard(plan(1, 8, 16, 32768)) == 0
    assert discard(plan(1, 8, 16, 32768, discard_partials_mb=0)) == 1
    assert discard(plan(4, 8, 8, 32768, discard_partials_mb=1000)) == 0
    assert plan(1, 64, 256, 32768).fact("partials discarded") is False      # no split, no combine
    # the pair merge (sm_90a): splits 2c and 2c + 1 in a cluster of two write one partial, slot c
    paired = plan(1, 8, 16, 8192, arch="sm_90a")              # 2 query tiles x 43 splits -> 44 (88 CTAs)
    assert paired.fact("paired splits") is True and paired.fact("splits") == 44
    assert paired.launches[0].function == "kdt_verify_attn_fwd_paired" and paired.launches[0].cluster == 2
    assert paired.launches[0].grid == (2, 1, 44) and paired.launches[0].args[15] == 44
    assert paired.launches[1].args[6] == 22 and paired.launches[1].block == 384      # 22 slots: 3 groups
    assert paired.workspace_bytes == 22 * 1 * 2 * 64 * 513 * 4
    unpaired = plan(1, 8, 16, 8192, arch="sm_90a", pair_splits=False)
    assert unpaired.fact("paired splits") is False and unpaired.fact("splits") == 43
    assert unpaired.launches[0].function == "kdt_verify_attn_fwd" and unpaired.launches[0].cluster == 1
    # 33 splits made even: 4 x 34 CTAs would need a second wave, so 32 (the kernel's per = 17 tiles: 31 splits hold
    # the 513, the last pair's rank 1 none)
    fewer = plan(4, 8, 8, 32768, arch="sm_90a")
    assert fewer.fact("paired splits") is True and fewer.fact("splits") == 32 and fewer.launches[0].grid == (1, 4, 32)
    assert plan(4, 8, 8, 32768, arch="sm_90a", pair_splits=False).fact("splits") == 33
    assert plan(4, 8, 8, 32768, arch="sm_90a", splits=5, split_values=0).fact("splits") == 6   # 24 CTAs fit
    assert plan(24, 8, 8, 32768, arch="sm_90a", splits=5).fact("splits") == 4    # 24 x 6 > 132: one fewer
    assert plan(24, 8, 8, 32768, arch="sm_90a", splits=3).fact("paired splits") is False   # 2 would leave 1 slot
    assert plan(16, 8, 8, 8192, arch="sm_90a").fact("paired splits") is True    # 16 x 8
    assert plan(1, 8, 8, 1024, arch="sm_90a").fact("paired splits") is False    # the value split instead
    assert plan(1, 8, 16, 8192).fact("paired splits") is False                  # the mma.sync build: never
    # whole prefix tiles by tensor copy (sm_90a): a map of kv_cache with 64 x 64 boxes, and the flag that it is one
    mapped = plan(1, 8, 16, 8192, arch="sm_90a").launches[0].args
    assert mapped[2] == TensorMap("kv_cache", 64, 64) and mapped[3] == 1
    assert plan(1, 8, 16, 8192, arch="sm_90a").launches[0].arg_sizes[:4] == (8, 8, 128, 4)
    assert plan(1, 8, 16, 8192, arch="sm_90a").fact("keys by tensor copy") is True
    for made in (plan(1, 8, 16, 8192), plan(1, 8, 16, 8192, arch="sm_90a", tensor_keys=False),
                 plan(1, 8, 16, 8192, arch="sm_90a", kv_alignment=8)):
        assert made.launches[0].args[2:4] == (TensorMap("kv_cache", 64, 64, encode=False), 0)
        assert made.fact("keys by tensor copy") is False
    from kdt.launch import verify_attn as launcher

    cache = lambda pages: ArraySpec((pages, 64, 576), "bfloat16")
    sm90a, knobs = targets("verify-attn", "sm_90a", 132), launcher.Knobs()
    assert launcher.tensor_keys(cache(2**25), sm90a, knobs) and not launcher.tensor_keys(cache(2**25 + 1), sm90a, knobs)


@pytest.mark.nvcc
def test_tree_accept_splits_the_vocabulary_for_small_batches(targets):
    target = targets("tree-accept", "sm_90")

    def plan(groups, slots, vocab, **knobs):
        inputs = {name: ArraySpec((groups, slots), "int32") for name in ("token", "first_child", "next_sibling")}
        inputs.update(n_nodes=ArraySpec((groups,), "int32"),
                      target_logits=ArraySpec((groups, slots, vocab), "bfloat16"))
        return ops.plan_for("tree-accept", inputs, {"max_depth": 15}, target, knobs)

    assert plan(64, 64, 163840).fact("vocab splits") == 1
    assert plan(1, 16, 163840).fact("vocab splits") > 1
    assert plan(1, 16, 163840, splits=3).fact("vocab splits") == 3
    assert plan(64, 64, 163840).workspace_bytes == 64 * 64 * 8 + 64 * 4


@pytest.mark.nvcc
def test_tree_sample_draws_every_slot_at_once_only_for_few_rows(targets):
    def plan(groups, slots, arch="sm_90", sms=None, **knobs):
        inputs = {name: ArraySpec((groups, slots), "int32") for name in ("token", "first_child", "next_sibling")}
        inputs.update(n_nodes=ArraySpec((groups,), "int32"),
                      target_logits=ArraySpec((groups, slots, 163840), "bfloat16"),
                      temperature=ArraySpec((groups,), "float32"), top_k=ArraySpec((groups,), "int32"),
                      top_p=ArraySpec((groups,), "float32"), seed=ArraySpec((groups,), "uint64"),
                      position=ArraySpec((groups,), "int64"))
        return ops.plan_for("tree-sample", inputs, {"max_depth": 15}, targets("tree-sample", arch, sms), knobs)

    def path(*args, **kwargs):
        return [k.function for k in plan(*args, **kwargs).launches]

    few = plan(1, 16)          # one request: every slot's draw at once (one draw of latency), the last one walks
    assert path(1, 16) == ["kdt_tree_sample_slots6"] and few.launches[0].grid[0] == 16 * 6   # 96 blocks, one a SM
    assert few.launches[0].cluster == 6 and few.launches[0].blocks_per_sm == 1
    assert few.workspace_bytes == 16 * 2 * 4 + 4
    eight = plan(1, 16, six_block_waves=0)
    assert path(1, 16, six_block_waves=0) == ["kdt_tree_sample_slots"] and eight.launches[0].grid[0] == 16 * 8
    assert eight.launches[0].cluster == 8 and eight.launches[0].blocks_per_sm == 2
    assert path(1, 44) == ["kdt_tree_sample_slots6"]                       # 264 blocks: two waves of 132 SMs
    assert path(1, 45) == ["kdt_tree_sample_slots"]                        # 270: past two waves, eight at two a SM
    many = plan(64, 64)        # the walk: only the rows a walk visits are read
    assert path(64, 64) == ["kdt_tree_sample_walk"] and many.launches[0].grid[0] == 64 * 8
    assert many.workspace_bytes == 0
    assert path(1, 16, every_slot_blocks_per_sm=0) == ["kdt_tree_sample_walk"]
    assert path(1, 300) == ["kdt_tree_sample_walk"]                        # N past the every-slot path's SLOTS_MAX
    assert path(4, 16, arch="sm_120", sms=70) == ["kdt_tree_sample_walk"]  # 512 blocks > 4 per SM of 70 SMs
    assert path(2, 16, arch="sm_120", sms=70) == ["kdt_tree_sample_slots"]   # 192 blocks of six > two waves of 70
    assert path(1, 16, arch="sm_120", sms=70) == ["kdt_tree_sample_slots6"]


def test_knobs_parse_convert_and_name_the_bad_ones():
    assert make_knobs(topk_launcher.Knobs, None) == topk_launcher.Knobs()
    assert make_knobs(topk_launcher.Knobs, {"min_chunk": "4096", "resident": "off"}) == \
        topk_launcher.Knobs(min_chunk=4096, resident=False)
    from kdt.launch import tree_build

    assert make_knobs(tree_build.Knobs, {"select_min_budget": "auto"}).select_min_budget is None
    assert make_knobs(tree_build.Knobs, {"select_min_budget": 7}).select_min_budget == 7
    from kdt.launch import verify_attn

    assert make_knobs(verify_attn.Knobs, {"split_values": 0}).split_values == 0.0     # an int for a float knob
    assert make_knobs(verify_attn.Knobs, {"split_values": "0.5"}).split_values == 0.5
    with pytest.raises(BadInput, match="split_values"):
        make_knobs(verify_attn.Knobs, {"split_values": True})
    with pytest.raises(BadInput, match="min_chunk"):
        make_knobs(topk_launcher.Knobs, {"min_chunk": 4.5})                       # but no float for an int one
    with pytest.raises(BadInput, match="min_chunk"):
        make_knobs(topk_launcher.Knobs, {"nope": 1})
    with pytest.raises(BadInput) as error:
        make_knobs(topk_launcher.Knobs, {"min_chunk": "many"})
    assert "min_chunk" in error.value.argument
    assert parse_knob_options(["a=1", "b = x"]) == {"a": "1", "b": "x"}
    with pytest.raises(BadInput, match="NAME=VALUE"):
        parse_knob_options(["a"])


def test_plans_are_checked_against_the_contract_first():
    target = Target.make("sm_90", 132, {})
    with pytest.raises(BadInput) as error:
        ops.plan_for("topk", {"logits": ArraySpec((1, 2, 100), "float32")}, {"k": 101}, target)
    assert error.value.argument == "k"


@pytest.mark.nvcc
def test_knobs_that_are_not_a_mapping_are_bad_input_and_checks_are_not_skipped_by_the_plan_cache(targets):
    target = targets("topk", "sm_90")
    logits = {"logits": ArraySpec((1, 15, 163840), "float32")}
    for knobs in ([("gate", False)], "gate=0"):
        with pytest.raises(BadInput, match="knobs: expected a mapping"):
            ops.plan_for("topk", logits, {"k": 64}, target, knobs)
    assert ops.plan_for("topk", logits, {"k": 64}, target, {"gate": "false"}).path == "radix"
    # a bad layout fails every time, not only before its first (cached) success with good values
    for _ in range(2):
        with pytest.raises(BadInput):
            ops.plan_for("topk", logits, {"k": 2000}, target)


class _DeviceArray:
    """What kdt.ops reads of a CuPy array before a launch: shape, dtype, address, device and contiguity."""

    def __init__(self, shape, dtype, address=1 << 30):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.data = types.SimpleNamespace(ptr=address, device_id=0)
        self.flags = types.SimpleNamespace(c_contiguous=True)


@pytest.fixture
def stand_in_gpu(monkeypatch, targets) -> list:
    """kdt.ops on _DeviceArrays with sm_90's plans: the eager path's checks, keys and caches without a GPU. Returns
    the names of the functions launched, in order."""
    launched = []
    stream = types.SimpleNamespace(is_capturing=lambda: False)   # eager calls: never captured here

    def get_function(name):
        def function(grid, block, args, shared_mem=0, stream=None):
            launched.append(name)

        function.max_dynamic_shared_size_bytes = 0
        return function

    cp = types.SimpleNamespace(ndarray=_DeviceArray, uint8=np.uint8, uint16=np.uint16, empty=_DeviceArray,
                               zeros=lambda n, dtype: _DeviceArray((n,), dtype),   # a plan's workspace
                               cuda=types.SimpleNamespace(get_device_id=lambda: 0, get_current_stream=lambda: stream))
    monkeypatch.setattr(runtime, "cupy", lambda: cp)
    monkeypatch.setattr(runtime, "target", lambda kernel: targets(kernel, "sm_90"))
    monkeypatch.setattr(runtime, "load", lambda kernel: types.SimpleNamespace(get_function=get_function))
    return launched


@pytest.mark.nvcc
def test_an_eager_call_plans_afresh_for_another_alignment_dtype_shape_or_knob(stand_in_gpu, targets):
    """kdt.ops.plan (the eager path's cached plan) is what the launcher plans for the array's layout, whatever was
    planned before."""
    target, base = targets("topk", "sm_90"), 1 << 20
    calls = [(0, "float32", 163840, None), (4, "float32", 163840, None), (0, "float32", 163840, None),
             (0, "float32", 163840, {"gate": False}), (0, "bfloat16", 163840, None), (64, "float32", 163776, None),
             (4, "float32", 163840, {"gate": False})]
    plans = []
    for offset, dtype, vocab, knobs in calls:
        address = base + offset
        logits = _DeviceArray((1, 15, vocab), "uint16" if dtype == "bfloat16" else dtype, address)
        plans.append(ops.plan("topk", {"logits": ops.Bf16(logits) if dtype == "bfloat16" else logits}, {"k": 64},
                              knobs=knobs))
        # what the launcher plans for this layout, past every cache in kdt.ops
        spec = ArraySpec((1, 15, vocab), dtype, min(256, address & -address))
        assert plans[-1] == topk_launcher.plan({"logits": spec}, {"k": 64}, target,
                                               make_knobs(topk_launcher.Knobs, knobs)), (offset, dtype, vocab, knobs)
    assert all(a != b for a, b in zip(plans, plans[1:]))   # each call changes what the plan depends on


@pytest.mark.nvcc
def test_an_eager_call_sizes_its_outputs_by_its_params_and_checks_out_every_time(stand_in_gpu):
    spec = stages.get("topk")
    logits = _DeviceArray((1, 15, 163840), "float32")
    for k in (40, 48, 40):
        outputs = ops.run("topk", {"logits": logits}, {"k": k})
        want = spec.output_layout({"logits": logits.shape}, {"k": k})
        assert {name: array.shape for name, array in outputs.items()} == {name: w.shape for name, w in want.items()}
    # a wrong out= fails every time, before any launch, not only before a call with the right one
    right = ops.run("topk", {"logits": logits}, {"k": 40})
    stand_in_gpu.clear()
    for _ in range(2):
        with pytest.raises(BadInput) as error:
            ops.run("topk", {"logits": logits}, {"k": 48}, out=right)
        assert error.value.argument == "out['top_ids']" and not stand_in_gpu
    ops.run("topk", {"logits": logits}, {"k": 40}, out=right)
    assert len(stand_in_gpu) == 1
