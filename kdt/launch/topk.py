"""Launch plan for `kernels/topk.cu` (stage `topk`): which path runs a [G, K, vocab] batch, and how.

Paths (the kernel's header and plans/kernels/topk.md say how each works):
  small     V <= 32: `kdt_topk_small_{f32,bf16}_v{VT}` (VT = the smallest power of two >= V), R * S blocks; each
            row's vocabulary is split over S blocks (the last to finish merges through the workspace when S > 1).
            S from the rows and the SMs: few rows -> about one wave of blocks, many rows -> a few blocks per row.
  cluster   where that plan splits a row over >= `cluster_min_splits` blocks (few rows): one thread-block cluster
            per row instead (`kdt_topk_cluster_*`, kdt_topk_cluster_size blocks: 16 on sm_90, 8 on sm_120),
            merged over distributed shared memory; no workspace.
  resident  the cluster path's variant for V <= 8 and 16-byte aligned rows whose block chunk fits one of its two
            shapes (`kdt_topk_resident_{wide,narrow}_*`): each block holds its whole chunk in shared memory.
  gate      V > 32, rows 16-byte aligned and vocab a whole number of vectors: `kdt_topk_gate_{f32,bf16}`, one
            1024-thread block per row reads it once, keeping the candidates above a gate in shared memory (the
            buffer's entries in dynamic shared memory, 8 bytes each) and pruning them by radix select; f32 rows
            stream through a cp.async ring after the buffer (kdt_topk_gate_f32_ring_bytes, 0 on sm_120); the one-block
            bf16 kernel keeps every vector's maximum there and takes its gate from them after the scan
            (kdt_topk_gate_bf16_maxima_bytes; 0 on sm_120, where the gate opens at the first step).
  gate-split the gate path's rows where they leave SMs idle: `kdt_topk_gate_split_{f32,bf16}`, S blocks per row
            (`gate_splits`), whose V best the row's last block merges through the workspace.
  radix     the other rows with V > 32: `kdt_topk_general_{f32,bf16}`, one 1024-thread block per row, exact radix
            select over 2-5 reads of the row.

Workspace (small path with 1 < S), byte offsets, each part padded to 256 bytes:
    u32 counter[R] | float2 (max, sum-exp) stats[R][S] | uint2 (key, id) candidates[R][S][VT]
and of the gate path with 1 < S:
    u32 counter[R] | 32-byte record[R][S] | u64 composite entries[R][S][V]
The kernels leave the counters zero again (the rest is rewritten before it is read).
"""

from __future__ import annotations

from dataclasses import dataclass

from kdt.launch.plan import (IN_GRAPHS, NULL, ArraySpec, KernelLaunch, LaunchKnobs, LaunchPlan, Target, Workspace,
                             cdiv, knob)

import numpy as np

CHUNK_ALIGN = 64          # a block's chunk is a multiple of this many columns (the kernel's 16-byte vector rows)
VECTOR_BYTES = 16         # the resident variant's loads, and the alignment it needs of a row
VECTOR_ELEMENTS = {"float32": 4, "bfloat16": 8}
SUFFIX = {"float32": "f32", "bfloat16": "bf16"}
PORTABLE_CLUSTER = 8      # larger clusters need the function's non-portable opt-in (sm_90 only)
RESIDENT_SHAPES = ("wide", "narrow")


@dataclass(frozen=True)
class Knobs(LaunchKnobs):
    blocks_per_sm: int = knob(3, "small path: resident blocks per SM the split aims for (256 threads, <= 80 "
                                 "registers; 74 KB smem on sm_90, 30 KB on sm_120)")
    many_rows_waves: int = knob(2, "small path, rows >= one wave of blocks: waves of blocks in all (swept on the "
                                   "H200: 2 beats 4 and 8)")
    min_chunk: int = knob(8192, "small path: the fewest columns per block (fewer, fatter blocks for few rows)")
    cluster_min_splits: int = knob(8, "a row split over at least this many blocks runs as one cluster per row")
    resident: bool = knob(True, "let the resident variant take the cluster path's rows where it applies")
    resident_wide_max_rows: int = knob(7, "up to this many rows the wide resident shape first, beyond it the "
                                          "narrow one (the H200 places 7 16-block clusters one block per SM)")
    gate: bool = knob(True, "V > 32: the gate path where the rows allow it (off: the radix path)")
    gate_min_chunk: int = knob(16384, "gate path: the fewest columns a split of a row takes (rows are split only "
                                      "where they leave SMs idle; >= vocab: one block per row)")


def small_vt(V: int, target: Target) -> int | None:
    """The small path's template bound for V (a power of two >= V), or None for the radix path."""
    vt = 1
    while vt < V:
        vt *= 2
    return vt if vt <= target.constant("kdt_topk_small_max_v") else None


def splits(rows: int, vocab: int, vt: int, target: Target, knobs: Knobs) -> tuple[int, int]:
    """(S blocks per row, chunk columns per block) of the small path."""
    blocks = max(1, target.multiprocessors * knobs.blocks_per_sm)
    S = cdiv(knobs.many_rows_waves * blocks, rows) if rows >= blocks else blocks // rows
    S = max(1, min(S, target.constant("kdt_topk_max_splits"), target.constant("kdt_topk_merge_cap") // vt,
                   cdiv(vocab, knobs.min_chunk)))
    chunk = cdiv(cdiv(vocab, S), CHUNK_ALIGN) * CHUNK_ALIGN
    return cdiv(vocab, chunk), chunk


def cluster_chunk(vocab: int, blocks: int) -> int:
    """Columns per block when a row is spread over `blocks` blocks of one cluster (a multiple of CHUNK_ALIGN)."""
    return cdiv(cdiv(vocab, blocks), CHUNK_ALIGN) * CHUNK_ALIGN


def resident_shape(rows: int, vocab: int, V: int, logits: ArraySpec, target: Target,
                   knobs: Knobs) -> tuple[str, int, int] | None:
    """(shape, blocks per row, dynamic shared memory) of the resident variant, or None where it does not apply:
    the preferred shape by the number of rows, else the other one where only it fits a block's chunk."""
    width = VECTOR_ELEMENTS[logits.dtype]
    if (not knobs.resident or V > target.constant("kdt_topk_resident_max_v") or vocab % width
            or logits.alignment < VECTOR_BYTES):
        return None
    order = RESIDENT_SHAPES if rows <= knobs.resident_wide_max_rows else RESIDENT_SHAPES[::-1]
    threads = target.constant("kdt_topk_resident_threads")
    for shape in order:
        blocks = target.constant(f"kdt_topk_resident_{shape}_cluster")
        vectors = cluster_chunk(vocab, blocks) // width
        if vectors <= target.constant(f"kdt_topk_resident_{shape}_max_vectors") * threads:
            return shape, blocks, max(vectors * VECTOR_BYTES, target.constant(f"kdt_topk_resident_{shape}_min_smem"))
    return None


def gate_capacity(V: int, target: Target) -> int:
    """The gate path's buffer entries for V, as the kernel's gate_capacity computes them (it checks the launch's)."""
    return max(target.constant("kdt_topk_gate_room_per_v") * V, target.constant("kdt_topk_gate_min_room"))


def gate_splits(rows: int, vocab: int, V: int, capacity: int, target: Target, knobs: Knobs) -> tuple[int, int]:
    """(S blocks per row, chunk columns per block) of the gate path: as many splits as leave no more than one
    block per SM, each at least `gate_min_chunk` columns, and no more than the merge can hold (S * V <= capacity).
    """
    S = max(1, min(target.multiprocessors // rows, target.constant("kdt_topk_gate_max_splits"), capacity // V,
                   vocab // max(1, knobs.gate_min_chunk)))
    chunk = cdiv(cdiv(vocab, S), CHUNK_ALIGN) * CHUNK_ALIGN
    return cdiv(vocab, chunk), chunk


def _align256(n: int) -> int:
    return (n + 255) & ~255


def plan(inputs: dict[str, ArraySpec], params: dict, target: Target, knobs: Knobs) -> LaunchPlan:
    made = _plan(inputs, params, target, knobs)
    # The knob overlap_previous's auto: in captured graphs the launch overlaps the one before it where its blocks fit
    # one wave: G1 0.90-0.95 of the plain launch, the gate path 0.99-1.00, but G4 vocab 262144's two waves of
    # clusters 1.12 (H200, plans/perf-notes.md, "Thirtieth session").
    first = made.launches[0] if made.launches else None
    if first is not None and first.blocks <= first.blocks_per_sm * target.multiprocessors:
        return made.with_first_overlap(IN_GRAPHS)
    return made


def _plan(inputs: dict[str, ArraySpec], params: dict, target: Target, knobs: Knobs) -> LaunchPlan:
    logits = inputs["logits"]
    groups, depth, vocab = logits.shape
    V = int(params["k"])
    rows = groups * depth
    sfx = SUFFIX[logits.dtype]
    tensors = ("logits", "top_ids", "top_logp")
    if rows == 0:
        return LaunchPlan("topk", "empty", (), knobs=knobs)
    vt = small_vt(V, target)
    if vt is None:
        if knobs.gate and vocab % VECTOR_ELEMENTS[logits.dtype] == 0 and logits.alignment >= VECTOR_BYTES:
            capacity = gate_capacity(V, target)
            S, chunk = gate_splits(rows, vocab, V, capacity, target, knobs)
            ring = target.constant("kdt_topk_gate_f32_ring_bytes") if sfx == "f32" else 0   # bf16: registers
            threads = target.constant("kdt_topk_gate_threads")
            if S == 1:
                maxima = target.constant("kdt_topk_gate_bf16_maxima_bytes") if sfx == "bf16" else 0
                launch = KernelLaunch(f"kdt_topk_gate_{sfx}", (rows, 1, 1), threads,
                                      (*tensors, np.int32(vocab), np.int32(V), np.int32(capacity)),
                                      capacity * 8 + ring + maxima)
                facts = (("buffer entries", capacity), ("splits", 1),
                         ("gate from", "the row's vector maxima" if maxima else "the first step's vector maxima"))
                return LaunchPlan("topk", "gate", (launch,), facts=facts, knobs=knobs)
            workspace = _align256(rows * 4) + _align256(rows * S * 32) + rows * S * V * 8
            launch = KernelLaunch(f"kdt_topk_gate_split_{sfx}", (rows * S, 1, 1), threads,
                                  (*tensors, Workspace(), np.int32(vocab), np.int32(V), np.int32(capacity),
                                   np.int32(chunk), np.int32(S)), capacity * 8 + ring)
            return LaunchPlan("topk", "gate-split", (launch,), workspace,
                              (("buffer entries", capacity), ("splits", S), ("chunk", chunk)), knobs)
        launch = KernelLaunch(f"kdt_topk_general_{sfx}", (rows, 1, 1), target.constant("kdt_topk_general_threads"),
                              (*tensors, np.int32(vocab), np.int32(V)))
        return LaunchPlan("topk", "radix", (launch,), knobs=knobs)

    S, chunk = splits(rows, vocab, vt, target, knobs)
    threads = target.constant("kdt_topk_small_threads")
    stage_bytes = target.constant("kdt_topk_small_stage_bytes")
    if S >= knobs.cluster_min_splits:
        resident = resident_shape(rows, vocab, V, logits, target, knobs)
        if resident is not None:
            shape, blocks, smem = resident
            chunk = cluster_chunk(vocab, blocks)
            launch = KernelLaunch(f"kdt_topk_resident_{shape}_{sfx}", (rows * blocks, 1, 1),
                                  target.constant("kdt_topk_resident_threads"),
                                  (*tensors, np.int32(vocab), np.int32(V), np.int32(chunk)), smem, blocks)
            return LaunchPlan("topk", f"resident-{shape}", (launch,), facts=(("blocks per row", blocks),
                                                                             ("chunk", chunk)), knobs=knobs)
        blocks = target.constant("kdt_topk_cluster_size")
        chunk = cluster_chunk(vocab, blocks)
        launch = KernelLaunch(f"kdt_topk_cluster_{sfx}_v{vt}", (rows * blocks, 1, 1), threads,
                              (*tensors, NULL, np.int32(vocab), np.int32(V), np.int32(chunk), np.int32(blocks)),
                              stage_bytes, blocks)
        return LaunchPlan("topk", "cluster", (launch,), facts=(("VT", vt), ("blocks per row", blocks),
                                                               ("chunk", chunk)), knobs=knobs)
    workspace = _align256(rows * 4) + _align256(rows * S * 8) + rows * S * vt * 8 if S > 1 else 0
    launch = KernelLaunch(f"kdt_topk_small_{sfx}_v{vt}", (rows * S, 1, 1), threads,
                          (*tensors, Workspace() if workspace else NULL, np.int32(vocab), np.int32(V),
                           np.int32(chunk), np.int32(S)), stage_bytes)
    return LaunchPlan("topk", "small", (launch,), workspace, (("VT", vt), ("splits", S), ("chunk", chunk)), knobs)
