"""kdt.launch.common's own driver call (cuLaunchKernelEx, for programmatic dependent launch): its ctypes structures
must lay out as cuda.h's, or the driver reads another grid, stream or attribute. Checked against the header of the
toolkit present, by a host program nvcc compiles."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import types

import numpy as np

import pytest

from kdt.launch import common

PROBE = r"""
#include <cstddef>
#include <cstdio>
#include <cuda.h>
int main() {
    std::printf("%zu %zu %zu %zu %zu %zu %zu %d\n", sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value),
                sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, sharedMemBytes), offsetof(CUlaunchConfig, hStream),
                offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs),
                (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
    return 0;
}
"""


@pytest.mark.nvcc
def test_launch_structures_match_cuda_h(tmp_path):
    from kdt.toolkit import find_nvcc

    nvcc = find_nvcc()
    source, binary = tmp_path / "probe.cpp", tmp_path / "probe"
    source.write_text(PROBE)
    subprocess.run([str(nvcc.path), "-x", "c++", str(source), "-o", str(binary)], check=True, capture_output=True,
                   timeout=120)
    header = [int(word) for word in subprocess.run([str(binary)], check=True, capture_output=True, text=True,
                                                   timeout=30).stdout.split()]
    config = common._LaunchConfig
    ours = [ctypes.sizeof(common._LaunchAttribute), common._LaunchAttribute.value.offset, ctypes.sizeof(config),
            config.shared_mem.offset, config.stream.offset, config.attrs.offset, config.num_attrs.offset,
            common.PROGRAMMATIC_STREAM_SERIALIZATION]
    assert ours == header


def test_packed_arguments_put_each_one_where_its_pointer_says():
    """What the driver copies into the kernel's parameters: each argument's bytes at the address its pointer holds
    (a device pointer, and numpy scalars of every type the plans pass), the buffer kept alive with them."""
    array = types.SimpleNamespace(data=types.SimpleNamespace(ptr=0x7F00_1234_5678))
    args = (array, np.int32(-3), np.float32(0.5), np.uint64(2**63 + 5), np.uint32(7), np.int64(-(2**40)),
            np.float64(1.25), array)
    buffer, pointers = common._packed_arguments(args)
    assert len(pointers) == len(args)
    for arg, pointer in zip(args, pointers):
        got = ctypes.string_at(pointer, 8)
        expected = arg.tobytes() if isinstance(arg, np.generic) else arg.data.ptr.to_bytes(8, sys.byteorder)
        assert got[:len(expected)] == expected, (arg, got)
    assert ctypes.addressof(buffer) == pointers[0]
    assert len(common._packed_arguments(())[1]) == 1   # the driver reads no parameter, but the array exists
    # a tensor map's 128 bytes between 8-byte slots, each where its pointer says
    tensor_map = bytes(range(128))
    buffer, pointers = common._packed_arguments((np.int32(5), tensor_map, np.int32(6), array))
    assert [ctypes.string_at(pointer, n) for pointer, n in zip(pointers, (4, 128, 4, 8))] == [
        np.int32(5).tobytes(), tensor_map, np.int32(6).tobytes(), array.data.ptr.to_bytes(8, sys.byteorder)]
    with pytest.raises(TypeError, match="int16"):
        common._packed_arguments((np.int16(1),))


def test_a_launch_keeps_its_buffer_and_packs_each_calls_arguments(monkeypatch):
    """cuLaunchKernelEx's arguments and config are built once a launch (per thread) and refilled each call: the
    driver must read this call's pointers, scalars, tensor map and stream, with the attribute only when it
    overlaps."""
    from kdt.launch.plan import KernelLaunch

    seen = []

    def driver(config, function, params, extra):
        config = config._obj
        seen.append((function, config.stream, config.num_attrs, ctypes.string_at(params[0], 8),
                     ctypes.string_at(params[1], 128), ctypes.string_at(params[2], 4)))
        return 0

    monkeypatch.setattr(common, "_launch_kernel_ex", lambda: driver)
    monkeypatch.setattr(common, "_prepared", __import__("threading").local())
    launch = KernelLaunch("f", (2, 1, 3), 64, ())
    function = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=99))
    pointer = lambda value: types.SimpleNamespace(data=types.SimpleNamespace(ptr=value))
    for value, stream, overlaps in ((0x1000, 7, False), (0x2000, 8, False), (0x3000, 9, True)):
        common._launch_ex(function, launch, (pointer(value), bytes([value >> 12]) * 128, np.int32(value)),
                          types.SimpleNamespace(ptr=stream), overlaps)
    assert seen == [(99, stream, int(overlaps), value.to_bytes(8, sys.byteorder), bytes([value >> 12]) * 128,
                     np.int32(value).tobytes()) for value, stream, overlaps in
                    ((0x1000, 7, False), (0x2000, 8, False), (0x3000, 9, True))]
    assert len(common._prepared.launches) == 2          # one entry per launch and overlap, reused


def test_run_plan_overlaps_in_graphs_only_while_the_stream_is_captured(monkeypatch):
    """A launch that overlaps "in graphs" goes through cuLaunchKernelEx while its stream is being captured and
    through the plain call otherwise; one that always overlaps does so either way; the stream is asked once a
    plan, and only when a launch depends on the answer."""
    from kdt.launch.plan import KernelLaunch, LaunchPlan

    calls, asked = [], []
    monkeypatch.setattr(common, "kernel_function", lambda module, launch: launch.function)
    monkeypatch.setattr(common, "_launch_ex", lambda function, launch, args, stream, overlaps: calls.append(
        (function.name, "overlapping" if overlaps else "driver")))

    class Plain:
        def __init__(self, name):
            self.name = name

        def __call__(self, grid, block, args, shared_mem, stream):
            calls.append((self.name, "plain"))

    def plan(*launches):
        return LaunchPlan("stage", "path", tuple(KernelLaunch(Plain(name), (1, 1, 1), 32, (), **how)
                                                 for name, how in launches))

    in_graphs = ("first", {"overlaps_previous_in_graphs": True})
    always = ("second", {"overlaps_previous": True})
    never = ("third", {})
    class Stream:
        def __init__(self, capturing):
            self.capturing = capturing

        def is_capturing(self):
            asked.append("stream")
            return self.capturing

    for capturing in (True, False):
        calls.clear(), asked.clear()
        common.run_plan(None, plan(in_graphs, always, never, in_graphs), {}, None, Stream(capturing))
        how = "overlapping" if capturing else "plain"
        assert calls == [
            ("first", how), ("second", "overlapping"), ("third", "plain"), ("first", how)]
        assert asked == ["stream"]
    asked.clear()
    common.run_plan(None, plan(always, never), {}, None, Stream(True))
    assert asked == []


def test_run_plan_passes_tensor_maps_by_the_driver_call(monkeypatch):
    """A launch with a TensorMap argument goes through cuLaunchKernelEx (CuPy's call passes no 128-byte struct),
    without programmatic serialization unless the launch overlaps, the map's bytes made from the named array."""
    from kdt.launch.plan import KernelLaunch, LaunchPlan, TensorMap

    calls = []
    monkeypatch.setattr(common, "kernel_function", lambda module, launch: launch.function)
    monkeypatch.setattr(common, "_tensor_map", lambda arg, arrays: bytes([len(arrays[arg.array])]) * 128)
    monkeypatch.setattr(common, "_launch_ex", lambda function, launch, args, stream, overlaps: calls.append(
        (function, args, overlaps)))
    args = (np.int32(1), TensorMap("keys", 64, 64), np.int32(2))
    plan = LaunchPlan("stage", "path", (KernelLaunch("mapped", (1, 1, 1), 32, args),
                                        KernelLaunch("mapped_overlapping", (1, 1, 1), 32, args,
                                                     overlaps_previous=True)))
    common.run_plan(None, plan, {"keys": [0, 0, 0]}, None, None)
    assert calls == [("mapped", (np.int32(1), bytes([3]) * 128, np.int32(2)), False),
                     ("mapped_overlapping", (np.int32(1), bytes([3]) * 128, np.int32(2)), True)]


@pytest.mark.gpu
def test_auto_overlaps_tree_build_in_a_captured_graph_and_not_eagerly(monkeypatch):
    """The knob's auto on a real stream: tree-build (which overlaps in graphs) goes through cuLaunchKernelEx while
    captured, and through the plain launch eagerly; the graph's replay gives the eager call's outputs."""
    import cupy

    from kdt import ops

    overlapped = []
    real = common._launch_ex
    monkeypatch.setattr(common, "_launch_ex",
                        lambda *args: (args[4] and overlapped.append(args[1].function)) or real(*args))
    rng = np.random.default_rng(3)
    logp = -np.sort(rng.exponential(1.0, (2, 15, 8)).astype(np.float32), axis=-1)
    top_logp, top_ids = cupy.asarray(logp), cupy.asarray(rng.integers(0, 1000, logp.shape, dtype=np.int32))
    eager = ops.tree_build(top_logp, top_ids, 63)
    out = ops.tree_build(top_logp, top_ids, 63)
    assert overlapped == []
    for array in out._asdict().values():   # poisoned: the replay must write every output
        array.view(cupy.int32).fill(-7)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        ops.tree_build(top_logp, top_ids, 63, out=out)
        graph = stream.end_capture()
    assert overlapped == ["kdt_tree_build_p2"]
    graph.launch(stream)
    stream.synchronize()
    for name, array in eager._asdict().items():
        assert cupy.array_equal(array, getattr(out, name)), name
