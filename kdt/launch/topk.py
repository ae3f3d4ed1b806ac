"""Launcher for ``kernels/topk.cu`` (stage ``topk``).

``launch(module, inputs, params, outputs, workspace)``:
    inputs  = {"logits": cupy float32 or uint16 (bf16 bits) [G, K, vocab]}
    params  = {"k": V, "logits_dtype": "float32" | "bfloat16"}
    outputs = {"top_ids": int32 [G, K, V], "top_logp": float32 [G, K, V]}

Paths (see the header of kernels/topk.cu):
  * V <= 32: ``kdt_topk_small_{f32,bf16}_v{VT}`` (VT = smallest of 1, 2, 4, 8, 16, 32 >= V), grid R * S blocks of
    256 threads; each row's vocabulary is split over S blocks (the last one to finish merges), S chosen from the
    number of rows and SMs: few rows -> about one wave of blocks, many rows -> a few blocks per row.
    When that plan splits a row over >= CLUSTER_MIN_SPLITS blocks (few rows), ``kdt_topk_cluster_*`` runs
    instead: one cluster of C blocks per row (the cubin's kdt_topk_cluster_size: 16 on sm_90, 8 on sm_120),
    merged over distributed shared memory.  Where V <= RESIDENT_MAX_V, the rows are 16-byte aligned (vocab a
    multiple of the elements per 16-byte vector) and a block's chunk fits its shared memory, the cluster runs
    ``kdt_topk_resident_{wide,narrow}_{f32,bf16}`` instead (kdt_topk_resident_<shape>_cluster blocks of
    kdt_topk_resident_threads per row; see resident_plan for the choice of shape): each block copies its whole
    chunk into shared memory at once (dynamic shared memory: the chunk, at least the kernel's
    kdt_topk_resident_<shape>_min_smem).
  * V > 32: ``kdt_topk_general_{f32,bf16}``, one 1024-thread block per row, no workspace.

Workspace (only when 1 < S < CLUSTER_MIN_SPLITS), byte offsets, each part padded to 256 bytes:
    u32 counter[R] | float2 (max, sum-exp) stats[R][S] | uint2 (key, id) candidates[R][S][VT]
The kernel leaves the counters zero again (the rest is rewritten before it is read).  Everything here is host
arithmetic on shapes; the only device read is the one-time read of the module's exported constants (first
launch with a given module).
"""
from __future__ import annotations


import numpy as np

from kdt.launch.common import kernel_constants, kernel_function, module_cache, sm_count

try:  # the package may be imported on a machine without CuPy (spec checks, docs)
    import cupy as cp
except ImportError:  # pragma: no cover
    cp = None

# Mirrors of kernels/topk.cu constants (checked against the cubin's kdt_topk_* globals on first launch).
SMALL_VT = (1, 2, 4, 8, 16, 32)
SMALL_THREADS = 256
GENERAL_THREADS = 1024
MAX_SPLITS = 128
MERGE_CAP = 2048
MAX_V = 1024
MAX_VOCAB = 1 << 18

# Split tuning (performance only; any S in [1, limits] gives the same ids and logp within float rounding).
BLOCKS_PER_SM = 3      # resident small-path blocks per SM on sm_90 (256 threads, <= 80 registers, 74 KB smem)
MANY_ROWS_WAVES = 2    # when rows >= one wave of blocks: aim for this many waves of blocks in total (swept on the H200: 2 beats 4 and 8)
MIN_CHUNK = 8192       # at least this many columns per block (swept on the H200: fewer, fatter blocks for few rows)
CHUNK_ALIGN = 64       # chunk is a multiple of this many columns
# Few rows: when the plan splits a row over at least CLUSTER_MIN_SPLITS blocks, one cluster of blocks per row
# merges over distributed shared memory instead (no workspace, no last-block round trip through global memory).
CLUSTER_MIN_SPLITS = 8
# The resident variant of the cluster path (see launch): V <= RESIDENT_MAX_V, 16-byte aligned rows, at most the
# kernel's kdt_topk_resident_<shape>_max_vectors 16-byte vectors per thread.  RESIDENT_PATH off: the plain
# cluster path.
RESIDENT_PATH = True
RESIDENT_MAX_V = 8
# Up to this many rows the wide shape (16-block clusters on sm_90) runs first, beyond it the narrow one (8-block
# clusters).  The H200 co-schedules 7 16-block clusters at one block per SM and 15 8-block ones
# (cuOccupancyMaxActiveClusters); a 15-row batch of 16-block clusters stacks three blocks on 16 SMs, whose data
# lands last (G=1 f32, wide / narrow: 7 rows 5.42 / 6.16 us, 15 rows 8.30 / 7.36; plans/perf-notes.md has the sweep).
RESIDENT_WIDE_MAX_ROWS = 7
RESIDENT_SHAPES = ("wide", "narrow")
VECTOR_BYTES = 16                            # the resident variant's loads and its row alignment
VECTOR_ELEMENTS = {"f32": 4, "bf16": 8}      # elements per 16-byte vector
PORTABLE_CLUSTER = 8     # larger clusters need the function's opt-in below
_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14   # CUfunction_attribute

_CONSTS = {
    "kdt_topk_small_threads": SMALL_THREADS,
    "kdt_topk_small_max_v": SMALL_VT[-1],
    "kdt_topk_max_splits": MAX_SPLITS,
    "kdt_topk_merge_cap": MERGE_CAP,
    "kdt_topk_general_threads": GENERAL_THREADS,
    "kdt_topk_max_v": MAX_V,
    "kdt_topk_max_vocab": MAX_VOCAB,
    "kdt_topk_resident_max_v": RESIDENT_MAX_V,
}
# Per-arch launch facts, read from the module: the small path's dynamic smem, the cluster path's blocks per row,
# and the resident variant's blocks per row, threads, vectors per thread and least dynamic smem.
ARCH_CONSTANTS = {"stage_bytes": "kdt_topk_small_stage_bytes", "cluster": "kdt_topk_cluster_size",
                  "resident_threads": "kdt_topk_resident_threads",
                  **{f"resident_{shape}_{fact}": f"kdt_topk_resident_{shape}_{fact}"
                     for shape in RESIDENT_SHAPES for fact in ("cluster", "max_vectors", "min_smem")}}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _align256(n: int) -> int:
    return (n + 255) & ~255


def _vt(V: int) -> int | None:
    for t in SMALL_VT:
        if V <= t:
            return t
    return None


def plan(rows: int, vocab: int, V: int, sm_count: int) -> tuple[int | None, int, int]:
    """(VT or None for the general path, S splits per row, chunk columns per split)."""
    vt = _vt(V)
    if vt is None:
        return None, 1, vocab
    target = max(1, sm_count * BLOCKS_PER_SM)
    if rows >= target:
        S = _cdiv(MANY_ROWS_WAVES * target, rows)
    else:
        S = target // rows
    S = max(1, min(S, MAX_SPLITS, MERGE_CAP // vt, _cdiv(vocab, MIN_CHUNK)))
    chunk = _cdiv(_cdiv(vocab, S), CHUNK_ALIGN) * CHUNK_ALIGN
    S = _cdiv(vocab, chunk)
    return vt, S, chunk


def uses_cluster(S: int) -> bool:
    """Whether a plan of S splits per row runs as one cluster of blocks per row instead (few rows)."""
    return S >= CLUSTER_MIN_SPLITS


def cluster_size(S: int, compiled: int) -> int:
    """Blocks per row of the cluster path for a plan of S splits, with `compiled` the cubin's cluster size
    (0: the plan's split stands)."""
    return compiled if uses_cluster(S) else 0


def cluster_chunk(vocab: int, cluster: int) -> int:
    """Columns per block of the cluster path (a multiple of CHUNK_ALIGN)."""
    return _cdiv(_cdiv(vocab, cluster), CHUNK_ALIGN) * CHUNK_ALIGN


def resident_plan(rows: int, vocab: int, V: int, dtype: str, arch: dict[str, int],
                  address: int) -> tuple[str, int, int] | None:
    """(shape, blocks per row, dynamic shared memory) of the resident variant for `rows` rows of `vocab` logits
    at `address` (`arch`: the module's constants), or None where it does not apply (the plain cluster path
    runs).  The preferred shape by the number of rows (RESIDENT_WIDE_MAX_ROWS), else the other one where only it
    fits a block's chunk."""
    width = VECTOR_ELEMENTS[dtype]
    if not RESIDENT_PATH or V > RESIDENT_MAX_V or vocab % width or address % VECTOR_BYTES:
        return None
    order = RESIDENT_SHAPES if rows <= RESIDENT_WIDE_MAX_ROWS else RESIDENT_SHAPES[::-1]
    for shape in order:
        blocks = arch[f"resident_{shape}_cluster"]
        vectors = cluster_chunk(vocab, blocks) // width
        if vectors <= arch[f"resident_{shape}_max_vectors"] * arch["resident_threads"]:
            return shape, blocks, max(vectors * VECTOR_BYTES, arch[f"resident_{shape}_min_smem"])
    return None


def _cluster_attributes(blocks: int) -> dict[int, int] | None:
    """The function attributes a launch of `blocks`-block clusters needs: the opt-in above the portable size."""
    return {_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: 1} if blocks > PORTABLE_CLUSTER else None


def _ws_bytes(rows: int, S: int, vt: int | None) -> int:
    if vt is None or S <= 1 or uses_cluster(S):   # the cluster path needs no workspace
        return 0
    return _align256(rows * 4) + _align256(rows * S * 8) + rows * S * vt * 8


def _check_args(rows: int, vocab: int, V: int) -> None:
    if not (1 <= V <= min(vocab, MAX_V)):
        raise ValueError(f"topk: k={V} must satisfy 1 <= k <= min(vocab={vocab}, {MAX_V})")
    if vocab > MAX_VOCAB:
        raise ValueError(f"topk: vocab={vocab} exceeds the kernel limit {MAX_VOCAB}")


def workspace_nbytes(shapes: dict, params: dict) -> int:
    G, K, vocab = (int(d) for d in shapes["logits"])
    V = int(params["k"])
    rows = G * K
    if rows == 0:
        return 0
    _check_args(rows, vocab, V)
    vt, S, _ = plan(rows, vocab, V, sm_count())
    return _ws_bytes(rows, S, vt)


def _arch(module) -> dict[str, int]:
    """The module's per-arch launch facts (ARCH_CONSTANTS), once the launcher's copies of the kernel's other
    constants are checked against the kernel's (they shape the launch); once per module."""
    cache = module_cache(module)
    if "arch" not in cache:
        constants = kernel_constants(module, "", [*_CONSTS, *ARCH_CONSTANTS.values()])
        for name, want in _CONSTS.items():
            if constants[name] != want:
                raise RuntimeError(f"topk: kernel constant {name}={constants[name]} but the launcher assumes {want}")
        cache["arch"] = {key: constants[name] for key, name in ARCH_CONSTANTS.items()}
    return cache["arch"]


def launch(module, inputs: dict, params: dict, outputs: dict, workspace) -> None:
    logits = inputs["logits"]
    top_ids = outputs["top_ids"]
    top_logp = outputs["top_logp"]
    dtype_name = params.get("logits_dtype", "float32")
    if dtype_name == "float32":
        sfx, want = "f32", np.float32
    elif dtype_name == "bfloat16":
        sfx, want = "bf16", np.uint16
    else:
        raise ValueError(f"topk: logits_dtype must be 'float32' or 'bfloat16', got {dtype_name!r}")
    if logits.dtype != want:
        raise ValueError(f"topk: logits dtype {logits.dtype} does not match logits_dtype={dtype_name!r}")
    if logits.ndim != 3:
        raise ValueError(f"topk: logits must be [G, K, vocab], got shape {logits.shape}")
    G, K, vocab = (int(d) for d in logits.shape)
    V = int(params["k"])
    rows = G * K
    _check_args(rows, vocab, V)
    for name, arr, dt in (("top_ids", top_ids, np.int32), ("top_logp", top_logp, np.float32)):
        if arr.dtype != dt or tuple(arr.shape) != (G, K, V):
            raise ValueError(f"topk: {name} must be {np.dtype(dt).name} [{G}, {K}, {V}], got {arr.dtype} {arr.shape}")
        if not arr.flags.c_contiguous:
            raise ValueError(f"topk: {name} must be C-contiguous")
    if not logits.flags.c_contiguous:
        raise ValueError("topk: logits must be C-contiguous")
    if rows == 0:
        return
    arch = _arch(module)
    stage_bytes = arch["stage_bytes"]

    vt, S, chunk = plan(rows, vocab, V, sm_count())
    if vt is None:
        fn = kernel_function(module, f"kdt_topk_general_{sfx}")
        fn((rows,), (GENERAL_THREADS,), (logits, top_ids, top_logp, np.int32(vocab), np.int32(V)))
        return

    cluster = cluster_size(S, arch["cluster"])
    attributes = _cluster_attributes(cluster)
    if cluster:
        resident = resident_plan(rows, vocab, V, sfx, arch, int(logits.data.ptr))
        if resident is not None:
            shape, blocks, smem = resident
            threads = arch["resident_threads"]
            fn = kernel_function(module, f"kdt_topk_resident_{shape}_{sfx}", smem, _cluster_attributes(blocks))
            fn((rows * blocks,), (threads,),
               (logits, top_ids, top_logp, np.int32(vocab), np.int32(V), np.int32(cluster_chunk(vocab, blocks))),
               shared_mem=smem)
            return
        S = cluster
        chunk = cluster_chunk(vocab, S)
        name = f"kdt_topk_cluster_{sfx}_v{vt}"
        ws = np.uint64(0)  # the cluster merges in shared memory: no workspace
    else:
        name = f"kdt_topk_small_{sfx}_v{vt}"
        need = _ws_bytes(rows, S, vt)
        if need:
            if workspace is None or workspace.nbytes < need:
                have = 0 if workspace is None else workspace.nbytes
                raise ValueError(f"topk: workspace of {need} bytes needed, got {have} (see workspace_nbytes)")
            ws = workspace
        else:
            ws = np.uint64(0)  # null pointer: the kernel never touches the workspace when S == 1
    fn = kernel_function(module, name, stage_bytes, attributes)
    fn((rows * S,), (SMALL_THREADS,),
       (logits, top_ids, top_logp, ws, np.int32(vocab), np.int32(V), np.int32(chunk), np.int32(S)),
       shared_mem=stage_bytes)
