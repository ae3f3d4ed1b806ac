"""What every launcher needs from the GPU side, in one place: a kernel module's exported launch constants
(read once per module) and the multiprocessor count (read once per device)."""

from __future__ import annotations

from typing import Iterable

# id(module) -> (module, what the launchers keep for it); the module is kept so its id cannot be reused.
_per_module: dict[int, tuple[object, dict]] = {}
_multiprocessors: dict[int, int] = {}


def is_capturing() -> bool:
    """Whether the current CuPy stream is capturing a CUDA graph (False where CuPy cannot tell)."""
    import cupy

    probe = getattr(cupy.cuda.get_current_stream(), "is_capturing", None)
    try:
        return bool(probe()) if probe is not None else False
    except Exception:  # an older CuPy or driver without the query
        return False


def module_cache(module) -> dict:
    """A dict for what a launcher reads once per loaded module (constants, functions): it lives as long as
    `module` does."""
    entry = _per_module.get(id(module))
    if entry is None or entry[0] is not module:
        entry = _per_module[id(module)] = (module, {})
    return entry[1]


def kernel_constants(module, prefix: str, names: Iterable[str]) -> dict[str, int]:
    """`extern "C" __constant__ int <prefix><name>` of each name, as the kernel source defines them.

    The first call for a module copies them to the host, which a CUDA graph cannot capture: launch once
    before capturing (kdt's verify, bench and pipeline do)."""
    names = tuple(names)
    cache = module_cache(module)
    key = ("constants", prefix, names)
    if key in cache:
        return cache[key]
    if is_capturing():
        raise RuntimeError(f"the first launch with a module reads its launch constants ({prefix}*) from the "
                           "device and cannot be graph-captured; launch once before capturing")
    import cupy

    values = {}
    for name in names:
        pointer = module.get_global(prefix + name)
        values[name] = int(cupy.ndarray((1,), dtype=cupy.int32, memptr=pointer).get()[0])
    cache[key] = values
    return values


def kernel_function(module, name: str, dynamic_smem: int = 0, attributes: dict[int, int] | None = None):
    """`module.get_function(name)`, fetched once per module, and allowed `dynamic_smem` bytes of dynamic
    shared memory: the opt-in is a driver call, made only when a launch needs more than any before.
    `attributes` (CUfunction_attribute -> value) are set once, when the function is first fetched."""
    functions = module_cache(module).setdefault("functions", {})
    slot = functions.get(name)
    if slot is None:
        function = module.get_function(name)
        if attributes:
            import cupy

            handle = function.kernel.ptr   # the CUfunction behind CuPy's RawKernel
            for attribute, value in attributes.items():
                cupy.cuda.driver.funcSetAttribute(handle, attribute, value)
        slot = functions[name] = [function, 0]
    if dynamic_smem > slot[1]:
        slot[0].max_dynamic_shared_size_bytes = dynamic_smem
        slot[1] = dynamic_smem
    return slot[0]


def sm_count(default: int | None = None) -> int:
    """Multiprocessors of the current GPU; `default` where there is no CuPy or GPU (sizing offline)."""
    try:
        import cupy

        device = cupy.cuda.Device()
        if device.id not in _multiprocessors:
            _multiprocessors[device.id] = int(device.attributes["MultiProcessorCount"])
        return _multiprocessors[device.id]
    except Exception:
        if default is None:
            raise
        return default
