"""Launcher for kernels/tree_accept.cu (contract section `tree-accept`).

One launch for the whole batch, on the current CuPy stream, no allocation, no synchronisation, no host read of
device data (graph-capturable), apart from reading the kernel's `kdt_tree_accept_*` launch constants once per
module on first use (a first call must therefore not be inside a graph capture: warm up first).

- `target_predict` given: `tree_accept_from_predict`, one warp per request; no workspace.
- `target_logits` given (float32, or bf16 as uint16 raw bits with params["target_logits_dtype"] == "bfloat16"):
  `tree_accept_from_logits`, G * N * S blocks (S vocab splits per row, chosen here so that small batches still
  fill the GPU), the argmax fused with the walk; needs `workspace_nbytes` bytes of workspace, zero on entry and
  left zero on exit.
"""

from __future__ import annotations


import numpy as np

from kdt.launch.common import kernel_constants, kernel_function, module_cache, sm_count
from refs.errors import BadInput

_PREFIX = "kdt_tree_accept_"
_CONSTANTS = ("max_nodes", "walk_warps", "argmax_threads", "argmax_min_blocks", "split_min_vectors")
_PREDICT_KERNEL = "tree_accept_from_predict"
_LOGITS_KERNEL = "tree_accept_from_logits"
_OUTPUTS = ("accept_len", "accept_index", "accept_tokens")
_MAX_BLOCKS = 2**31 - 1



def _cupy():
    import cupy  # imported on first launch only: CPU-only callers (workspace_nbytes) need no CuPy

    return cupy


def _module_info(module) -> dict:
    """The kernel's launch constants (read once from its __constant__ symbols) and entry points."""
    cache = module_cache(module)
    if "info" not in cache:
        info: dict = dict(kernel_constants(module, _PREFIX, _CONSTANTS))
        info["predict"] = kernel_function(module, _PREDICT_KERNEL)
        info["logits"] = kernel_function(module, _LOGITS_KERNEL)
        cache["info"] = info
    return cache["info"]


def _logits_bf16(logits, params: dict) -> bool:
    dtype = params.get("target_logits_dtype")
    if dtype is None:
        dtype = "bfloat16" if logits.dtype == np.uint16 else str(logits.dtype)
    if dtype == "bfloat16" and logits.dtype == np.uint16:
        return True
    if dtype == "float32" and logits.dtype == np.float32:
        return False
    raise BadInput("target_logits", "float32, or uint16 bf16 bits with target_logits_dtype 'bfloat16'",
                   f"dtype {logits.dtype} with target_logits_dtype {dtype!r}")


def _splits(rows: int, vocab: int, elem_size: int, info: dict) -> int:
    """Vocab splits per row: enough blocks for two full waves of resident blocks, but no split smaller than
    split_min_vectors 16-byte vectors. G = N = 64 (4096 rows) gives 1."""
    vectors = vocab * elem_size // 16
    most = max(1, vectors // info["split_min_vectors"])
    wanted = -(-2 * sm_count() * info["argmax_min_blocks"] // rows)
    return max(1, min(most, wanted, _MAX_BLOCKS // rows))


def _shape_of(shapes: dict, name: str) -> tuple[int, ...] | None:
    shape = shapes.get(name)
    return None if shape is None else tuple(int(x) for x in shape)


def workspace_nbytes(shapes: dict, params: dict) -> int:
    """Per-slot argmax keys (uint64, G * N) then per-request counters (uint32, G); none from target_predict."""
    logits = _shape_of(shapes, "target_logits")
    if logits is None:
        return 0
    groups, slots = logits[0], logits[1]
    return groups * slots * 8 + groups * 4


def _require_int32(array, name: str, shape: tuple[int, ...]) -> None:
    if array.dtype != np.int32 or tuple(array.shape) != shape:
        raise BadInput(name, f"int32 of shape {shape}", f"{array.dtype} of shape {tuple(array.shape)}")
    if not array.flags.c_contiguous:
        raise BadInput(name, "a C-contiguous array", "a strided view")


def launch(module, inputs: dict, params: dict, outputs: dict, workspace) -> None:
    info = _module_info(module)
    token, first_child, next_sibling = inputs["token"], inputs["first_child"], inputs["next_sibling"]
    if token.ndim != 2:
        raise BadInput("token", "2 dimensions [G, N]", f"shape {tuple(token.shape)}")
    groups, slots = (int(x) for x in token.shape)
    for name in ("token", "first_child", "next_sibling"):
        _require_int32(inputs[name], name, (groups, slots))
    depth = params.get("max_depth")
    if not isinstance(depth, (int, np.integer)) or not 0 <= int(depth) < 2**31 - 1:
        raise BadInput("max_depth", "an integer >= 0", depth)
    depth = int(depth)
    if not 1 <= slots <= info["max_nodes"]:
        raise BadInput("token", f"1 <= N <= {info['max_nodes']} slots (launcher limit)", slots)
    _require_int32(outputs["accept_len"], "accept_len", (groups,))
    for name in ("accept_index", "accept_tokens"):
        _require_int32(outputs[name], name, (groups, depth + 1))
    has_predict, has_logits = "target_predict" in inputs, "target_logits" in inputs
    if has_predict == has_logits:
        raise BadInput("target_predict/target_logits", "exactly one of the two", "both" if has_predict else "neither")
    if groups == 0:
        return
    stream = _cupy().cuda.get_current_stream()
    accept_len, accept_index, accept_tokens = (outputs[name] for name in _OUTPUTS)

    if has_predict:
        predict = inputs["target_predict"]
        _require_int32(predict, "target_predict", (groups, slots))
        warps = info["walk_warps"]
        info["predict"](((groups + warps - 1) // warps,), (32 * warps,),
                        (token, first_child, next_sibling, predict, np.int32(groups), np.int32(slots),
                         np.int32(depth), accept_len, accept_index, accept_tokens), stream=stream)
        return

    logits = inputs["target_logits"]
    bf16 = _logits_bf16(logits, params)
    if logits.ndim != 3 or tuple(logits.shape[:2]) != (groups, slots) or not 1 <= logits.shape[2] < 2**31:
        raise BadInput("target_logits", f"shape ({groups}, {slots}, vocab >= 1)", f"shape {tuple(logits.shape)}")
    if not logits.flags.c_contiguous:
        raise BadInput("target_logits", "a C-contiguous array", "a strided view")
    vocab = int(logits.shape[2])
    rows = groups * slots
    if rows > _MAX_BLOCKS:
        raise BadInput("target_logits", f"G * N <= {_MAX_BLOCKS} rows (launcher limit)", rows)
    need = workspace_nbytes({"target_logits": logits.shape}, params)
    if workspace is None or workspace.nbytes < need or workspace.data.ptr % 8 != 0:
        raise BadInput("workspace", f"at least {need} bytes, 8-byte aligned, zero-filled",
                       None if workspace is None else f"{workspace.nbytes} bytes at {workspace.data.ptr:#x}")
    splits = _splits(rows, vocab, 2 if bf16 else 4, info)
    info["logits"]((rows * splits,), (info["argmax_threads"],),
                   (logits, np.int32(1 if bf16 else 0), np.int32(vocab), np.int32(splits), token, first_child,
                    next_sibling, np.int32(groups), np.int32(slots), np.int32(depth), workspace, accept_len,
                    accept_index, accept_tokens), stream=stream)
