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
    with pytest.raises(TypeError, match="int16"):
        common._packed_arguments((np.int16(1),))
