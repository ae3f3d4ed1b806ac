"""Launcher for `kernels/verify_attn.cu` (`verify-attn`): MLA tree-verify attention over a paged prefix.

Kernels (see the header of the .cu for the algorithm):
  kdt_verify_attn_fwd      grid (ceil(N*H/64), G, splits), 256 threads, kdt_verify_attn_smem_bytes of dynamic smem
  kdt_verify_attn_combine  grid (ceil(N*H/2), G), 256 threads (4 warps per row); only when splits > 1

Limits: Dqk = 576 and Dv = 512 only (MLA absorbed latent 512 + rope 64); other dims raise BadInput. G <= 65535.

Split (flash-decoding): when G * ceil(N*H/64) CTAs cannot fill the GPU, the key tiles of each request are split
over `splits` CTAs (grid z) that write normalised partials + lse to the workspace, and the combine kernel merges
them. `splits` is a function of the shapes and the SM count only (never of device data), so a launch can be
captured in a CUDA graph; the per-split tile ranges follow the actual prefix_len on the device. The workspace
carries nothing between launches: the combine reads only words the same launch's main kernel wrote, so it is
not zeroed afterwards (kernel-abi.md: only state that a kernel reads before writing must return to zero).
"""

from __future__ import annotations

import math

import numpy as np

from kdt.launch.common import kernel_constants, kernel_function, module_cache, sm_count
from refs.errors import BadInput

ROWS = 64                    # query rows (slot, head) per CTA; checked against kdt_verify_attn_rows
KEY_DIM = 576
VALUE_DIM = 512
PAGE_SIZE = 64
MIN_PAGES_PER_SPLIT = 4      # a split streams at least this many pages (amortises its Q load and partial write)
DEFAULT_MULTIPROCESSORS = 132
LOG2E = 1.4426950408889634
FWD = "kdt_verify_attn_fwd"
COMBINE = "kdt_verify_attn_combine"
_CONSTANTS = ("threads", "rows", "kv_tile", "smem_bytes", "dqk", "dv", "page", "combine_threads", "combine_rows")



def _check_dims(key_dim: int, d_v: int) -> None:
    if key_dim != KEY_DIM:
        raise BadInput("q", f"Dqk = {KEY_DIM} (the verify-attn kernel supports the MLA shape 576/512 only)", key_dim)
    if d_v != VALUE_DIM:
        raise BadInput("d_v", f"{VALUE_DIM} (the verify-attn kernel supports the MLA shape 576/512 only)", d_v)


def num_splits(shapes: dict[str, tuple[int, ...]], multiprocessors: int | None = None) -> int:
    """Key-tile splits per (request, query tile), from shapes only: enough CTAs for one wave, each split
    holding at least MIN_PAGES_PER_SPLIT pages of the largest possible prefix (block_table width)."""
    groups, slots, heads, _ = shapes["q"]
    max_pages = shapes["block_table"][1]
    base = groups * math.ceil(slots * heads / ROWS)
    if base == 0:
        return 1
    sms = multiprocessors or sm_count(default=DEFAULT_MULTIPROCESSORS)
    if base >= sms:
        return 1
    return max(1, min(sms // base, max_pages // MIN_PAGES_PER_SPLIT))


def workspace_nbytes(shapes: dict[str, tuple[int, ...]], params: dict) -> int:
    """Split partials: out float32 [splits, G, Rpad, 512] then lse float32 [splits, G, Rpad], Rpad = 64*tiles."""
    splits = num_splits(shapes)
    if splits <= 1:
        return 0
    groups, slots, heads, _ = shapes["q"]
    rows_padded = math.ceil(slots * heads / ROWS) * ROWS
    return splits * groups * rows_padded * (VALUE_DIM + 1) * 4


def _kernels(module) -> dict:
    """Launch constants (from the cubin) and functions, read and checked once per module."""
    cache = module_cache(module)
    if "kernels" in cache:
        return cache["kernels"]
    found = dict(kernel_constants(module, "kdt_verify_attn_", _CONSTANTS))
    expected = {"rows": ROWS, "dqk": KEY_DIM, "dv": VALUE_DIM, "page": PAGE_SIZE}
    for name, value in expected.items():
        if found[name] != value:
            raise RuntimeError(f"verify_attn cubin has kdt_verify_attn_{name} = {found[name]}, launcher expects "
                               f"{value}: rebuild the kernel")
    found["fwd"] = kernel_function(module, FWD, found["smem_bytes"])
    found["combine"] = kernel_function(module, COMBINE)
    cache["kernels"] = found
    return found


def launch(module, inputs: dict, params: dict, outputs: dict, workspace) -> None:
    import cupy

    q = inputs["q"]
    groups, slots, heads, key_dim = q.shape
    _check_dims(int(key_dim), int(params["d_v"]))
    if groups > 65535:
        raise BadInput("q", "at most 65535 requests per launch (grid y)", groups)
    out, lse = outputs["out"], outputs["lse"]
    out_dtype = params.get("out_dtype", "float32")
    if out_dtype not in ("float32", "bfloat16"):
        raise BadInput("out_dtype", "float32 or bfloat16", out_dtype)
    want = np.float32 if out_dtype == "float32" else np.uint16
    if out.dtype != want:
        raise BadInput("out", f"a {np.dtype(want).name} array for out_dtype {out_dtype}", out.dtype)
    if groups == 0 or slots == 0 or heads == 0:
        return
    k = _kernels(module)
    shapes = {name: tuple(array.shape) for name, array in inputs.items()}
    splits = num_splits(shapes)
    rows = slots * heads
    tiles = math.ceil(rows / ROWS)
    stream = cupy.cuda.get_current_stream()
    out_bf16 = np.int32(1 if out_dtype == "bfloat16" else 0)
    if splits > 1:
        need = workspace_nbytes(shapes, params)
        if workspace is None or workspace.nbytes < need:
            have = 0 if workspace is None else workspace.nbytes
            raise RuntimeError(f"verify_attn: workspace of {have} bytes, needs {need} (workspace_nbytes)")
        scratch = workspace.reshape(-1)[:need].view(cupy.float32)
        partial_count = splits * groups * tiles * ROWS * VALUE_DIM
        part_o, part_lse = scratch[:partial_count], scratch[partial_count:]
    else:
        part_o = part_lse = lse  # not touched when splits == 1
    k["fwd"](
        (tiles, groups, splits), (k["threads"], 1, 1),
        (q, inputs["kv_cache"], inputs["block_table"], inputs["prefix_len"], inputs["kv_tree"], inputs["mask"],
         inputs["n_nodes"], np.int32(groups), np.int32(slots), np.int32(heads),
         np.int32(inputs["block_table"].shape[1]), np.int32(inputs["mask"].shape[2]),
         np.float32(float(params["softmax_scale"]) * LOG2E), np.int32(splits), out_bf16, out, lse, part_o,
         part_lse),
        shared_mem=k["smem_bytes"], stream=stream)
    if splits > 1:
        per_block = k["combine_rows"]
        k["combine"](
            ((rows + per_block - 1) // per_block, groups, 1), (k["combine_threads"], 1, 1),
            (part_o, part_lse, inputs["n_nodes"], np.int32(groups), np.int32(slots), np.int32(heads),
             np.int32(splits), np.int32(tiles * ROWS), out_bf16, out, lse),
            stream=stream)
