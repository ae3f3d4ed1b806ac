"""kdt.launch.common's own driver call (cuLaunchKernelEx, for programmatic dependent launch): its ctypes structures
must lay out as cuda.h's, or the driver reads another grid, stream or attribute. Checked against the header of the
toolkit present, by a host program nvcc compiles."""

from __future__ import annotations

import ctypes
import subprocess

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
