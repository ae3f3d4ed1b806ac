"""`tree-accept`: spec, golden cases and launch-time layout checks."""

from __future__ import annotations

import numpy as np

import kdt.refs.tree_accept as reference
from kdt.compare import Exact
from kdt.dtypes import to_bf16
from kdt.spec import Case, OutputLayout, StageSpec
from kdt.stages._util import require_layout, require_same
from kdt.stages.tree_build import drafter_topk
from kdt.refs.errors import BadInput
from kdt.refs.tree_build import tree_build

TREE_INPUTS = ("token", "first_child", "next_sibling")
TARGET_VOCAB = 50000
OUTPUTS = ("accept_len", "accept_index", "accept_tokens")  # the contract's, tree-sample's too
LOGITS_ELEMENTS = 1 << 22  # random logits cases stay small enough for the CPU reference


def drafted_tree(rng: np.random.Generator, groups: int, depth: int, fanout: int, budget: int) -> dict:
    lp, ids = drafter_topk(rng, groups, depth, fanout)
    return tree_build(lp, ids, budget)


def path_to(tree: dict, g: int, slot: int) -> list[int]:
    path = [slot]
    while path[-1] != 0:
        path.append(int(tree["parent"][g, path[-1]]))
    return path[::-1]


def target_following(rng: np.random.Generator, tree: dict, targets: list[int]) -> np.ndarray:
    """Predictions that agree with the draft along the path to targets[g] (0: nowhere) and are random
    elsewhere, so request g accepts exactly that path."""
    groups, slots = tree["token"].shape
    predict = rng.integers(0, TARGET_VOCAB, (groups, slots)).astype(np.int32)
    for g, slot in enumerate(targets):
        path = path_to(tree, g, slot)
        for here, nxt in zip(path, path[1:]):
            predict[g, here] = tree["token"][g, nxt]
        # the bonus must not continue the draft, or the walk would go one step further
        children = set(int(t) for t, p in zip(tree["token"][g], tree["parent"][g]) if p == path[-1])
        while int(predict[g, path[-1]]) in children:
            predict[g, path[-1]] += 1
    return predict


def deepest_slot(tree: dict, g: int) -> int:
    live = int(tree["n_nodes"][g]) + 1
    return int(np.argmax(tree["depth"][g, :live]))


def _case(name, description, seed, max_depth, tree, **target) -> Case:
    inputs = {name: np.ascontiguousarray(tree[name], np.int32) for name in TREE_INPUTS}
    inputs["n_nodes"] = np.ascontiguousarray(tree["n_nodes"], np.int32)
    inputs.update(target)
    return Case(name, description, seed, {"max_depth": max_depth}, inputs)


def permuted(rng: np.random.Generator, tree: dict) -> dict:
    """The same tree with its non-root slots renumbered at random (siblings no longer in slot order),
    as another builder (EAGLE, SGLang) might lay it out, and a real token at the root."""
    groups, slots = tree["token"].shape
    out = {name: tree[name].copy() for name in (*TREE_INPUTS, "n_nodes", "parent", "depth")}
    for g in range(groups):
        live = int(tree["n_nodes"][g]) + 1
        new_of = np.arange(slots)
        new_of[1:live] = 1 + rng.permutation(live - 1)
        remap = np.vectorize(lambda s: -1 if s < 0 else int(new_of[s]))
        for name in ("token", "depth"):
            out[name][g, new_of[:live]] = tree[name][g, :live]
        for name in ("first_child", "next_sibling", "parent"):
            out[name][g, new_of[:live]] = remap(tree[name][g, :live])
        out["token"][g, 0] = rng.integers(0, TARGET_VOCAB)
    return out


def make_cases() -> list[Case]:
    rng = np.random.default_rng
    cases = []

    g = rng(301)
    tree = drafted_tree(g, 6, 7, 8, 63)
    targets = [0, 1, deepest_slot(tree, 2), 5, 17, int(tree["first_child"][3, 1]) if tree["first_child"][3, 1] > 0 else 2]
    cases.append(_case("drafter_b63_predict", "K=7, V=8, B=63 trees; accepted paths of every length, from target_predict",
                       301, 7, tree, target_predict=target_following(g, tree, targets)))

    g = rng(302)
    tree = drafted_tree(g, 3, 7, 8, 7)
    tree["first_child"][0, 0] = -1  # request 0: the root has no children
    cases.append(_case("root_without_children", "a root with no children: accept 0, bonus = prediction at the root",
                       302, 7, tree, target_predict=target_following(g, tree, [0, 2, 3])))

    g = rng(303)
    lp, ids = drafter_topk(g, 2, 5, 2)
    lp[:, :, 0] = np.float32(-1e-3)
    tree = tree_build(lp, ids, 20)
    chain_end = [int(np.flatnonzero(tree["depth"][h] == 5)[0]) for h in range(2)]
    cases.append(_case("full_depth_accept", "the whole draft depth K=5 accepted, plus the bonus",
                       303, 5, tree, target_predict=target_following(g, tree, chain_end)))

    g = rng(304)
    tree = drafted_tree(g, 2, 3, 4, 12)
    predict = target_following(g, tree, [0, 0])
    for h in range(2):
        # Relink the root's list as second -> first -> rest: the larger slot now comes first in sibling
        # order, and both carry the predicted token.
        first = int(tree["first_child"][h, 0])
        second = int(tree["next_sibling"][h, first])
        rest = int(tree["next_sibling"][h, second])
        tree["first_child"][h, 0], tree["next_sibling"][h, second], tree["next_sibling"][h, first] = second, first, rest
        tree["token"][h, second] = tree["token"][h, first] = predict[h, 0] = 777
    cases.append(_case("sibling_order_decides", "two children carry the predicted token: the first in sibling order "
                       "wins, though it has the larger slot", 304, 3, tree, target_predict=predict))

    g = rng(305)
    tree = drafted_tree(g, 4, 7, 8, 31)
    predict = target_following(g, tree, [deepest_slot(tree, h) for h in range(4)])
    other = permuted(g, tree)
    remapped = np.zeros_like(predict)
    for h in range(4):  # carry each slot's prediction to its new number
        live = int(tree["n_nodes"][h]) + 1
        for old in range(live):
            path = path_to(tree, h, old)
            new = 0
            for step in path[1:]:
                child = int(other["first_child"][h, new])
                while other["token"][h, child] != tree["token"][h, step] or other["depth"][h, child] != tree["depth"][h, step]:
                    child = int(other["next_sibling"][h, child])
                new = child
            remapped[h, new] = predict[h, old]
    cases.append(_case("other_builder_layout", "trees from another builder: siblings in random slot order, a token at the root",
                       305, 7, other, target_predict=remapped))

    g = rng(306)
    tree = drafted_tree(g, 3, 15, 8, 63)
    predict = target_following(g, tree, [deepest_slot(tree, 0), 3, 0])
    logits = np.round(g.standard_normal((3, 64, 1000)) * 2).astype(np.float32) / 2
    for h in range(3):
        for s in range(64):
            top = logits[h, s].max()
            want = int(predict[h, s]) % 1000
            logits[h, s, want] = top + 0.5
            logits[h, s, min(want + 1 + s % 5, 999)] = top + 0.5  # an equal logit at a larger id loses
    tree["token"] = np.where(tree["token"] >= 0, tree["token"] % 1000, tree["token"]).astype(np.int32)
    cases.append(_case("target_logits_f32", "argmax over float32 target logits (ties: smaller id) fused into the walk",
                       306, 15, tree, target_logits=logits))
    cases.append(_case("target_logits_bf16", "the same from bf16 logits", 307, 15, tree, target_logits=to_bf16(logits)))

    g = rng(308)
    tree = drafted_tree(g, 2, 1, 8, 8)
    cases.append(_case("k1", "max_depth K=1: at most one node accepted", 308, 1, tree,
                       target_predict=target_following(g, tree, [3, 0])))

    g = rng(309)
    lp, ids = drafter_topk(g, 1, 10, 1)
    tree = tree_build(lp, ids, 10)
    cases.append(_case("max_depth_caps_walk", "a 10-deep chain that matches all the way, walked with max_depth 4",
                       309, 4, tree, target_predict=target_following(g, tree, [10])))

    g = rng(310)
    tree = drafted_tree(g, 64, 15, 8, 255)
    targets = [int(g.integers(0, int(tree["n_nodes"][h]) + 1)) for h in range(64)]
    cases.append(_case("batch_g64_b255", "G=64, K=15, V=8, B=255: random accepted paths", 310, 15, tree,
                       target_predict=target_following(g, tree, targets)))
    return cases


def random_case(rng: np.random.Generator) -> Case:
    """A drafted tree of random shape, predictions following a random path, from predictions or logits;
    now and then relaid out as another builder would."""
    groups = int(rng.integers(1, 9))
    depth, fanout = int(rng.choice([1, 3, 7, 15])), int(rng.choice([1, 2, 8, 32]))
    budget = int(rng.choice([1, 7, 63, 255, 1023]))
    tree = drafted_tree(rng, groups, depth, fanout, budget)
    targets = [int(rng.integers(0, int(tree["n_nodes"][h]) + 1)) for h in range(groups)]
    predict = target_following(rng, tree, targets)
    seed = int(rng.integers(0, 2**31))
    if rng.random() < 0.5:
        return _case(f"random_{seed}", f"random G={groups} K={depth} B={budget} predictions", seed, depth, tree,
                     target_predict=predict)
    slots = tree["token"].shape[1]
    vocab = int(max(1, min(rng.choice([TARGET_VOCAB, 1001, 65537]), LOGITS_ELEMENTS // (groups * slots))))
    tree["token"] = np.where(tree["token"] >= 0, tree["token"] % vocab, tree["token"]).astype(np.int32)
    predict %= vocab
    logits = rng.standard_normal((groups, slots, vocab), dtype=np.float32)
    np.put_along_axis(logits, predict[:, :, None].astype(np.int64), np.float32(8.0), axis=2)
    if rng.random() < 0.5:
        logits = to_bf16(logits)
    return _case(f"random_{seed}", f"random G={groups} K={depth} B={budget} vocab={vocab} logits", seed, depth,
                 tree, target_logits=logits)


def shrink_case(case: Case):
    """Smaller variants of a failing case, for `kdt fuzz`: one request, a smaller max_depth."""
    from kdt.fuzz import batch_variants, smaller_sizes, with_inputs

    yield from batch_variants(case)
    for depth in smaller_sizes(int(case.params["max_depth"])):
        yield with_inputs(case, {"max_depth": depth})


def output_layout(shapes, params) -> dict[str, OutputLayout]:
    groups = shapes["token"][0]
    width = int(params["max_depth"]) + 1
    return {"accept_len": OutputLayout((groups,), "int32"),
            "accept_index": OutputLayout((groups, width), "int32"),
            "accept_tokens": OutputLayout((groups, width), "int32")}


def check_tree_layout(shapes, dtypes) -> tuple[int, int]:
    """The tree inputs (token, first_child, next_sibling int32 [G, N], n_nodes int32 [G]); returns (G, N)."""
    groups, slots = require_layout(shapes, dtypes, "token", 2, ("int32",))
    for name in ("first_child", "next_sibling"):
        require_layout(shapes, dtypes, name, 2, ("int32",))
        require_same(name, shapes[name], (groups, slots))
    require_layout(shapes, dtypes, "n_nodes", 1, ("int32",))
    require_same("n_nodes", shapes["n_nodes"], (groups,))
    return groups, slots


def check_layout(shapes, dtypes, params) -> None:
    groups, slots = check_tree_layout(shapes, dtypes)
    given = [name for name in ("target_predict", "target_logits") if name in shapes]
    if len(given) != 1:
        raise BadInput("target_predict/target_logits", "exactly one of the two", given or "neither")
    if given == ["target_predict"]:
        require_layout(shapes, dtypes, "target_predict", 2, ("int32",))
        require_same("target_predict", shapes["target_predict"], (groups, slots))
    else:
        shape = require_layout(shapes, dtypes, "target_logits", 3, ("float32", "bfloat16"))
        require_same("target_logits", shape[:2], (groups, slots))
        if shape[2] < 1:
            raise BadInput("target_logits", "a vocabulary of at least 1", shape[2])
    depth = params.get("max_depth")
    if not isinstance(depth, (int, np.integer)) or depth < 1:
        raise BadInput("max_depth", "an integer >= 1", depth)


MAX_SLOTS = 1024          # the kernel stages a request's rows in static shared memory
MAX_BLOCKS = 2**31 - 1    # the fused argmax launches one block per row (and vocabulary split)


def check_launch(shapes, dtypes, params) -> None:
    """The kernel's limits: at most 1024 slots per request, fewer than 2^31 rows and vocabulary entries."""
    groups, slots = shapes["token"]
    if slots > MAX_SLOTS:
        raise BadInput("token", f"N <= {MAX_SLOTS} slots (the kernel's shared-memory staging)", slots)
    if int(params["max_depth"]) >= 2**31 - 1:
        raise BadInput("max_depth", "an integer below 2^31 - 1", params["max_depth"])
    if "target_logits" in shapes:
        if groups * slots > MAX_BLOCKS:
            raise BadInput("target_logits", f"G * N <= {MAX_BLOCKS} rows", groups * slots)
        if shapes["target_logits"][2] >= 2**31:
            raise BadInput("target_logits", "a vocabulary below 2^31", shapes["target_logits"][2])


def run_reference(inputs, params):
    return reference.tree_accept(inputs["token"], inputs["first_child"], inputs["next_sibling"], inputs["n_nodes"],
                                 params["max_depth"], target_predict=inputs.get("target_predict"),
                                 target_logits=inputs.get("target_logits"))


def bench_shapes(quick: bool):
    from kdt.bench import BenchShape, device_bf16, upload_host

    def tree_inputs(groups, budget, seed):
        g = np.random.default_rng(seed)
        tree = drafted_tree(g, groups, 15, 8, budget)
        targets = [int(g.integers(0, int(tree["n_nodes"][h]) + 1)) for h in range(groups)]
        host = {name: tree[name] for name in (*TREE_INPUTS, "n_nodes")}
        return host, target_following(g, tree, targets)

    def tree_layout(groups, budget):
        return {**{name: ((groups, budget + 1), "int32") for name in TREE_INPUTS}, "n_nodes": ((groups,), "int32")}

    def predict_shape(groups, budget):
        def make(cp):
            host, predict = tree_inputs(groups, budget, 1)
            return upload_host(cp, {**host, "target_predict": predict})

        moved = groups * (budget + 1) * 4 * 4 + groups * 4 * (1 + 2 * 16)
        layout = {**tree_layout(groups, budget), "target_predict": ((groups, budget + 1), "int32")}
        return BenchShape(f"predict_G{groups}_N{budget + 1}", make, {"max_depth": 15}, layout, moved)

    def logits_shape(groups, budget, vocab, dtype):
        itemsize = 2 if dtype == "bf16" else 4

        def make(cp):
            host, _ = tree_inputs(groups, budget, 2)
            logits = cp.random.default_rng(3).standard_normal((groups, budget + 1, vocab), dtype=cp.float32)
            device = upload_host(cp, host)
            device["target_logits"] = device_bf16(cp, logits) if dtype == "bf16" else logits
            return device

        layout = {**tree_layout(groups, budget),
                  "target_logits": ((groups, budget + 1, vocab), "bfloat16" if dtype == "bf16" else "float32")}
        return BenchShape(f"logits_G{groups}_N{budget + 1}_vocab{vocab}_{dtype}", make, {"max_depth": 15}, layout,
                          groups * (budget + 1) * (vocab * itemsize + 12), cpu_baseline=False)

    shapes = [predict_shape(256, 255), logits_shape(64, 63, 163840, "bf16")]
    if not quick:
        shapes += [predict_shape(64, 63), predict_shape(1, 15), logits_shape(64, 63, 163840, "f32"),
                   logits_shape(8, 63, 32000, "bf16")]
    return shapes


def torch_baseline(inputs, params):
    """PyTorch has no tree walk; its obvious part is the argmax over the logits (what the fused entry adds)."""
    if "target_logits" not in inputs:
        return None
    import torch

    from kdt import ops

    logits = inputs["target_logits"]
    tensor = (torch.from_dlpack(logits.bits.view("int16")).view(torch.bfloat16) if isinstance(logits, ops.Bf16)
              else torch.from_dlpack(logits))
    return lambda: tensor.argmax(dim=-1)


SPEC = StageSpec(
    name="tree-accept",
    position=3,
    params=("max_depth",),
    inputs=(*TREE_INPUTS, "n_nodes", "target_predict", "target_logits"),
    outputs={name: Exact() for name in OUTPUTS},
    reference_module=reference,
    run_reference=run_reference,
    make_cases=make_cases,
    output_layout=output_layout,
    check_layout=check_layout,
    description="greedy acceptance of the longest matching path, plus the bonus token",
    random_case=random_case,
    shrink=shrink_case,
    bench_shapes=bench_shapes,
    torch_baseline=torch_baseline,
    check_launch=check_launch,
)
