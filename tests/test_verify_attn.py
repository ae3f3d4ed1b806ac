"""verify-attn: the float64 reference against a per-row loop, and its bad input."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdt.dtypes import to_bf16
from kdt.stages import verify_attn as stage
from kdt.refs.errors import BadInput
from kdt.refs.verify_attn import PAGE_SIZE, unpack_mask, verify_attn


def small_inputs(seed=0, key_dim=8, d_v=4, heads=2, prefix=(70, 0), slots=5):
    rng = np.random.default_rng(seed)
    groups = len(prefix)
    pages = 6
    mask = np.zeros((groups, slots, 1), np.uint32)
    parent = [-1, 0, 0, 1, 3][:slots]
    for i in range(slots):
        j = i
        while j >= 0:
            mask[:, i, 0] |= np.uint32(1 << j)
            j = parent[j]
    return dict(
        q=to_bf16(rng.standard_normal((groups, slots, heads, key_dim))),
        kv_cache=to_bf16(rng.standard_normal((pages, PAGE_SIZE, key_dim))),
        block_table=np.array([[4, 1], [2, 0]], np.int32)[:groups],
        prefix_len=np.array(prefix, np.int32),
        kv_tree=to_bf16(rng.standard_normal((groups, slots, key_dim))),
        mask=mask,
        n_nodes=np.array([slots - 1, slots - 2], np.int32)[:groups],
    ), d_v


def test_matches_a_row_by_row_loop():
    inputs, d_v = small_inputs()
    scale = 0.3
    out = verify_attn(**inputs, softmax_scale=scale, d_v=d_v)
    q = inputs["q"].astype(np.float64)
    for g in range(2):
        keys = []
        for t in range(inputs["prefix_len"][g]):
            keys.append(inputs["kv_cache"][inputs["block_table"][g, t // PAGE_SIZE], t % PAGE_SIZE])
        for i in range(5):
            row_keys = list(keys) + [inputs["kv_tree"][g, j] for j in range(5)
                                     if inputs["mask"][g, i, 0] >> np.uint32(j) & np.uint32(1)]
            for h in range(2):
                if i > inputs["n_nodes"][g]:
                    assert (out["out"][g, i, h] == 0).all() and out["lse"][g, i, h] == -np.inf
                    continue
                k = np.array(row_keys, np.float64)
                s = scale * (k @ q[g, i, h])
                lse = np.log(np.sum(np.exp(s - s.max()))) + s.max()
                p = np.exp(s - lse)
                np.testing.assert_allclose(out["out"][g, i, h], (p @ k[:, :d_v]).astype(np.float32), rtol=1e-6)
                assert abs(out["lse"][g, i, h] - lse) < 1e-5


def test_unpack_mask_bit_order():
    mask = np.array([[1 | 1 << 31, 1 << 1]], np.uint32)
    assert np.flatnonzero(unpack_mask(mask, 40)[0]).tolist() == [0, 31, 33]


@pytest.mark.parametrize("change, argument", [
    (lambda x: x.update(prefix_len=np.array([200, 0], np.int32)), "prefix_len[0]"),
    (lambda x: x.update(block_table=np.array([[4, 9], [2, 0]], np.int32)), "block_table[0]"),
    (lambda x: x.update(q=x["q"].astype(np.float32)), "q"),
    (lambda x: x.update(mask=x["mask"][:, :, :0]), "mask"),
])
def test_bad_input_is_named(change, argument):
    inputs, d_v = small_inputs()
    change(inputs)
    with pytest.raises(BadInput) as error:
        verify_attn(**inputs, softmax_scale=0.1, d_v=d_v)
    assert error.value.argument == argument


def test_dqk_smaller_than_dv_is_bad_input():
    inputs, _ = small_inputs()
    with pytest.raises(BadInput) as error:
        verify_attn(**inputs, softmax_scale=0.1, d_v=9)
    assert error.value.argument == "d_v"


def test_golden_cases_are_the_contract_dims():
    for case in stage.make_cases():
        assert case.inputs["q"].shape[-1] == stage.KEY_DIM and case.params["d_v"] == stage.VALUE_DIM
        assert case.inputs["q"].dtype == np.dtype(ml_dtypes.bfloat16)


def test_the_tp8_golden_cases_are_the_deployments_shapes():
    """Issue 17's golden cases: H = 8, G in {1, 4}, N in {8, 16, 64}; ragged prefixes (an empty one, none a multiple
    of the page, one over many pages), each request's pages a shuffled subset of a cache with unused pages, masks of
    trees the builder made (branching, every slot under the root)."""
    cases = [case for case in stage.make_cases() if case.name.startswith("tp8_")]
    shapes = {case.name: case.inputs["q"].shape[:3] for case in cases}
    assert shapes == {"tp8_g4_n8_ragged": (4, 8, 8), "tp8_g1_n16": (1, 16, 8), "tp8_g1_n64": (1, 64, 8)}
    prefixes = np.concatenate([case.inputs["prefix_len"] for case in cases])
    assert 0 in prefixes and all(p % PAGE_SIZE for p in prefixes if p) and max(prefixes) > 15 * PAGE_SIZE
    for case in cases:
        x = case.inputs
        pages = -(-x["prefix_len"] // PAGE_SIZE)
        used = np.concatenate([x["block_table"][g, :n] for g, n in enumerate(pages)])
        assert len(set(used)) == len(used) < x["kv_cache"].shape[0], case.name    # unused pages in the cache
        assert not all(np.all(np.diff(x["block_table"][g, :n]) == 1) for g, n in enumerate(pages) if n > 1), case.name
        for g in range(len(pages)):
            bits = unpack_mask(x["mask"][g], x["mask"].shape[1])
            ancestors = bits.sum(axis=1)
            assert bits[:, 0].all() and np.all(np.diag(bits)), case.name            # the root, and each slot itself
            assert 2 < ancestors.max() < len(ancestors), case.name                  # deeper than a star, not a chain
            assert len(ancestors) - 1 == x["n_nodes"][g], case.name                  # every slot a drafted node


def test_the_max_jumps_case_moves_the_running_max_inside_a_split():
    """max_jumps' loud pages 2 / 5 / 8 / 11 are the third tile of every three (a split of three tiles, `splits=5`): the
    sm_90a softmax keeps a row's max until a tile's exceeds it by MAX_SLACK = 8 (log2 units, config.cuh). Past page 2
    some rows stay within that slack and some jump past it; past pages 5, 8 and 11 every row jumps, so O is rescaled
    mid-split on both paths."""
    case = next(case for case in stage.make_cases() if case.name == "max_jumps")
    x = case.inputs
    prefix = int(x["prefix_len"][0])
    pages = x["block_table"][0, : -(-prefix // PAGE_SIZE)]
    keys = x["kv_cache"].astype(np.float32)[pages].reshape(-1, stage.KEY_DIM)[:prefix]
    scores = np.einsum("nhd,td->nht", x["q"][0].astype(np.float32), keys) * case.params["softmax_scale"] * np.log2(np.e)
    tile_max = [scores[..., t: t + PAGE_SIZE].max(axis=-1) for t in range(0, prefix, PAGE_SIZE)]
    jumps = {t: tile_max[t] - np.maximum(tile_max[t - 2], tile_max[t - 1]) for t in (2, 5, 8, 11)}
    assert (jumps[2] <= 8).any() and (jumps[2] > 8).any()
    assert all((jumps[t] > 8).all() for t in (5, 8, 11))


def test_random_cases_have_loud_pages_now_and_then():
    """kdt fuzz's cases scale a few prefix pages' keys by 4, 8 or 16 in about 30% of cases, and say so."""
    rng = np.random.default_rng(7)
    cases = [stage.random_case(rng) for _ in range(40)]
    loud = 0
    for case in cases:
        x = case.inputs
        used = np.concatenate([x["block_table"][g, : -(-n // PAGE_SIZE)] for g, n in enumerate(x["prefix_len"])])
        if len(used) == 0:
            continue
        rms = np.sqrt((x["kv_cache"].astype(np.float32)[used] ** 2).mean(axis=(1, 2)))
        says = "loud pages" in case.description
        assert (rms.max() > 3.5 * np.median(rms)) == says or (says and len(used) < 3), case.description
        loud += says
    assert 3 <= loud <= 25


@pytest.mark.gpu
def test_a_max_that_jumps_inside_a_split():
    """max_jumps with its loud pages inside a split (three tiles a split, paired or a value split; two a split; the
    whole prefix in one split): within the contract of the reference (kdt.verify: outputs poisoned, twice)."""
    from kdt import stages, verify

    spec = stages.get("verify-attn")
    case = next(case for case in stage.make_cases() if case.name == "max_jumps")
    for knobs in ({"splits": 5}, {"splits": 5, "split_values": 0}, {"splits": 7}, {"splits": 1}):
        result = verify.verify_fresh(spec, case, knobs=knobs)
        assert result.passed, (knobs, result)


@pytest.mark.gpu
def test_rows_of_more_splits_than_the_combine_holds_in_registers():
    """The combine holds a row's first 32 * COMBINE_LSE_CHUNKS (64) split lse in registers and reads the rest where
    it uses them: 72 and 100 splits over a 5,000-token prefix (80 key tiles with the tree's: splits past the 80th
    hold none, lse -inf), and 40 for comparison, within the contract of the reference (kdt.verify: outputs
    poisoned, twice)."""
    from kdt import stages, verify
    from kdt.spec import Case

    spec = stages.get("verify-attn")
    rng = np.random.default_rng(11)
    inputs = stage.attention_inputs(rng, [5000], heads=8, depth=3, fanout=4, budget=15)
    case = Case("many_splits", "G=1 H=8 B=15, prefix 5000", 11,
                {"softmax_scale": float(np.float32(1 / np.sqrt(576))), "d_v": 512}, inputs)
    for knobs in ({"splits": 72}, {"splits": 100}, {"splits": 40}):
        result = verify.verify_fresh(spec, case, knobs=knobs)
        assert result.passed, (knobs, result)


@pytest.mark.gpu
def test_whole_pages_by_tensor_copy_give_the_bits_of_cp_async():
    """sm_90a copies a split's whole prefix pages, from its third on, by the tensor-copy engine, whose 128-byte
    swizzle must be the layout the wgmma reads. With one and three splits a query tile (a CTA streams most of its
    tiles that way), ragged prefixes whose last pages are partial and pages shuffled: within the contract of the
    reference (kdt.verify: outputs poisoned, twice), and out and lse bit for bit those of the cp.async loads."""
    from kdt import ops, runtime, stages, verify
    from kdt.spec import Case

    spec = stages.get("verify-attn")
    if runtime.target("verify-attn").constant("kdt_verify_attn_tensor_keys") != 1:
        pytest.skip("this GPU's cubin copies no key tile by tensor copy (sm_90a only)")
    rng = np.random.default_rng(7)
    inputs = stage.attention_inputs(rng, [1000, 2500, 130], heads=8, depth=3, fanout=4, budget=15)
    case = Case("tensor_pages", "G=3 H=8 B=15, prefixes 1000 / 2500 / 130", 7,
                {"softmax_scale": float(np.float32(1 / np.sqrt(576))), "d_v": 512}, inputs)
    for knobs in ({"splits": 1}, {"splits": 3}):
        result = verify.verify_fresh(spec, case, knobs=knobs)
        assert result.passed, (knobs, result)
    device = verify.upload(case.inputs)
    params = {**case.params, "out_dtype": "float32"}
    bits = []
    for tensor_keys in (True, False):
        out = verify.allocate_outputs(spec, device, params)
        for array in out.values():
            verify.poison(verify.raw(array), 0)
        ops.run(spec, device, params, out=out, knobs={"splits": 1, "tensor_keys": tensor_keys})
        bits.append({name: verify.download(array).view(np.uint32) for name, array in out.items()})
    assert all(np.array_equal(bits[0][name], bits[1][name]) for name in bits[0])
