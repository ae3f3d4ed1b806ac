"""topk: the reference against a plain-Python definition, and its bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdt.dtypes import to_bf16
from kdt.stages import topk as stage
from kdt.stages._util import drafter_logits
from kdt.refs.errors import BadInput
from kdt.refs.topk import topk

grid = st.sampled_from([3.0, 1.5, 0.0, -0.0, -0.5, -2.0, -np.inf])


@st.composite
def logits(draw):
    groups, depth, vocab = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 40))
    values = np.array(draw(st.lists(grid, min_size=groups * depth * vocab, max_size=groups * depth * vocab)),
                      np.float32).reshape(groups, depth, vocab)
    values[:, :, draw(st.integers(0, vocab - 1))] = 0.25  # at least one finite logit per row
    k = draw(st.integers(1, vocab))
    return values, k


@settings(max_examples=200, deadline=None)
@given(logits(), st.booleans())
def test_matches_plain_python(case, bf16):
    values, k = case
    if bf16:
        values = to_bf16(values)
    out = topk(values, k)
    for g in range(values.shape[0]):
        for d in range(values.shape[1]):
            row = [float(v) for v in values[g, d]]
            order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
            finite = [v for v in row if v != -math.inf]
            peak = max(finite)
            lse = peak + math.log(math.fsum(math.exp(v - peak) for v in finite))
            assert out["top_ids"][g, d].tolist() == order
            want = np.array([row[i] - lse for i in order], np.float32)
            np.testing.assert_allclose(out["top_logp"][g, d], want, rtol=0, atol=1e-6)


def test_golden_cases_cover_their_descriptions():
    cases = {case.name: case for case in stage.make_cases()}
    masked = stage.SPEC.reference(cases["masked_vocab_neg_inf"].inputs, {"k": 8})
    assert np.isneginf(masked["top_logp"][0, 0, 5:]).all()  # fewer finite logits than V
    assert masked["top_ids"][0, 0, 5:].tolist() == [5, 6, 7]  # -inf ties: smaller id first
    zeros = stage.SPEC.reference(cases["signed_zeros"].inputs, {"k": 12})
    assert zeros["top_ids"][0, 0].tolist() == list(range(12))


@pytest.mark.parametrize("values, k, argument", [
    (np.array([[[1.0, np.nan]]], np.float32), 1, "logits"),
    (np.array([[[-np.inf, -np.inf]]], np.float32), 1, "logits"),
    (np.array([[[1.0, 2.0]]], np.float32), 3, "k"),
    (np.array([[[1.0, 2.0]]], np.float32), 0, "k"),
    (np.array([[[1.0, 2.0]]], np.float64), 1, "logits"),
    (np.array([[1.0, 2.0]], np.float32), 1, "logits"),
])
def test_bad_input_is_named(values, k, argument):
    with pytest.raises(BadInput) as error:
        topk(values, k)
    assert error.value.argument == argument


# --- the kernel on the GPU, path by path (the golden file and random inputs: tests/test_kernels.py) ----------

def long_rows(vocab: int, seed: int) -> np.ndarray:
    """Eleven rows that each stress the candidate gate of a block that scans a whole row: normal logits, a
    strictly ascending row (every step holds new maxima), a descending one, one value everywhere, a 0.5 grid
    of ties, a masked row with three finite logits at the very end, the maximum in the last column,
    magnitudes near the float32 limit, a row whose largest values are spread evenly over the columns (when
    the row is split, every split's list interleaves with every other's), a row whose largest values are
    positive subnormals (exact in bf16 too: the packed bf16 maximum keeps subnormals), and a row whose maximum
    is zero, held as +0.0 and -0.0 at many columns (equal logits: the smaller id first)."""
    rng = np.random.default_rng(seed)
    rows = np.empty((11, vocab), np.float32)
    rows[0] = rng.standard_normal(vocab) * 1.5
    rows[1] = np.arange(vocab, dtype=np.float32) * np.float32(1e-3)
    rows[2] = rows[1][::-1]
    rows[3] = -1.25
    rows[4] = np.round(rng.standard_normal(vocab) * 2) / 2
    rows[5] = -np.inf
    rows[5, -3:] = [0.5, -2.0, 0.5]
    rows[6] = rng.standard_normal(vocab)
    rows[6, -1] = 9.0
    rows[7] = rng.standard_normal(vocab) * np.float32(1e37)
    rows[8] = (np.arange(vocab, dtype=np.int64) * 7919 % vocab).astype(np.float32) * np.float32(1e-4)
    rows[9] = -rng.random(vocab, dtype=np.float32) - np.float32(0.5)
    tiny = np.ldexp(np.arange(1, 41, dtype=np.float32), -130)     # 2^-130 .. 40 * 2^-130: subnormal and just above
    rows[9, rng.choice(vocab, tiny.size, replace=False)] = tiny
    rows[9, rng.choice(vocab, 8, replace=False)] = -tiny[:8]
    rows[10] = -rng.random(vocab, dtype=np.float32) - np.float32(0.5)
    zeros = rng.choice(vocab, 48, replace=False)
    rows[10, zeros] = np.where(np.arange(zeros.size) % 2 == 0, np.float32(0.0), np.float32(-0.0))
    return rows.reshape(1, 11, vocab)


def _case_passes(case, path: str, knobs: dict) -> None:
    """Verify `case`, which the launch plan with `knobs` runs on `path`."""
    from kdt import ops, stages, verify

    plan = ops.plan("topk", verify.upload(case.inputs), case.params, knobs=knobs)
    assert plan.path == path, plan
    result = verify.verify_fresh(stages.get("topk"), case, knobs=knobs)
    assert result.passed, [(f.name, f.mismatches, f.diffs[:2]) for f in result.fields if not f.ok]


@pytest.mark.gpu
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("k", [1, 8, 32])
def test_kernel_whole_row_blocks_on_adversarial_rows(bf16, k):
    """Few rows normally split over many blocks of one or two steps each; with the split switched off one
    block scans a whole row (20 to 64 steps), which is where the gate is raised at steps 1, 3, 7, 15, ..."""
    vocab = 163840 + 7                                                # an unaligned tail as well
    logits = long_rows(vocab, seed=k)
    case = stage._case(f"whole_rows_k{k}", "one block per row", k, k, to_bf16(logits) if bf16 else logits)
    _case_passes(case, "small", {"min_chunk": 1 << 18})               # S = 1: one block per row


@pytest.mark.gpu
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("k", [1, 8, 32])
@pytest.mark.parametrize("merge", ["cluster", "workspace"])
def test_kernel_split_rows_on_adversarial_rows(bf16, k, merge):
    """Few rows are split over many blocks whose lists are merged either inside a cluster of blocks (over
    distributed shared memory) or by the last block through the workspace; both on the rows above, where at
    k = 32 the evenly spread row leaves more candidates than the pruned merge ranks, so the full rank merge
    runs."""
    vocab = 163840 + 7
    logits = long_rows(vocab, seed=k + 100)
    case = stage._case(f"split_rows_k{k}", "rows split over blocks", k, k, to_bf16(logits) if bf16 else logits)
    knobs = {"resident": False} if merge == "cluster" else {"cluster_min_splits": 1 << 30}
    _case_passes(case, "cluster" if merge == "cluster" else "small", knobs)


@pytest.mark.gpu
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("k", [64, 1024])
def test_kernel_gate_one_block_on_adversarial_rows(bf16, k):
    """The gate path with one block per row (the split switched off): f32 opens its gate at the first step's vector
    maxima and raises it by prunes; bf16 (sm_90) takes it from the whole row's maxima after the scan, by the
    histogram of the bf16 values below the largest or, for the masked row (its maxima -inf but three), by the
    radix select."""
    logits = long_rows(163840, seed=k + 200)
    case = stage._case(f"gate_rows_k{k}", "one block per row", k, k, to_bf16(logits) if bf16 else logits)
    _case_passes(case, "gate", {"gate_min_chunk": 1 << 18})


@pytest.fixture(params=["wide", "narrow"])
def resident_shape(request):
    """Each resident test on both shapes of the resident variant: the row threshold moved so that the shape under
    test is the preferred one for any row count."""
    return request.param


def _resident_knobs(shape: str) -> dict:
    return {"resident_wide_max_rows": 1 << 30 if shape == "wide" else 0}


def _resident_blocks(shape: str) -> int:
    """Blocks per row of the resident variant's `shape` in the cubin that runs here."""
    from kdt import runtime

    return runtime.target("topk").constant(f"kdt_topk_resident_{shape}_cluster")


@pytest.mark.gpu
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("k", [1, 5, 8])
def test_kernel_resident_cluster_on_adversarial_rows(bf16, k, resident_shape):
    """The resident variant of the cluster path (each block holds its whole chunk in shared memory and sends its
    raw candidates to block 0) on the rows above with an aligned vocabulary.  In the ascending and constant rows
    nearly every element of a block passes its bound (the smallest warp maximum), more than a block can hold, so
    those blocks send their exact top V from V rounds of a block-wide best."""
    logits = long_rows(163840, seed=k + 200)
    case = stage._case(f"resident_k{k}", "resident cluster rows", k, k, to_bf16(logits) if bf16 else logits)
    _case_passes(case, f"resident-{resident_shape}", _resident_knobs(resident_shape))


@pytest.mark.gpu
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("vocab", [65536, 65544, 131072 + 64, 163840, 262144])
def test_kernel_resident_cluster_chunk_shapes(bf16, vocab, resident_shape):
    """Chunks that fill whole groups of a thread's vectors (65536 f32: 4 per thread wide, 8 narrow), leave part of
    a group or of a vector row empty (65544: a short last block), the narrow shape's most (163840 f32: 20 per
    thread), and the widest vocabulary (f32 262144 fits only the wide shape: the narrow preference falls back to
    it); drafter rows and ties."""
    knobs = _resident_knobs(resident_shape)
    if resident_shape == "narrow" and not bf16 and vocab == 262144:
        resident_shape = "wide"
    logits = drafter_logits(np.random.default_rng(vocab), 2, 5, vocab)
    logits[1] = np.round(logits[1] * 4) / 4
    case = stage._case(f"resident_vocab{vocab}", "resident chunk shapes", vocab, 8, to_bf16(logits) if bf16 else logits)
    _case_passes(case, f"resident-{resident_shape}", knobs)


@pytest.mark.gpu
@pytest.mark.parametrize("bf16", [False, True])
def test_kernel_resident_cluster_blocks_rank_their_own_ties(bf16, resident_shape):
    """One block whose chunk holds 100 copies of the row maximum (more candidates than a block sends, fewer than
    it holds: it sends its top V by rank) and one with 300 (more than it holds: V rounds); ties by smaller id."""
    rng = np.random.default_rng(7)
    vocab = 163840
    logits = (rng.standard_normal((1, 2, vocab)) * 1.5).astype(np.float32)
    chunk = vocab // _resident_blocks(resident_shape)    # columns per block (a multiple of CHUNK_ALIGN here)
    for row, (block, ties) in enumerate([(3, 100), (5, 300)]):
        columns = block * chunk + rng.choice(chunk, ties, replace=False)
        logits[0, row, columns] = 16.0                    # exact in bf16, above every other logit
    case = stage._case(f"resident_ties_{'bf16' if bf16 else 'f32'}", "one block of tied maxima", 8, 8,
                       to_bf16(logits) if bf16 else logits)
    _case_passes(case, f"resident-{resident_shape}", _resident_knobs(resident_shape))


# sm_120's per-SM budget (RTX PRO 6000, RTX 5070 Ti) and the small path's blocks per SM there
# (kernels/topk/config.cuh: SMALL_MIN_BLOCKS; plans/kernels/topk.md, "Configuration")
SM120_SMEM_PER_SM = 100 * 1024
SM120_RESERVED_SMEM_PER_BLOCK = 1024
SM120_REGISTERS_PER_SM = 64 * 1024
SMALL_BLOCKS_PER_SM = 3


@pytest.mark.nvcc
@pytest.mark.compile
def test_the_sm120_small_path_keeps_three_blocks_per_sm():
    """Without a cp.async ring, three small-path blocks fit an sm_120 SM: their static shared memory, the dynamic
    stage bytes and the system's 1 KB per block within 100 KB, their registers within 64K (the limits gate checks
    one block; this is what the sm_120 configuration's launch bounds and plans count on)."""
    from kdt import build

    result = build.build("topk", "sm_120")
    stage_bytes = result.constants["kdt_topk_small_stage_bytes"]
    threads = result.constants["kdt_topk_small_threads"]
    small = [r for r in result.resources if r.function.startswith(("kdt_topk_small_", "kdt_topk_cluster_"))]
    assert len(small) == 24
    for r in small:
        block_smem = r.shared_bytes + stage_bytes + SM120_RESERVED_SMEM_PER_BLOCK
        assert SMALL_BLOCKS_PER_SM * block_smem <= SM120_SMEM_PER_SM, (r.function, r.shared_bytes)
        assert SMALL_BLOCKS_PER_SM * threads * r.registers <= SM120_REGISTERS_PER_SM, (r.function, r.registers)
