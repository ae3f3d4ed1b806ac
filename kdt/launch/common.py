"""Launching a plan: the one place where kdt calls a kernel function (kdt/launch/plan.py says what a plan is)."""

from __future__ import annotations

import ctypes
import functools
import struct
import threading
from typing import Mapping

import numpy as np

from kdt.launch.plan import KernelLaunch, LaunchPlan, TensorMap, Workspace
from kdt.launch.tensor_map import tensor_map_bytes

PORTABLE_CLUSTER = 8                          # larger clusters need the function's non-portable opt-in
NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14        # CUfunction_attribute

# id(module) -> (module, {function name: [function, dynamic smem allowed]}); the module is kept so its id cannot be
# reused while the entry lives.
_functions: dict[int, tuple[object, dict]] = {}


def kernel_function(module, launch: KernelLaunch):
    """`module.get_function`, fetched once per module, opted into the cluster size and the dynamic shared memory
    the launch needs (driver calls, made only the first time a function needs more than before)."""
    entry = _functions.get(id(module))
    if entry is None or entry[0] is not module:
        entry = _functions[id(module)] = (module, {})
    slot = entry[1].get(launch.function)
    if slot is None:
        function = module.get_function(launch.function)
        if launch.cluster > PORTABLE_CLUSTER:
            import cupy

            cupy.cuda.driver.funcSetAttribute(function.kernel.ptr, NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        slot = entry[1][launch.function] = [function, 0]
    if launch.dynamic_smem > slot[1]:
        slot[0].max_dynamic_shared_size_bytes = launch.dynamic_smem
        slot[1] = launch.dynamic_smem
    return slot[0]


def run_plan(module, plan: LaunchPlan, arrays: Mapping[str, object], workspace, stream) -> None:
    """Launch every kernel of `plan` on `stream`, its array arguments taken from `arrays` (inputs and outputs by
    name, CuPy) and `workspace` (a CuPy uint8 array of at least plan.workspace_bytes, or None when it needs none).
    No allocation, no synchronisation, no host read of device data: capturable in a CUDA graph."""
    capturing = None   # asked of the stream once, and only by a launch that overlaps in graphs alone
    for launch in plan.launches:
        # a workspace pointer goes as its 8 bytes, as NULL does: what a slice of the workspace would pass, without
        # building a CuPy array for it; a tensor map as its 128 bytes
        args = tuple([arrays[arg] if isinstance(arg, str) else
                      np.uint64(workspace.data.ptr + arg.offset) if isinstance(arg, Workspace) else
                      _tensor_map(arg, arrays) if isinstance(arg, TensorMap) else arg
                      for arg in launch.args])
        function = kernel_function(module, launch)
        overlaps = launch.overlaps_previous
        if launch.overlaps_previous_in_graphs and not overlaps:
            capturing = stream.is_capturing() if capturing is None else capturing   # a CuPy stream
            overlaps = capturing
        if overlaps or any(isinstance(arg, bytes) for arg in args):   # CuPy's call passes no 128-byte struct
            _launch_ex(function, launch, args, stream, overlaps)
        else:
            function(launch.grid, (launch.block, 1, 1), args, shared_mem=launch.dynamic_smem, stream=stream)


def _tensor_map(arg: TensorMap, arrays: Mapping[str, object]) -> bytes:
    return tensor_map_bytes(arg, arrays[arg.array])


PROGRAMMATIC_STREAM_SERIALIZATION = 6         # CUlaunchAttributeID (cuda.h)


class _LaunchAttribute(ctypes.Structure):     # CUlaunchAttribute: the id, padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int32 * 16)]


class _LaunchConfig(ctypes.Structure):        # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("shared_mem", ctypes.c_uint32),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)),
                ("num_attrs", ctypes.c_uint32)]


@functools.cache
def _launch_kernel_ex():
    """The driver's cuLaunchKernelEx (CUDA 12.0+), which CuPy's kernel call does not expose."""
    function = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                         ctypes.c_void_p]
    return function


@functools.cache
def _programmatic_serialization():
    """A pointer to the launch attribute that lets a launch overlap the previous one (the driver only reads it, so
    every launch shares it)."""
    attribute = _LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
    attribute.value[0] = 1
    return ctypes.pointer(attribute)


# struct format of one argument in its 8-byte slot, native byte order: a device pointer, or a numpy scalar by type
_POINTER_SLOT = "Q"
_SCALAR_SLOTS = {np.int32: "i4x", np.uint32: "I4x", np.float32: "f4x", np.int64: "q", np.uint64: "Q",
                 np.float64: "d"}


def _arguments_layout(args: tuple) -> tuple[str, tuple[int, ...]]:
    """The struct format of `args` packed one after another (an array's device pointer or a numpy scalar in its own
    8-byte slot, a tensor map's bytes in a slot of their size), and each one's offset in it."""
    layout, offsets, offset = "=", [], 0
    for arg in args:
        offsets.append(offset)
        if isinstance(arg, bytes):
            layout += f"{len(arg)}s"
            offset += len(arg)
            continue
        if isinstance(arg, np.generic):
            slot = _SCALAR_SLOTS.get(type(arg))
            if slot is None:   # a launcher's mistake: plans pass these types only
                raise TypeError(f"a kernel argument of type {type(arg).__name__}: expected one of "
                                f"{', '.join(t.__name__ for t in _SCALAR_SLOTS)}, a device array or a tensor map")
            layout += slot
        else:
            layout += _POINTER_SLOT
        offset += 8
    return layout, tuple(offsets)


def _argument_values(args: tuple) -> list:
    return [arg if isinstance(arg, (bytes, np.generic)) else arg.data.ptr for arg in args]


def _argument_buffer(layout: str, offsets: tuple[int, ...]) -> tuple[ctypes.Array, ctypes.Array]:
    """(a buffer for arguments packed as `layout`, the array of pointers into it that the driver reads them
    through)."""
    buffer = ctypes.create_string_buffer(max(1, struct.calcsize(layout)))
    base = ctypes.addressof(buffer)
    return buffer, (ctypes.c_void_p * max(1, len(offsets)))(*(base + at for at in offsets))


def _packed_arguments(args: tuple) -> tuple[ctypes.Array, ctypes.Array]:
    """`args` in their buffer, packed by one struct.pack_into: the bytes of each argument apart, and a cast each,
    took twice the host time."""
    layout, offsets = _arguments_layout(args)
    buffer, params = _argument_buffer(layout, offsets)
    struct.pack_into(layout, buffer, 0, *_argument_values(args))
    return buffer, params


# per thread: (id(launch), overlaps) -> (launch, format, argument buffer, pointers into it, launch config). A launch
# (plans are cached, so the same objects come back) keeps its buffer and config, and a call only packs the
# arguments into it and sets the stream: building them each call took half the host time of an eager call.
_prepared = threading.local()
_PREPARED_MOST = 256


def _launch_ex(function, launch: KernelLaunch, args: tuple, stream, overlaps: bool) -> None:
    """`function` launched by cuLaunchKernelEx, with programmatic stream serialization where `overlaps` (see
    KernelLaunch.overlaps_previous)."""
    cache = getattr(_prepared, "launches", None)
    if cache is None:
        cache = _prepared.launches = {}
    entry = cache.get((id(launch), overlaps))
    if entry is None or entry[0] is not launch:
        if len(cache) >= _PREPARED_MOST:
            cache.clear()
        layout, offsets = _arguments_layout(args)
        buffer, params = _argument_buffer(layout, offsets)
        config = _LaunchConfig(grid=(ctypes.c_uint32 * 3)(*launch.grid),
                               block=(ctypes.c_uint32 * 3)(launch.block, 1, 1), shared_mem=launch.dynamic_smem,
                               attrs=_programmatic_serialization() if overlaps else None,
                               num_attrs=1 if overlaps else 0)
        entry = cache[(id(launch), overlaps)] = (launch, layout, buffer, params, config)
    _, layout, buffer, params, config = entry
    struct.pack_into(layout, buffer, 0, *_argument_values(args))   # the driver copies them during the call
    config.stream = stream.ptr
    result = _launch_kernel_ex()(ctypes.byref(config), function.kernel.ptr, params, None)
    if result != 0:
        raise RuntimeError(f"cuLaunchKernelEx of {launch.function} failed: CUresult {result}")
