"""What every launcher needs from the GPU side, in one place: a kernel module's exported launch constants
(read once per module) and the multiprocessor count (read once per device)."""

from __future__ import annotations

from typing import Iterable

# id(module) -> (module, constants); the module is kept so its id cannot be reused by another object.
_constants: dict[int, tuple[object, dict[str, int]]] = {}
_multiprocessors: dict[int, int] = {}


def is_capturing() -> bool:
    """Whether the current CuPy stream is capturing a CUDA graph (False where CuPy cannot tell)."""
    import cupy

    probe = getattr(cupy.cuda.get_current_stream(), "is_capturing", None)
    try:
        return bool(probe()) if probe is not None else False
    except Exception:  # an older CuPy or driver without the query
        return False


def kernel_constants(module, prefix: str, names: Iterable[str]) -> dict[str, int]:
    """`extern "C" __constant__ int <prefix><name>` of each name, as the kernel source defines them.

    The first call for a module copies them to the host, which a CUDA graph cannot capture: launch once
    before capturing (kdt's verify, bench and pipeline do)."""
    entry = _constants.get(id(module))
    if entry is not None and entry[0] is module:
        return entry[1]
    if is_capturing():
        raise RuntimeError(f"the first launch with a module reads its launch constants ({prefix}*) from the "
                           "device and cannot be graph-captured; launch once before capturing")
    import cupy

    values = {}
    for name in names:
        pointer = module.get_global(prefix + name)
        values[name] = int(cupy.ndarray((1,), dtype=cupy.int32, memptr=pointer).get()[0])
    _constants[id(module)] = (module, values)
    return values


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
