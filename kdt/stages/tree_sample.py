"""`tree-sample`: spec, golden cases and launch-time layout checks.

Every golden case holds decisive draws only (the contract's "Decision margins"): its generator redraws a request's
seed until the reference finds each draw of its walk decisive, and the reference refuses a case that is not (so
`gen-golden --inputs` names the request of a captured draw on a knife's edge). The smallest margin a case kept is
recorded as its `min_margin` attribute.
"""

from __future__ import annotations

import dataclasses

import numpy as np

import kdt.refs.tree_sample as reference
from kdt.compare import Exact
from kdt.dtypes import to_bf16
from kdt.refs.errors import BadInput
from kdt.spec import Case, StageSpec
from kdt.stages._util import require_layout, require_same
from kdt.stages.tree_accept import OUTPUTS, TREE_INPUTS, check_tree_layout, drafted_tree, output_layout, permuted
from kdt.stages.tree_accept import make_cases as tree_accept_cases

SAMPLING_INPUTS = ("temperature", "top_k", "top_p", "seed", "position")
MAX_REDRAWS = 64          # seeds tried per request before a generator gives up on its logits


def language_model_logits(rng: np.random.Generator, tree: dict, vocab: int, lead: float = 10.0) -> np.ndarray:
    """Logits shaped like a language model's (a normal bulk, the draft's children 6-14 above it, so that drafts are
    often but not always accepted), float32 [G, N, vocab]; tree tokens are taken modulo vocab first."""
    groups, slots = tree["token"].shape
    logits = (rng.standard_normal((groups, slots, vocab), dtype=np.float32) * 1.5).astype(np.float32)
    for g in range(groups):
        for s in range(int(tree["n_nodes"][g]) + 1):
            child = int(tree["first_child"][g, s])
            rank = 0
            while 0 <= child < slots:
                logits[g, s, int(tree["token"][g, child])] += np.float32(lead + 4.0 - 2.0 * rank + rng.random() * 2)
                child, rank = int(tree["next_sibling"][g, child]), rank + 1
    return logits


def sampling_inputs(temperature, top_k, top_p, position, seed=None) -> dict[str, np.ndarray]:
    """The per-request sampling inputs in their contract dtypes (seed: zeros until decisive_seeds draws them)."""
    temperature = np.asarray(temperature, np.float32)
    seed = np.zeros(temperature.shape, np.uint64) if seed is None else np.asarray(seed, np.uint64)
    return {"temperature": temperature, "top_k": np.asarray(top_k, np.int32), "top_p": np.asarray(top_p, np.float32),
            "seed": seed, "position": np.asarray(position, np.int64)}


class Undecided(RuntimeError):
    """A request whose draws stayed on a knife's edge for every seed tried."""


def decisive_seeds(rng: np.random.Generator, inputs: dict, max_depth: int, seed_floor: int = 0) -> tuple[float, int]:
    """Redraw each request's seed (in [seed_floor, 2^64)) until every draw of its walk is decisive; returns the
    smallest margin kept and how many seeds were redrawn. Raises Undecided if a request stays undecided (its
    logits are on a knife's edge everywhere)."""
    kept, redrawn = np.inf, 0
    for g in range(inputs["token"].shape[0]):
        one = {name: array[g:g + 1] for name, array in inputs.items()}
        for attempt in range(MAX_REDRAWS):
            one["seed"] = np.array([rng.integers(seed_floor, 2**64, dtype=np.uint64)], np.uint64)
            out = run_reference_margins(one, max_depth)
            if out["decisive"][0]:
                inputs["seed"][g] = one["seed"][0]
                kept = min(kept, float(out["min_margin"][0]))
                redrawn += attempt
                break
        else:
            raise Undecided(f"request {g}: no decisive draws in {MAX_REDRAWS} seeds")
    return kept, redrawn


def run_reference_margins(inputs: dict, max_depth: int) -> dict:
    return reference.tree_sample(*(inputs[name] for name in (*TREE_INPUTS, "n_nodes")), max_depth,
                                 inputs["target_logits"], *(inputs[name] for name in SAMPLING_INPUTS))


def _case(rng, name, description, case_seed, max_depth, tree, logits, seed_floor=0, **sampling) -> Case:
    inputs = {name: np.ascontiguousarray(tree[name], np.int32) for name in (*TREE_INPUTS, "n_nodes")}
    inputs["target_logits"] = logits
    inputs.update(sampling_inputs(**sampling))
    margin, redrawn = decisive_seeds(rng, inputs, max_depth, seed_floor)
    return Case(name, description, case_seed, {"max_depth": max_depth, "min_margin": margin}, inputs, redrawn)


def _tokens_mod(tree: dict, vocab: int) -> dict:
    tree = dict(tree)
    tree["token"] = np.where(tree["token"] >= 0, tree["token"] % vocab, tree["token"]).astype(np.int32)
    return tree


def _same(groups: int, **values) -> dict:
    return {name: [value] * groups for name, value in values.items()}


def make_cases() -> list[Case]:
    rng = np.random.default_rng
    cases = []

    # temperature 0 is tree-accept's greedy walk: the same trees and logits, the same outputs
    for case in tree_accept_cases():
        if "target_logits" in case.inputs and case.name == "target_logits_f32":
            groups = case.inputs["token"].shape[0]
            inputs = dict(case.inputs)
            inputs.update(sampling_inputs([0.0] * groups, [5] * groups, [0.5] * groups, [7] * groups,
                                          seed=[2**64 - 1] * groups))
            cases.append(Case("greedy_as_tree_accept", "temperature 0: argmax (top-k, top-p ignored), the outputs "
                              "of tree-accept's case target_logits_f32", 401,
                              {"max_depth": case.params["max_depth"], "min_margin": np.inf}, inputs))

    g = rng(402)
    tree = _tokens_mod(drafted_tree(g, 3, 7, 4, 31), 1024)
    logits = language_model_logits(g, tree, 1024, lead=30.0)
    cases.append(_case(g, "near_one_hot", "the drafts 30+ above the bulk: accepted almost surely, temperature 1",
                       402, 7, tree, logits, **_same(3, temperature=1.0, top_k=0, top_p=1.0, position=100)))

    g = rng(403)
    tree = _tokens_mod(drafted_tree(g, 3, 7, 8, 31), 1024)
    logits = language_model_logits(g, tree, 1024)
    cases.append(_case(g, "temperature_only", "temperatures 0.6, 1, 2 (one per request), no top-k / top-p", 403, 7,
                       tree, logits, temperature=[0.6, 1.0, 2.0], top_k=[0] * 3, top_p=[1.0] * 3,
                       position=[5, 1000, 123456]))

    g = rng(404)
    tree = _tokens_mod(drafted_tree(g, 3, 7, 8, 31), 1024)
    logits = language_model_logits(g, tree, 1024)
    cases.append(_case(g, "top_k_only", "top-k 1, 5, 20 at temperature 0.8", 404, 7, tree, logits,
                       temperature=[0.8] * 3, top_k=[1, 5, 20], top_p=[1.0] * 3, position=[0, 17, 4096]))

    g = rng(405)
    tree = _tokens_mod(drafted_tree(g, 3, 7, 8, 31), 1024)
    logits = language_model_logits(g, tree, 1024, lead=6.0)
    cases.append(_case(g, "top_p_only", "top-p 0.5, 0.9, 0.95 at temperature 1", 405, 7, tree, logits,
                       temperature=[1.0] * 3, top_k=[0] * 3, top_p=[0.5, 0.9, 0.95], position=[3, 33, 333]))

    g = rng(406)
    tree = _tokens_mod(drafted_tree(g, 4, 7, 8, 31), 1024)
    logits = language_model_logits(g, tree, 1024, lead=6.0)
    cases.append(_case(g, "top_k_and_top_p", "top-k and top-p together (k 20 / p 0.95, k 50 / p 0.8, ...) at "
                       "temperatures 0.6-1.5", 406, 7, tree, logits, temperature=[0.6, 1.0, 1.5, 0.9],
                       top_k=[20, 50, 2, 1024], top_p=[0.95, 0.8, 0.99, 0.9], position=[1, 2, 3, 4]))

    g = rng(407)
    tree = _tokens_mod(drafted_tree(g, 1, 7, 2, 7), 163840)
    logits = to_bf16(language_model_logits(g, tree, 163840))
    cases.append(_case(g, "vocab163840_bf16", "Kimi's vocabulary, bf16 logits, temperature 0.7, top-p 0.95", 407, 7,
                       tree, logits, **_same(1, temperature=0.7, top_k=0, top_p=0.95, position=2**20)))

    g = rng(408)
    tree = _tokens_mod(drafted_tree(g, 2, 7, 4, 31), 2048)
    logits = language_model_logits(g, tree, 2048)
    allowed = np.zeros(2048, bool)
    allowed[g.choice(2048, 300, replace=False)] = True
    allowed[tree["token"][tree["token"] >= 0]] = True
    logits[:, :, ~allowed] = -np.inf
    cases.append(_case(g, "masked_vocabulary", "-inf outside 300 allowed tokens (and the drafts): never drawn", 408,
                       7, tree, logits, temperature=[1.0, 1.3], top_k=[0, 100], top_p=[1.0, 0.9], position=[9, 99]))

    g = rng(409)
    tree = _tokens_mod(drafted_tree(g, 2, 7, 8, 31), 1024)
    logits = language_model_logits(g, tree, 1024)
    cases.append(_case(g, "position_crosses_2_32", "positions 2^32 - 3 and 2^40 - 1 (the walk crosses a 32-bit "
                       "counter word), seeds >= 2^63", 409, 7, tree, logits, seed_floor=2**63,
                       **_same(2, temperature=1.0, top_k=0, top_p=1.0), position=[2**32 - 3, 2**40 - 1]))

    g = rng(410)
    tree = _tokens_mod(permuted(g, drafted_tree(g, 3, 7, 8, 31)), 1024)
    logits = language_model_logits(g, tree, 1024)
    cases.append(_case(g, "other_builder_layout", "trees from another builder (siblings in random slot order, a "
                       "token at the root)", 410, 7, tree, logits, **_same(3, temperature=0.9, top_k=40, top_p=0.9,
                                                                            position=50)))

    g = rng(411)
    tree = _tokens_mod(drafted_tree(g, 4, 15, 8, 255), 256)
    logits = language_model_logits(g, tree, 256)
    cases.append(_case(g, "mixed_requests_b255", "K=15, B=255; per request: greedy, temperature only, top-k, top-p",
                       411, 15, tree, logits, temperature=[0.0, 1.0, 0.7, 1.2], top_k=[0, 0, 10, 0],
                       top_p=[1.0, 1.0, 1.0, 0.85], position=[0, 10, 20, 30]))
    return cases


def random_case(rng: np.random.Generator) -> Case:
    """A drafted tree of random shape, language-model-like logits, random per-request sampling parameters; seeds
    redrawn until every draw is decisive, and the whole case redrawn where some request has no decisive seed (its
    logits on a knife's edge). `case.redrawn` counts the redrawn seeds and cases (kdt fuzz reports them)."""
    redrawn = 0
    while True:
        groups = int(rng.integers(1, 5))
        depth, fanout = int(rng.choice([1, 3, 7])), int(rng.choice([1, 2, 8]))
        budget = int(rng.choice([1, 7, 63]))
        vocab = int(rng.choice([17, 1000, 4096]))
        tree = _tokens_mod(drafted_tree(rng, groups, depth, fanout, budget), vocab)
        if rng.random() < 0.3:
            tree = _tokens_mod(permuted(rng, tree), vocab)
        logits = language_model_logits(rng, tree, vocab, lead=float(rng.choice([4.0, 10.0, 30.0])))
        if rng.random() < 0.5:
            logits = to_bf16(logits)
        temperature = np.where(rng.random(groups) < 0.2, 0.0, rng.uniform(0.5, 2.0, groups))
        top_k = np.where(rng.random(groups) < 0.5, 0, rng.integers(1, vocab + 1, groups))
        top_p = np.where(rng.random(groups) < 0.5, 1.0, rng.uniform(0.3, 1.0, groups))
        position = rng.integers(0, 2**62, groups)
        seed = int(rng.integers(0, 2**31))
        try:
            case = _case(rng, f"random_{seed}", f"random G={groups} K={depth} B={budget} vocab={vocab}", seed, depth,
                         tree, logits, temperature=temperature, top_k=top_k, top_p=top_p, position=position)
        except Undecided:
            redrawn += MAX_REDRAWS
            continue
        return dataclasses.replace(case, redrawn=case.redrawn + redrawn)


def check_layout(shapes, dtypes, params) -> None:
    groups, slots = check_tree_layout(shapes, dtypes)
    shape = require_layout(shapes, dtypes, "target_logits", 3, ("float32", "bfloat16"))
    require_same("target_logits", shape[:2], (groups, slots))
    if shape[2] < 1:
        raise BadInput("target_logits", "a vocabulary of at least 1", shape[2])
    for name, dtype in (("temperature", "float32"), ("top_k", "int32"), ("top_p", "float32"), ("seed", "uint64"),
                        ("position", "int64")):
        require_layout(shapes, dtypes, name, 1, (dtype,))
        require_same(name, shapes[name], (groups,))
    depth = params.get("max_depth")
    if not isinstance(depth, (int, np.integer)) or depth < 1:
        raise BadInput("max_depth", "an integer >= 1", depth)


def check_launch(shapes, dtypes, params) -> None:
    """The kernel's limits: a vocabulary below 2^31, G below 2^28 (a cluster of 8 blocks per request)."""
    groups, _ = shapes["token"]
    if shapes["target_logits"][2] >= 2**31:
        raise BadInput("target_logits", "a vocabulary below 2^31", shapes["target_logits"][2])
    if groups >= 2**28:
        raise BadInput("token", "G below 2^28 requests (a cluster of 8 blocks each)", groups)


def run_reference(inputs, params):
    """The reference's outputs; a walk with a draw on a knife's edge is refused, naming its request."""
    out = run_reference_margins(inputs, int(params["max_depth"]))
    undecided = np.flatnonzero(~out["decisive"])
    if undecided.size:
        g = int(undecided[0])
        raise BadInput(f"target_logits[{g}] / seed[{g}]", f"decisive draws (decision margin >= {reference.EPS})",
                       f"margin {out['min_margin'][g]:.3g}")
    return {name: out[name] for name in OUTPUTS}


def bench_shapes(quick: bool):
    """Issue 18's shapes: G64 N64 and G1 N16 over vocab 163840 in bf16, rows shaped like a language model's (a
    normal bulk, four tokens 10-20 above it), temperature 1 alone, with top-k 20 and top-p 0.95, top-p 0.9 alone,
    and flat rows (every token needs its noise: exact, slowest). The four leading tokens are random ids, never a
    draft's, so these walks stop at the root; `_drafts` puts the leads on each slot's children instead (14-16
    above the bulk for the first, 2 less per later sibling), so that walks accept drafts as they do in decoding.
    Bytes: one row per request, the fewest a walk reads (the root's); what a walk reads beyond it depends on the
    draws, and the every-slot path reads every row on purpose."""
    shapes = [_bench_shape("G64_N64_T1", 64, 63, 1.0, 0, 1.0),
              _bench_shape("G1_N16_T0.7_topp0.95", 1, 15, 0.7, 0, 0.95)]
    if not quick:
        shapes += [_bench_shape("G64_N64_T1_topk20_topp0.95", 64, 63, 1.0, 20, 0.95),
                   _bench_shape("G64_N64_T1_topp0.9", 64, 63, 1.0, 0, 0.9),
                   _bench_shape("G64_N64_T1_flat", 64, 63, 1.0, 0, 1.0, rows_like="flat"),
                   _bench_shape("G64_N64_T1_drafts", 64, 63, 1.0, 0, 1.0, rows_like="drafts lead"),
                   _bench_shape("G1_N16_T0.7_topp0.95_drafts", 1, 15, 0.7, 0, 0.95, rows_like="drafts lead")]
    return shapes


def tp8_bench_shapes(quick: bool):
    """`--set tp8`: the deployment's small batches (issue 17), where a step's latency is one every-slot launch:
    G in {1, 4}, N in {8, 16, 32, 64}, temperature 0.7 with top-p 0.95, the drafts leading (walks accept drafts
    as in decoding). Bytes as in the default set: one row per request."""
    sizes = ((1, 16), (4, 16)) if quick else ((1, 8), (1, 16), (1, 32), (1, 64), (4, 8), (4, 16))
    return [_bench_shape(f"G{groups}_N{slots}_T0.7_topp0.95_drafts", groups, slots - 1, 0.7, 0, 0.95,
                         rows_like="drafts lead") for groups, slots in sizes]


def _bench_shape(name, groups, budget, temperature, top_k, top_p, rows_like="random leads"):
    """One bench shape over vocab 163840 in bf16 (bench_shapes says what `rows_like` makes)."""
    from kdt.bench import BenchShape, device_bf16, upload_host

    vocab, slots = 163840, budget + 1

    def make(cp):
        tree = _tokens_mod(drafted_tree(np.random.default_rng(budget), groups, 15, 8, budget), vocab)
        host = {key: np.ascontiguousarray(tree[key], np.int32) for key in (*TREE_INPUTS, "n_nodes")}
        host.update(sampling_inputs([temperature] * groups, [top_k] * groups, [top_p] * groups,
                                    list(range(groups)), seed=[12345] * groups))
        device = upload_host(cp, host)
        rng = cp.random.default_rng(7)
        logits = (cp.zeros((groups, slots, vocab), cp.float32) if rows_like == "flat"
                  else rng.standard_normal((groups, slots, vocab), dtype=cp.float32))
        flat_rows = logits.reshape(groups * slots, vocab)
        if rows_like == "random leads":
            rows = cp.arange(groups * slots)[:, None]
            lead = rng.integers(0, vocab, (groups * slots, 4))
            flat_rows[rows, lead] += 10 + 10 * rng.random((groups * slots, 4), dtype=cp.float32)
        elif rows_like == "drafts lead":
            row, token, lead = _draft_leads(tree, np.random.default_rng(budget + 1), vocab)
            flat_rows[cp.asarray(row), cp.asarray(token)] += cp.asarray(lead)
        device["target_logits"] = device_bf16(cp, logits)
        return device

    layout = {**{key: ((groups, slots), "int32") for key in TREE_INPUTS}, "n_nodes": ((groups,), "int32"),
              "target_logits": ((groups, slots, vocab), "bfloat16"), "temperature": ((groups,), "float32"),
              "top_k": ((groups,), "int32"), "top_p": ((groups,), "float32"), "seed": ((groups,), "uint64"),
              "position": ((groups,), "int64")}
    return BenchShape(name, make, {"max_depth": 15}, layout, groups * vocab * 2, cpu_baseline=False)


def _draft_leads(tree: dict, rng: np.random.Generator, vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat row g * N + slot, token, lead): for every child of every slot, the child's token 14-16 above the bulk
    in its parent's row, 2 less per later sibling (language_model_logits' leads, for rows made on the GPU); a row
    without children (a leaf, an unused slot) leads with one random token, 14-16 above, as a language model's row
    does: a bulk-only row would make its top-p set most of the vocabulary, a row no model gives."""
    groups, slots = tree["token"].shape
    row, token, lead = [], [], []
    for g in range(groups):
        for s in range(slots):
            child, rank = int(tree["first_child"][g, s]), 0
            if not 0 <= child < slots:
                row.append(g * slots + s)
                token.append(int(rng.integers(vocab)))
                lead.append(14.0 + 2.0 * rng.random())
            while 0 <= child < slots:
                row.append(g * slots + s)
                token.append(int(tree["token"][g, child]))
                lead.append(14.0 - 2.0 * rank + 2.0 * rng.random())
                child, rank = int(tree["next_sibling"][g, child]), rank + 1
    return np.array(row, np.int64), np.array(token, np.int64), np.array(lead, np.float32)


def torch_baseline(inputs, params):
    """The obvious PyTorch version, at every slot (as an engine would before a walk): z = logits / T, top-k and
    top-p masks (a sort for top-p), softmax, torch.multinomial. Request 0's parameters stand for all (the bench
    shapes give every request the same)."""
    import torch

    logits = torch.from_dlpack(inputs["target_logits"].bits.view("int16")).view(torch.bfloat16)
    temperature = float(inputs["temperature"][0].get())
    top_k, top_p = int(inputs["top_k"][0].get()), float(inputs["top_p"][0].get())

    def run():
        z = logits.float().flatten(0, 1) / temperature
        if top_k:
            threshold = z.topk(top_k, dim=-1).values[:, -1:]
            z = z.masked_fill(z < threshold, float("-inf"))
        if top_p < 1:
            ordered, order = z.sort(dim=-1, descending=True)
            before = ordered.softmax(dim=-1).cumsum(dim=-1) - ordered.softmax(dim=-1)
            ordered = ordered.masked_fill(before >= top_p, float("-inf"))
            z = torch.empty_like(z).scatter_(-1, order, ordered)
        return torch.multinomial(z.softmax(dim=-1), 1)

    return run


SPEC = StageSpec(
    name="tree-sample",
    position=5,
    params=("max_depth",),                     # and min_margin, recorded with each golden case
    inputs=(*TREE_INPUTS, "n_nodes", "target_logits", *SAMPLING_INPUTS),
    outputs={name: Exact() for name in OUTPUTS},
    reference_module=reference,
    run_reference=run_reference,
    make_cases=make_cases,
    output_layout=output_layout,
    check_layout=check_layout,
    description="sampled acceptance (temperature, top-k, top-p), token for token equal to plain sampling",
    random_case=random_case,
    check_launch=check_launch,
    bench_shapes=bench_shapes,
    torch_baseline=torch_baseline,
    bench_sets={"tp8": tp8_bench_shapes},
)
