"""A kernel's SASS for the compile tests: nvdisasm's listing of its cubin, split into sections (an entry point and the
functions it calls)."""

from __future__ import annotations

import subprocess

from kdt import build, toolkit


def sections(kernel: str, arch: str) -> dict[str, list[str]]:
    """Each entry point of `kernel`'s cubin for `arch` -> its section's instructions in address order (the text after
    the address, predicate included). The functions an entry calls are in its section."""
    nvdisasm = toolkit.find_cuda_tool("nvdisasm")
    assert nvdisasm is not None, "nvdisasm (the test extra's nvidia-cuda-nvdisasm) not found"
    result = build.build(kernel, arch)
    listing = subprocess.run([str(nvdisasm), "-c", str(result.cubin)], capture_output=True, text=True, check=True)
    found: dict[str, list[str]] = {}
    entry = None
    for line in listing.stdout.splitlines():
        if line.startswith("//----") and ".text." in line:
            entry = line.split(".text.", 1)[1].split()[0]
            found[entry] = []
        elif entry and line.lstrip().startswith("/*") and "*/" in line:
            found[entry].append(line.split("*/", 1)[1].strip())
    return found
