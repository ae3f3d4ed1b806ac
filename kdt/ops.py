"""`kdt.ops`: launch a stage's kernel on arrays that are already on the GPU.

Anything with `__cuda_array_interface__` or DLPack (CuPy, PyTorch, ...) goes in without a copy; CuPy arrays
come out. bf16 travels as uint16 bits: pass a PyTorch bfloat16 tensor, or wrap a CuPy uint16 array in
`kdt.ops.Bf16(...)`; bf16 outputs come back as `Bf16`. Shapes, dtypes, device, contiguity and the
contract's limits are checked before any launch (values are not: a NaN reaches the kernel unseen; run the
reference for a full check).

CUDA graphs: a launch allocates nothing when `out=` and `workspace=` are given (see `workspace_for`), and
never synchronises or reads device memory on the host, so it can be captured. The first call of a stage
builds or loads its module: make it once before capturing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from kdt import runtime, stages
from kdt.spec import OutputLayout, StageSpec
from refs.errors import BadInput


@dataclass(frozen=True)
class Bf16:
    """A CuPy uint16 array that holds bfloat16 bits (CuPy has no bfloat16 dtype)."""

    bits: Any

    @property
    def shape(self):
        return self.bits.shape


def _device_array(value, name: str):
    """(CuPy array, contract dtype name) for one input, without copying."""
    cp = runtime.cupy()
    if isinstance(value, Bf16):
        array = value.bits
        if not isinstance(array, cp.ndarray) or array.dtype != cp.uint16:
            raise BadInput(name, "Bf16 wrapping a CuPy uint16 array", type(array).__name__)
        return array, "bfloat16"
    if isinstance(value, cp.ndarray):
        return value, np.dtype(value.dtype).name
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
    if array.device.id != device_id:
        raise BadInput(name, f"an array on GPU {device_id} (the current device)", f"GPU {array.device.id}")
    if not array.flags.c_contiguous:
        raise BadInput(name, "a C-contiguous array", f"strides {array.strides}")


_workspaces: dict[tuple, Any] = {}


def workspace_for(spec: StageSpec, shapes: Mapping[str, tuple], params: Mapping) -> Any:
    """The stage's scratch memory for these shapes: zero-filled once, then reused (kernels leave it zero)."""
    cp = runtime.cupy()
    sizer = getattr(runtime.launcher(spec), "workspace_nbytes", None)
    nbytes = int(sizer(dict(shapes), dict(params))) if sizer else 0
    if nbytes == 0:
        return None
    key = (spec.name, cp.cuda.Device().id, nbytes)
    if key not in _workspaces:
        _workspaces[key] = cp.zeros(nbytes, cp.uint8)
    return _workspaces[key]


def run(stage: str | StageSpec, inputs: Mapping[str, Any], params: Mapping[str, Any], *,
        out: Mapping[str, Any] | None = None, workspace: Any = None, stream: Any = None) -> dict[str, Any]:
    """Launch `stage` once. Returns the outputs (those of `out` when given, else new CuPy arrays)."""
    spec = stage if isinstance(stage, StageSpec) else stages.get(stage)
    cp = runtime.cupy()
    device_id = cp.cuda.Device().id
    arrays, dtypes = {}, {}
    for name, value in inputs.items():
        if value is None:
            continue
        if name not in spec.inputs:
            raise BadInput(name, f"one of the {spec.name} inputs {', '.join(spec.inputs)}", "an unknown input")
        arrays[name], dtypes[name] = _device_array(value, name)
        _check_placement(name, arrays[name], device_id)
    shapes = {name: tuple(array.shape) for name, array in arrays.items()}
    launch_params = dict(params)
    spec.check_layout(shapes, dtypes, launch_params)
    launch_params.update({f"{name}_dtype": dtype for name, dtype in dtypes.items()})
    layout: dict[str, OutputLayout] = spec.output_layout(shapes, launch_params)
    outputs = {}
    for name, want in layout.items():
        if out is not None and name in out:
            array, dtype = _device_array(out[name], f"out[{name!r}]")
            if tuple(array.shape) != want.shape or dtype != want.dtype:
                raise BadInput(f"out[{name!r}]", f"{want.dtype} {want.shape}", f"{dtype} {tuple(array.shape)}")
            _check_placement(f"out[{name!r}]", array, device_id)
            outputs[name] = array
        else:
            outputs[name] = cp.empty(want.shape, _np_dtype(want.dtype))
    if workspace is None:
        workspace = workspace_for(spec, shapes, launch_params)
    module = runtime.load(spec.name)
    with (stream if stream is not None else cp.cuda.get_current_stream()):
        runtime.launcher(spec).launch(module, arrays, launch_params, outputs, workspace)
    return {name: Bf16(array) if layout[name].dtype == "bfloat16" else array for name, array in outputs.items()}


def topk(logits, k: int, **options) -> dict[str, Any]:
    """logits [G, K, vocab] float32 or bf16 -> {top_ids int32, top_logp float32} [G, K, k]."""
    return run("topk", {"logits": logits}, {"k": k}, **options)


def tree_build(top_logp, top_ids, budget: int, **options) -> dict[str, Any]:
    """top_logp float32 / top_ids int32 [G, K, V] -> the contract's tree outputs for N = budget + 1 slots."""
    return run("tree-build", {"top_logp": top_logp, "top_ids": top_ids}, {"budget": budget}, **options)


def tree_accept(token, first_child, next_sibling, n_nodes, max_depth: int, *, target_predict=None,
                target_logits=None, **options) -> dict[str, Any]:
    """The greedy walk; exactly one of target_predict int32 [G, N] / target_logits [G, N, vocab]."""
    inputs = {"token": token, "first_child": first_child, "next_sibling": next_sibling, "n_nodes": n_nodes,
              "target_predict": target_predict, "target_logits": target_logits}
    return run("tree-accept", inputs, {"max_depth": max_depth}, **options)


def verify_attn(q, kv_cache, block_table, prefix_len, kv_tree, mask, n_nodes, softmax_scale: float,
                d_v: int = 512, out_dtype: str = "float32", **options) -> dict[str, Any]:
    """MLA tree-verify attention -> {out [G, N, H, d_v] (float32 or Bf16), lse float32 [G, N, H]}."""
    inputs = {"q": q, "kv_cache": kv_cache, "block_table": block_table, "prefix_len": prefix_len,
              "kv_tree": kv_tree, "mask": mask, "n_nodes": n_nodes}
    return run("verify-attn", inputs, {"softmax_scale": float(softmax_scale), "d_v": d_v, "out_dtype": out_dtype},
               **options)
