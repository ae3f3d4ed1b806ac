"""`topk`: spec, golden cases and launch-time layout checks."""

from __future__ import annotations

import numpy as np

import kdt.refs.topk as reference
from kdt.compare import AbsTol, Exact
from kdt.dtypes import to_bf16
from kdt.spec import Case, OutputLayout, StageSpec
from kdt.stages._util import drafter_logits, quantised_logits, require_layout
from kdt.refs.errors import BadInput

LOGP_ATOL = 1e-5
MAX_VOCAB = 262144


def _case(name, description, seed, k, logits) -> Case:
    return Case(name, description, seed, {"k": k}, {"logits": logits})


def make_cases() -> list[Case]:
    cases = []

    def rng(seed):
        return np.random.default_rng(seed)

    cases.append(_case("drafter_k7_v8_vocab163840_f32", "real drafter shape: K=7, V=8, 163840-entry vocabulary, float32",
                       101, 8, drafter_logits(rng(101), 1, 7, 163840)))
    cases.append(_case("drafter_k15_v8_vocab163840_bf16", "real drafter shape: K=15, V=8, 163840-entry vocabulary, bf16",
                       102, 8, to_bf16(drafter_logits(rng(102), 1, 15, 163840))))
    cases.append(_case("batch_g4_k7_v8_vocab32000", "G=4 requests, K=7, V=8, vocab 32000 (f32)",
                       103, 8, drafter_logits(rng(103), 4, 7, 32000)))
    ties = np.round(rng(104).standard_normal((2, 3, 4099)).astype(np.float32) * 2) / 2
    cases.append(_case("exact_ties_odd_vocab", "logits on a 0.5 grid: many exact ties (smaller id first); vocab 4099 is odd",
                       104, 16, ties.astype(np.float32)))
    masked = drafter_logits(rng(105), 2, 4, 5000)
    masked[:, :, 5:] = -np.inf  # masked vocabulary: only 5 finite logits, V=8 reaches into the -inf tail
    masked[1, 2, :] = -np.inf
    masked[1, 2, 4321] = 3.0  # one finite logit in the whole row
    cases.append(_case("masked_vocab_neg_inf", "-inf logits (masked vocabulary): fewer finite logits than V",
                       105, 8, masked))
    cases.append(_case("v1_greedy", "V=1: the greedy token and its log-prob", 106, 1,
                       drafter_logits(rng(106), 3, 5, 1000)))
    cases.append(_case("v_equals_vocab", "V = vocab = 37: a full sort of each row", 107, 37,
                       drafter_logits(rng(107), 2, 3, 37)))
    cases.append(_case("v1024_vocab5003", "the widest V=1024 over vocab 5003, bf16", 108, 1024,
                       to_bf16(drafter_logits(rng(108), 1, 2, 5003))))
    cases.append(_case("k1_g1", "K=1, G=1, V=8", 109, 8, drafter_logits(rng(109), 1, 1, 1500)))
    flat = np.full((1, 2, 3000), -1.25, np.float32)
    flat[0, 1, ::7] = 0.75
    cases.append(_case("all_equal_rows", "a row of identical logits and a row with 429 tied maxima", 110, 8, flat))
    signed_zero = np.zeros((1, 1, 64), np.float32)
    signed_zero[0, 0, ::2] = -0.0
    signed_zero[0, 0, 40:] = -1.0
    cases.append(_case("signed_zeros", "+0.0 and -0.0 logits tie: smaller id first", 111, 12, signed_zero))
    # wide V over a quantised vocabulary: hundreds of logits equal at the V-th place (the smaller ids are kept)
    cases.append(_case("wide_v64_quantised_vocab32768", "V=64, integer logits: ~200 tied at the 64th place", 112, 64,
                       quantised_logits(rng(112), 1, 3, 32768)))
    cases.append(_case("wide_v256_quantised_vocab65536_bf16", "V=256 from bf16 integer logits: ~400 tied at the "
                       "256th place", 113, 256, to_bf16(quantised_logits(rng(113), 1, 2, 65536))))
    cases.append(_case("wide_v1024_quantised_vocab16384", "V=1024, integer logits: ~990 tied at the 1024th place",
                       114, 1024, quantised_logits(rng(114), 1, 2, 16384)))
    # the gate path's worst orders: every element beats the gate so far (prunes all the way), and fewer finite
    # logits than V (the gate stays at -inf's key)
    ascending = np.sort(drafter_logits(rng(115), 1, 2, 65536), axis=-1)
    ascending[0, 1] = ascending[0, 1, ::-1]
    cases.append(_case("wide_v64_ascending_vocab65536", "V=64 over an ascending and a descending row (the gate rises "
                       "at every element of the first after its first step)", 115, 64, ascending))
    sparse = np.full((1, 2, 8192), -np.inf, np.float32)
    draw = rng(116)
    sparse[0][:, draw.choice(8192, 40, replace=False)] = draw.standard_normal((2, 40)).astype(np.float32)
    cases.append(_case("wide_v100_sparse_vocab8192_bf16", "V=100 over 40 finite logits: the rest -inf, ids decide",
                       116, 100, to_bf16(sparse)))
    # bf16 log-probabilities (every logit < 0): the gate is negative, on the bf16 grid when it is a kept element's
    # value and between two bf16 values when a prune raised it to a bin's floor (the packed test's two forms), with
    # runs of equal values at the V-th place
    shifted = drafter_logits(rng(117), 1, 4, 16384).astype(np.float64)
    shifted -= shifted.max(-1, keepdims=True)
    logprobs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    cases.append(_case("wide_v512_logprob_rows_vocab16384_bf16", "V=512 over bf16 log-probabilities: a negative "
                       "gate, on and off the bf16 grid, with ties at the 512th place", 117, 512,
                       to_bf16(logprobs.astype(np.float32))))
    return cases


def random_case(rng: np.random.Generator) -> Case:
    """Random shape within the limits, drawn toward the hard parts: odd vocabularies, ties, -inf, V=1,
    V=vocab, wide V, bf16."""
    groups, depth = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    vocab = int(rng.choice([1, 2, 7, 33, 1000, 4099, 20001, 65537, 131072]))
    k = int(min(vocab, 1024, rng.choice([1, 2, 8, 8, 16, 33, 256, 1024, vocab])))
    logits = drafter_logits(rng, groups, depth, vocab)
    if rng.random() < 0.3:
        logits = np.round(logits * 2) / 2  # ties
    if rng.random() < 0.2:
        logits = quantised_logits(rng, groups, depth, vocab)  # runs of hundreds of ties at a wide V's edge
    if rng.random() < 0.3:
        logits[rng.random(logits.shape) < rng.random()] = -np.inf
        logits[..., int(rng.integers(0, vocab))] = 1.0  # keep one finite logit per row
    logits = logits.astype(np.float32)
    seed = int(rng.integers(0, 2**31))
    return _case(f"random_{seed}", f"random G={groups} K={depth} vocab={vocab} V={k}", seed, k,
                 to_bf16(logits) if rng.random() < 0.5 else logits)


def shrink_case(case: Case):
    """Smaller variants of a failing case, for `kdt fuzz` (largest cuts first): one request, fewer
    positions K, a prefix of the vocabulary (every row keeps a finite logit; V clipped to it), a smaller V."""
    from kdt.fuzz import batch_variants, smaller_sizes, with_inputs

    yield from batch_variants(case)
    logits, k = case.inputs["logits"], int(case.params["k"])
    _, depth, vocab = logits.shape
    for positions in smaller_sizes(depth):
        yield with_inputs(case, logits=logits[:, :positions])
    for size in smaller_sizes(vocab):
        head = logits[:, :, :size]
        if np.isfinite(head.astype(np.float32)).any(axis=2).all():
            yield with_inputs(case, {"k": min(k, size)}, logits=head)
    for fewer in smaller_sizes(k):
        yield with_inputs(case, {"k": fewer})


def output_layout(shapes, params) -> dict[str, OutputLayout]:
    groups, depth, _ = shapes["logits"]
    k = int(params["k"])
    return {"top_ids": OutputLayout((groups, depth, k), "int32"),
            "top_logp": OutputLayout((groups, depth, k), "float32")}


def check_layout(shapes, dtypes, params) -> None:
    _, _, vocab = require_layout(shapes, dtypes, "logits", 3, ("float32", "bfloat16"))
    if not 1 <= vocab <= MAX_VOCAB:
        raise BadInput("logits", f"a vocabulary in [1, {MAX_VOCAB}]", vocab)
    k = params.get("k")
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= min(vocab, reference.MAX_K):
        raise BadInput("k", f"an integer in [1, min(vocab={vocab}, {reference.MAX_K})]", k)


def bench_shapes(quick: bool, wide: bool = False):
    from kdt.bench import BenchShape, device_bf16

    def shape(groups, depth, vocab, k, dtype, cpu=False):
        itemsize = 2 if dtype == "bf16" else 4

        def make(cp):
            rng = cp.random.default_rng(groups * 1000 + depth)
            logits = rng.standard_normal((groups, depth, vocab), dtype=cp.float32) * cp.float32(1.5)
            return {"logits": device_bf16(cp, logits) if dtype == "bf16" else logits}

        layout = {"logits": ((groups, depth, vocab), "bfloat16" if dtype == "bf16" else "float32")}
        return BenchShape(f"G{groups}_K{depth}_vocab{vocab}_V{k}_{dtype}", make, {"k": k}, layout,
                          groups * depth * (vocab * itemsize + k * 8), cpu_baseline=cpu)

    if wide:  # DDTree's own fan-out (issue 20): V up to the budget, over Kimi's vocabulary
        if quick:
            return [shape(8, 15, 163840, 64, "f32"), shape(8, 15, 163840, 1024, "bf16")]
        return [shape(groups, 15, 163840, k, dtype, cpu=groups == 1) for groups in (1, 8, 64)
                for k, dtype in ((64, "f32"), (256, "f32"), (1024, "bf16"))]
    shapes = [shape(64, 15, 163840, 8, "f32"), shape(64, 15, 163840, 8, "bf16"),
              shape(1, 7, 163840, 8, "f32", cpu=True), shape(1, 15, 163840, 8, "bf16", cpu=True)]
    if not quick:
        shapes += [shape(1, 15, 163840, 8, "f32", cpu=True), shape(8, 15, 163840, 64, "f32"),
                   shape(8, 15, 163840, 1024, "bf16"), shape(64, 15, 32000, 8, "f32"), shape(4, 7, 262144, 8, "bf16")]
    return shapes


def wide_bench_shapes(quick: bool):
    """`--set wide`: V in {64, 256, 1024} at G in {1, 8, 64} (--quick: the two shapes of issue 20's table)."""
    return bench_shapes(quick, wide=True)


def torch_baseline(inputs, params):
    """The obvious PyTorch version: log_softmax over the vocabulary, then topk."""
    import torch

    from kdt import ops

    logits = inputs["logits"]
    if isinstance(logits, ops.Bf16):
        tensor = torch.from_dlpack(logits.bits.view("int16")).view(torch.bfloat16)
    else:
        tensor = torch.from_dlpack(logits)
    k = int(params["k"])
    return lambda: torch.log_softmax(tensor.float(), dim=-1).topk(k, dim=-1)


SPEC = StageSpec(
    name="topk",
    position=1,
    params=("k",),
    inputs=("logits",),
    outputs={"top_ids": Exact(), "top_logp": AbsTol(LOGP_ATOL)},
    reference_module=reference,
    run_reference=lambda inputs, params: reference.topk(inputs["logits"], params["k"]),
    make_cases=make_cases,
    output_layout=output_layout,
    check_layout=check_layout,
    description="drafter logits to per-position top-V log-probabilities",
    random_case=random_case,
    shrink=shrink_case,
    bench_shapes=bench_shapes,
    bench_sets={"wide": wide_bench_shapes},
    torch_baseline=torch_baseline,
)
