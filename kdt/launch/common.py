"""Launching a plan: the one place where kdt calls a kernel function (kdt/launch/plan.py says what a plan is)."""

from __future__ import annotations

from typing import Mapping

from kdt.launch.plan import KernelLaunch, LaunchPlan, Workspace

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
    for launch in plan.launches:
        args = tuple(arrays[arg] if isinstance(arg, str) else workspace[arg.offset:] if isinstance(arg, Workspace)
                     else arg for arg in launch.args)
        kernel_function(module, launch)(launch.grid, (launch.block, 1, 1), args, shared_mem=launch.dynamic_smem,
                                        stream=stream)
