"""`kdt.ops`: launch a stage's kernel on arrays that are already on the GPU.

Anything with `__cuda_array_interface__` or DLPack (CuPy, PyTorch, ...) goes in without a copy; CuPy arrays come
out. bf16 travels as uint16 bits: pass a PyTorch bfloat16 tensor, or wrap a CuPy uint16 array in `kdt.ops.Bf16`;
bf16 outputs come back as `Bf16`. Shapes, dtypes, device, contiguity and the contract's limits are checked before
any launch, by the stage's spec (values are not: a NaN reaches the kernel unseen; the references check values).

Every function takes keyword-only `out=` (preallocated outputs: a mapping by name, or the result type itself),
`workspace=` (see `workspace_for`), `stream=` (default: CuPy's current stream) and `knobs=` (launch choices by
name, see `kdt plan STAGE` and `kdt/launch/<stage>.py`; they change speed, never results).

Host time: an eager call checks its arrays and launches from Python, ~17-100 us a call on the H200 machine's host
(topk 17, tree-sample ~35-55, verify-attn ~65-100; plans/roadmap.md); a CUDA graph replay spends none of it.

CUDA graphs: with `out=` and `workspace=` a launch allocates nothing; it never synchronises or reads device memory
on the host, so it can be captured. The first call of a stage builds or loads its module: make it once before
capturing. Kernels that use a workspace must not run concurrently on two streams with the same workspace. Captured,
a plan that measured faster so launches by programmatic dependent launch (the knob `overlap_previous`, auto): its
blocks start while the launch before it ends and wait for it before touching memory.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import numpy as np

from kdt import runtime, stages
from kdt.launch.common import run_plan
from kdt.launch.plan import ArraySpec, LaunchPlan, Target, address_alignment, make_knobs
from kdt.spec import OutputLayout, StageSpec
from kdt.refs.errors import BadInput


@dataclass(frozen=True)
class Bf16:
    """A CuPy uint16 array that holds bfloat16 bits (CuPy has no bfloat16 dtype)."""

    bits: Any

    @property
    def shape(self):
        return self.bits.shape


class TopK(NamedTuple):
    """`topk` outputs, [G, K, V]: the ids of the V largest logits of each row (descending; equal logits: smaller id
    first) and their log-probabilities (logit - logsumexp(row))."""

    top_ids: Any    # int32
    top_logp: Any   # float32


class Tree(NamedTuple):
    """`tree-build` outputs for N = B + 1 slots (slot 0 the root): per request the number of nodes taken, and per
    slot its parent, depth, token, rank, path score, first child and next sibling (-1 where none), and its
    ancestor mask (bit j of row i set iff j is i or an ancestor of i)."""

    n_nodes: Any        # int32 [G]
    parent: Any         # int32 [G, N]
    depth: Any          # int32 [G, N]
    token: Any          # int32 [G, N]
    rank: Any           # int32 [G, N]
    logw: Any           # float32 [G, N]
    first_child: Any    # int32 [G, N]
    next_sibling: Any   # int32 [G, N]
    mask: Any           # uint32 [G, N, ceil(N / 32)]


class Acceptance(NamedTuple):
    """`tree-accept` outputs: accepted draft nodes per request (0..K), the accepted slots (slot 0 first, then -1),
    and the accepted tokens followed by the bonus token (then -1)."""

    accept_len: Any     # int32 [G]
    accept_index: Any   # int32 [G, K + 1]
    accept_tokens: Any  # int32 [G, K + 1]


class Attention(NamedTuple):
    """`verify-attn` outputs: softmax(scores) @ values per (request, slot, head), and the natural-log logsumexp of
    the scaled scores (-inf and 0 for slots past n_nodes)."""

    out: Any    # float32 or Bf16 [G, N, H, Dv]
    lse: Any    # float32 [G, N, H]


@functools.lru_cache(maxsize=64)
def _dtype_name(dtype) -> str:
    return np.dtype(dtype).name


def _device_array(value, name: str):
    """(CuPy array, contract dtype name) for one input, without copying."""
    cp = runtime.cupy()
    if isinstance(value, Bf16):
        array = value.bits
        if not isinstance(array, cp.ndarray) or array.dtype != cp.uint16:
            raise BadInput(name, "Bf16 wrapping a CuPy uint16 array", type(array).__name__)
        return array, "bfloat16"
    if isinstance(value, cp.ndarray):
        return value, _dtype_name(value.dtype)
    module = type(value).__module__.split(".")[0]
    if module == "torch":
        import torch

        if not value.is_cuda:
            raise BadInput(name, "a CUDA tensor", f"a tensor on {value.device}")
        if value.dtype == torch.bfloat16:
            return cp.from_dlpack(value.view(torch.int16)).view(cp.uint16), "bfloat16"
        return cp.from_dlpack(value), np.dtype(cp.from_dlpack(value).dtype).name
    if hasattr(value, "__cuda_array_interface__"):
        array = cp.asarray(value)
        return array, np.dtype(array.dtype).name
    if hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
        array = cp.from_dlpack(value)
        return array, np.dtype(array.dtype).name
    raise BadInput(name, "a GPU array (CuPy, PyTorch, __cuda_array_interface__ or DLPack)",
                   f"{type(value).__module__}.{type(value).__name__}" + (" on the host" if isinstance(value, np.ndarray) else ""))


def _np_dtype(layout_dtype: str):
    return np.uint16 if layout_dtype == "bfloat16" else np.dtype(layout_dtype)


def _check_placement(name: str, array, device_id: int) -> None:
    # array.data.device_id is array.device.id without building a Device object
    if array.data.device_id != device_id:
        raise BadInput(name, f"an array on GPU {device_id} (the current device)", f"GPU {array.data.device_id}")
    if not array.flags.c_contiguous:
        raise BadInput(name, "a C-contiguous array", f"strides {array.strides}")


def _stage(stage: str | StageSpec) -> StageSpec:
    return stage if isinstance(stage, StageSpec) else stages.get(stage)


# A layout: [(name, shape, dtype name, alignment)], one per input, in the order given: what its ArraySpec holds, as
# a plain tuple (cheap to build, hash and compare, where a dataclass's __hash__ and __eq__ run Python code per input).
_Layout = list[tuple[str, tuple[int, ...], str, int]]


def _array_specs(layout: _Layout) -> dict[str, ArraySpec]:
    return {name: ArraySpec(shape, dtype, alignment) for name, shape, dtype, alignment in layout}


def _checked_plan(spec: StageSpec, inputs: Mapping[str, ArraySpec], params: Mapping[str, Any], target: Target,
                  knobs: Mapping[str, Any] | None) -> LaunchPlan:
    shapes, dtypes = {n: s.shape for n, s in inputs.items()}, {n: s.dtype for n, s in inputs.items()}
    spec.check_layout(shapes, dtypes, dict(params))
    if spec.check_launch is not None:
        spec.check_launch(shapes, dtypes, dict(params))
    launcher = runtime.launcher(spec)
    made = make_knobs(launcher.Knobs, knobs)
    plan = launcher.plan(dict(inputs), dict(params), target, made)
    return plan if made.overlap_previous is None else plan.with_first_overlap(made.overlap_previous)


@functools.lru_cache(maxsize=4096)
def _cached_plan(stage: str, layout: tuple, params: tuple, target: Target, knobs: tuple) -> LaunchPlan:
    # only checks that passed are cached (a BadInput propagates): the same key passes again
    return _checked_plan(stages.get(stage), _array_specs(layout), dict(params), target, dict(knobs))


class _Key(NamedTuple):
    """What a call's plan and outputs depend on besides the stage and the target, sorted by name."""

    layout: tuple
    params: tuple
    knobs: tuple


def _key(layout: _Layout, params: Mapping[str, Any], knobs: Mapping[str, Any] | None) -> _Key | None:
    """The cache key of a call; None where a value cannot be hashed (a list, an array): then nothing is cached."""
    try:
        key = _Key(tuple(sorted(layout)), tuple(sorted(params.items())), tuple(sorted(knobs.items())) if knobs else ())
        hash(key)
    except TypeError:
        return None
    return key


def _plan(spec: StageSpec, layout: _Layout, params: Mapping[str, Any], target: Target,
          knobs: Mapping[str, Any] | None) -> tuple[LaunchPlan, _Key | None]:
    """plan_for on a layout: (the plan, the call's cache key)."""
    if knobs is not None and not isinstance(knobs, Mapping):
        raise BadInput("knobs", "a mapping of knob names to values (kdt plan STAGE lists them)", type(knobs).__name__)
    key = _key(layout, params, knobs)
    if key is None:
        return _checked_plan(spec, _array_specs(layout), params, target, knobs), None
    return _cached_plan(spec.name, key.layout, key.params, target, key.knobs), key


def plan_for(stage: str | StageSpec, inputs: Mapping[str, ArraySpec], params: Mapping[str, Any], target: Target,
             knobs: Mapping[str, Any] | None = None) -> LaunchPlan:
    """The launch plan for inputs described by ArraySpecs, for `target` (no GPU needed). The layout and the
    parameters are checked against the contract first (BadInput); a layout, parameters and knobs seen before
    reuse that check and plan (an eager call's host time)."""
    spec = _stage(stage)
    layout = [(name, s.shape, s.dtype, s.alignment) for name, s in inputs.items()]
    return _plan(spec, layout, params, target, knobs)[0]


@functools.lru_cache(maxsize=4096)
def _cached_output_layout(stage: str, layout: tuple, params: tuple) -> dict[str, OutputLayout]:
    # made once per key (it depends on the layout's shapes and the params alone); callers only read it
    return stages.get(stage).output_layout({name: shape for name, shape, _, _ in layout}, dict(params))


def _output_layout(spec: StageSpec, layout: _Layout, params: Mapping[str, Any],
                   key: _Key | None) -> dict[str, OutputLayout]:
    """The stage's outputs for a checked layout."""
    if key is None:
        return spec.output_layout({name: shape for name, shape, _, _ in layout}, dict(params))
    return _cached_output_layout(spec.name, key.layout, key.params)


def _prepare(spec: StageSpec, inputs: Mapping[str, Any], params: Mapping[str, Any], knobs, device_id: int):
    """(CuPy arrays by name, their layout, the launch plan, the call's cache key) for one call on `device_id`, the
    current device."""
    arrays, layout = {}, []
    for name, value in inputs.items():
        if value is None:
            continue
        if name not in spec.inputs:
            raise BadInput(name, f"one of the {spec.name} inputs {', '.join(spec.inputs)}", "an unknown input")
        array, dtype = _device_array(value, name)
        _check_placement(name, array, device_id)
        arrays[name] = array
        layout.append((name, array.shape, dtype, address_alignment(array.data.ptr)))
    launch_plan, key = _plan(spec, layout, params, runtime.target(spec.name), knobs)
    return arrays, layout, launch_plan, key


def plan(stage: str | StageSpec, inputs: Mapping[str, Any], params: Mapping[str, Any], *,
         knobs: Mapping[str, Any] | None = None) -> LaunchPlan:
    """The launch plan `run` would launch for these arrays on the current GPU (print it, or assert on it)."""
    return _prepare(_stage(stage), inputs, params, knobs, runtime.cupy().cuda.get_device_id())[2]


_workspaces: dict[tuple, Any] = {}


def workspace_for(stage: str | StageSpec, inputs: Mapping[str, Any], params: Mapping[str, Any], *,
                  knobs: Mapping[str, Any] | None = None) -> Any:
    """The scratch memory `run` needs for these inputs (None if none): zero-filled once, then shared by every call
    that needs as many bytes. The counters kernels keep there (tree-sample's) are zero again after each launch; a
    workspace of your own must start zero-filled as well."""
    spec = _stage(stage)
    nbytes = _prepare(spec, inputs, params, knobs, runtime.cupy().cuda.get_device_id())[2].workspace_bytes
    return _workspace(spec, nbytes)


def _workspace(spec: StageSpec, nbytes: int):
    if nbytes == 0:
        return None
    cp = runtime.cupy()
    key = (spec.name, cp.cuda.get_device_id(), nbytes)
    if key not in _workspaces:
        _workspaces[key] = cp.zeros(nbytes, cp.uint8)
    return _workspaces[key]


def run(stage: str | StageSpec, inputs: Mapping[str, Any], params: Mapping[str, Any], *,
        out: Mapping[str, Any] | None = None, workspace: Any = None, stream: Any = None,
        knobs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Launch `stage` once on `inputs` (by contract name) with its scalar `params`. Returns the outputs by name:
    those of `out` where given, else new CuPy arrays (bf16 as `Bf16`)."""
    spec = _stage(stage)
    cp = runtime.cupy()
    device_id = cp.cuda.get_device_id()
    arrays, layout, launch_plan, key = _prepare(spec, inputs, params, knobs, device_id)
    outputs_layout = _output_layout(spec, layout, params, key)
    if out is not None and hasattr(out, "_asdict"):
        out = out._asdict()
    outputs = {}
    for name, want in outputs_layout.items():
        if out is not None and name in out:
            argument = f"out[{name!r}]"
            array, dtype = _device_array(out[name], argument)
            if tuple(array.shape) != want.shape or dtype != want.dtype:
                raise BadInput(argument, f"{want.dtype} {want.shape}", f"{dtype} {tuple(array.shape)}")
            _check_placement(argument, array, device_id)
            outputs[name] = array
        else:
            outputs[name] = cp.empty(want.shape, _np_dtype(want.dtype))
    if launch_plan.workspace_bytes:
        if workspace is None:
            workspace = _workspace(spec, launch_plan.workspace_bytes)
        else:
            workspace, _ = _device_array(workspace, "workspace")
            if workspace.nbytes < launch_plan.workspace_bytes or workspace.data.ptr % 256:
                raise BadInput("workspace", f"at least {launch_plan.workspace_bytes} bytes, 256-byte aligned "
                                            "(kdt.ops.workspace_for)", f"{workspace.nbytes} bytes")
            workspace = workspace.reshape(-1).view(cp.uint8)
    module = runtime.load(spec.name)
    run_plan(module, launch_plan, {**arrays, **outputs}, workspace,
             stream if stream is not None else cp.cuda.get_current_stream())
    return {name: Bf16(array) if outputs_layout[name].dtype == "bfloat16" else array
            for name, array in outputs.items()}


def topk(logits, k: int, *, out=None, workspace=None, stream=None, knobs=None) -> TopK:
    """Top-k log-probabilities of drafter logits.

    Parameters
    ----------
    logits : float32 or bf16 [G, K, vocab]
        One row per (request, draft position); -inf (masked vocabulary) is legal, NaN is not.
    k : int
        V, the candidates kept per row: 1 <= k <= min(vocab, 1024).
    out, workspace, stream, knobs
        Keyword-only; see the module docstring.

    Returns
    -------
    TopK(top_ids int32 [G, K, k], top_logp float32 [G, K, k])
    """
    return TopK(**run("topk", {"logits": logits}, {"k": k}, out=out, workspace=workspace, stream=stream, knobs=knobs))


def tree_build(top_logp, top_ids, budget: int, *, out=None, workspace=None, stream=None, knobs=None) -> Tree:
    """The best-first draft tree of each request.

    Parameters
    ----------
    top_logp : float32 [G, K, V]
        Each row non-increasing (-inf legal); what `topk` returns.
    top_ids : int32 [G, K, V]
    budget : int
        B, nodes per tree besides the root: 1 <= B <= 1023 (V = B works).
    out, workspace, stream, knobs
        Keyword-only; see the module docstring.

    Returns
    -------
    Tree (N = budget + 1 slots): n_nodes [G]; parent, depth, token, rank, first_child, next_sibling int32 and logw
    float32 [G, N]; mask uint32 [G, N, ceil(N / 32)].
    """
    return Tree(**run("tree-build", {"top_logp": top_logp, "top_ids": top_ids}, {"budget": budget},
                     out=out, workspace=workspace, stream=stream, knobs=knobs))


def tree_accept(token, first_child, next_sibling, n_nodes, max_depth: int, *, target_predict=None,
                target_logits=None, out=None, workspace=None, stream=None, knobs=None) -> Acceptance:
    """Greedy acceptance: walk the tree while a child carries the target's argmax.

    Parameters
    ----------
    token, first_child, next_sibling : int32 [G, N]
        Any tree in this encoding (siblings in any slot order); out-of-range or cyclic pointers end the walk.
    n_nodes : int32 [G]
    max_depth : int
        K, the most nodes accepted.
    target_predict : int32 [G, N], optional
        The target's argmax at each slot; or
    target_logits : float32 or bf16 [G, N, vocab], optional
        The target's logits (the argmax is fused: equal logits, smaller id). Exactly one of the two.
    out, workspace, stream, knobs
        Keyword-only; see the module docstring.

    Returns
    -------
    Acceptance(accept_len int32 [G], accept_index int32 [G, K + 1], accept_tokens int32 [G, K + 1])
    """
    inputs = {"token": token, "first_child": first_child, "next_sibling": next_sibling, "n_nodes": n_nodes,
              "target_predict": target_predict, "target_logits": target_logits}
    return Acceptance(**run("tree-accept", inputs, {"max_depth": max_depth}, out=out, workspace=workspace,
                            stream=stream, knobs=knobs))


def tree_sample(token, first_child, next_sibling, n_nodes, max_depth: int, target_logits, temperature, top_k, top_p,
                seed, position, *, out=None, workspace=None, stream=None, knobs=None) -> Acceptance:
    """Sampled acceptance: at each visited slot draw the target's token (temperature, top-k, top-p; Gumbel-max with
    Philox noise keyed by seed and absolute position) and accept the child carrying it; token for token what plain
    sampling with the same seed produces.

    Parameters
    ----------
    token, first_child, next_sibling : int32 [G, N]
        Any tree in this encoding (siblings in any slot order); out-of-range or cyclic pointers end the walk.
    n_nodes : int32 [G]
    max_depth : int
        K, the most nodes accepted.
    target_logits : float32 or bf16 [G, N, vocab]
    temperature : float32 [G]
        0: the argmax (top_k and top_p ignored).
    top_k : int32 [G]
        0: off.
    top_p : float32 [G]
        1: off.
    seed : uint64 [G]
    position : int64 [G]
        The absolute position of the token drawn at the root.
    out, workspace, stream, knobs
        Keyword-only; see the module docstring.

    Returns
    -------
    Acceptance(accept_len int32 [G], accept_index int32 [G, K + 1], accept_tokens int32 [G, K + 1])
    """
    inputs = {"token": token, "first_child": first_child, "next_sibling": next_sibling, "n_nodes": n_nodes,
              "target_logits": target_logits, "temperature": temperature, "top_k": top_k, "top_p": top_p,
              "seed": seed, "position": position}
    return Acceptance(**run("tree-sample", inputs, {"max_depth": max_depth}, out=out, workspace=workspace,
                            stream=stream, knobs=knobs))


def verify_attn(q, kv_cache, block_table, prefix_len, kv_tree, mask, n_nodes, softmax_scale: float, *,
                d_v: int = 512, out_dtype: str = "float32", out=None, workspace=None, stream=None,
                knobs=None) -> Attention:
    """MLA (absorbed) attention of the tree's slots over the paged prefix and their ancestors.

    Parameters
    ----------
    q : bf16 [G, N, H, 576]
    kv_cache : bf16 [pages, 64, 576]
        Latent keys; a value is the first d_v columns of its key row.
    block_table : int32 [G, max_pages]
    prefix_len : int32 [G]
    kv_tree : bf16 [G, N, 576]
        The tree slots' own latent keys.
    mask, n_nodes : uint32 [G, N, ceil(N / 32)], int32 [G]
        From `tree_build`.
    softmax_scale : float
    d_v : int
        512 (the kernel's MLA shape).
    out_dtype : "float32" or "bfloat16"
    out, workspace, stream, knobs
        Keyword-only; see the module docstring.

    Returns
    -------
    Attention(out float32 or Bf16 [G, N, H, d_v], lse float32 [G, N, H])
    """
    inputs = {"q": q, "kv_cache": kv_cache, "block_table": block_table, "prefix_len": prefix_len,
              "kv_tree": kv_tree, "mask": mask, "n_nodes": n_nodes}
    params = {"softmax_scale": float(softmax_scale), "d_v": d_v, "out_dtype": out_dtype}
    return Attention(**run("verify-attn", inputs, params, out=out, workspace=workspace, stream=stream, knobs=knobs))
