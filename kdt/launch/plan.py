"""Launch plans: a stage's launches as plain data, made from shapes alone.

A launcher (`kdt/launch/<stage>.py`) is two things: `Knobs`, a frozen dataclass of the choices that tune a launch
(each with its default and a help text), and a pure function

    plan(inputs: dict[str, ArraySpec], params: dict, target: Target, knobs: Knobs) -> LaunchPlan

that needs no GPU: `kdt plan` prints it, tests assert on it, `kdt bench --sweep` varies its knobs, and
`kdt.launch.common.run_plan` launches it. A plan depends on the shapes, dtypes and alignment of the inputs, the
stage's scalar parameters, the target (arch, multiprocessor count, the constants its cubin exports) and the knobs,
never on device data, so a launch is the same on every call and can be captured in a CUDA graph.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from kdt.refs.errors import BadInput

NULL = np.uint64(0)   # a null pointer argument (a buffer the launch never touches)
IN_GRAPHS = "in graphs"   # a launch that overlaps the one before it only while its stream is captured (KernelLaunch)


@dataclass(frozen=True)
class ArraySpec:
    """What a plan may know of an array: its shape, its dtype (a numpy name or "bfloat16") and the largest power
    of two (up to 256) that divides its address."""

    shape: tuple[int, ...]
    dtype: str
    alignment: int = 256


def address_alignment(address: int) -> int:
    """The largest power of two, up to 256, that divides `address`: an ArraySpec's alignment."""
    return 256 if address % 256 == 0 else address & -address


@dataclass(frozen=True)
class Target:
    """The GPU a plan is for: the arch its cubin was built for, its multiprocessor count and the launch constants
    the cubin exports (`extern "C" __constant__ int kdt_*`, read from the cubin by `kdt build`)."""

    arch: str
    multiprocessors: int
    constants: tuple[tuple[str, int], ...]

    @classmethod
    def make(cls, arch: str, multiprocessors: int, constants: Mapping[str, int]) -> "Target":
        return cls(arch, int(multiprocessors), tuple(sorted((str(k), int(v)) for k, v in constants.items())))

    def constant(self, name: str) -> int:
        for key, value in self.constants:
            if key == name:
                return value
        raise KeyError(f"the {self.arch} cubin exports no constant {name!r}: rebuild it (kdt build --force)")


@dataclass(frozen=True)
class Workspace:
    """A pointer `offset` bytes into the launch's workspace."""

    offset: int = 0


@dataclass(frozen=True)
class TensorMap:
    """A tensor map (the driver's CUtensorMap, 128 bytes, passed by value) of the bf16 array named `array`, seen as
    2D: [rows, cols], cols its last dimension and rows all the others. The tensor-copy engine moves one box of
    box_rows x box_cols elements a copy into shared memory with the 128-byte swizzle (so box_cols * 2 bytes is
    128 at most). `encode` False passes 128 zero bytes (a kernel told not to use the map). Made at launch from the
    array's address (kdt/launch/tensor_map.py)."""

    array: str
    box_rows: int
    box_cols: int
    encode: bool = True

    SIZE = 128


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch. `args` are, in order: input or output names (their device pointers), `Workspace`
    pointers, `NULL`, numpy scalars (np.int32, np.float32) passed as they are, and `TensorMap`s."""

    function: str
    grid: tuple[int, int, int]
    block: int
    args: tuple
    dynamic_smem: int = 0
    cluster: int = 1                  # blocks per cluster (compiled into the entry point with __cluster_dims__)
    blocks_per_sm: int = 1            # blocks the plan needs resident on one multiprocessor together (its waves
                                      # count on them; kdt.limits holds the arch's shared memory, threads and
                                      # registers to it)
    overlaps_previous: bool = False   # programmatic dependent launch: its blocks may start while the launch before
                                      # it in the stream ends; the kernel waits (griddepcontrol.wait) before it
                                      # reads what that launch wrote
    overlaps_previous_in_graphs: bool = False   # the same, only while the stream is being captured into a CUDA
                                                # graph (run_plan asks the stream): a replay pays no host time for
                                                # it, an eager call keeps the plain launch

    @property
    def overlap(self) -> bool | str:
        """How the launch overlaps the one before it: True, False or "in graphs" (printed by `kdt plan`)."""
        if self.overlaps_previous_in_graphs and not self.overlaps_previous:
            return IN_GRAPHS
        return self.overlaps_previous

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def arg_sizes(self) -> tuple[int, ...]:
        """The byte size of each argument as launched: what the entry point's parameters must be (kdt.limits checks
        them against the cubin's), or the driver reads past the argument array."""
        return tuple(_arg_size(arg) for arg in self.args)


@dataclass(frozen=True)
class LaunchPlan:
    """Everything one call of a stage launches, in order, and what it needs."""

    stage: str
    path: str                                  # which algorithm path, in the launcher's words
    launches: tuple[KernelLaunch, ...]
    workspace_bytes: int = 0
    facts: tuple[tuple[str, object], ...] = ()  # the plan's derived numbers (splits, chunk, ...), for printing
    knobs: object = None                       # the Knobs it was made with

    def fact(self, name: str):
        return dict(self.facts)[name]

    def with_first_overlap(self, overlap: bool | str) -> LaunchPlan:
        """This plan with its first launch overlapping the launch before it in the stream: True always, IN_GRAPHS
        while the stream is being captured, False never (the knob `overlap_previous`, or a launcher's choice); the
        launches after it keep what their launcher chose."""
        if not self.launches:
            return self
        first = dataclasses.replace(self.launches[0], overlaps_previous=overlap is True,
                                    overlaps_previous_in_graphs=overlap == IN_GRAPHS)
        return dataclasses.replace(self, launches=(first, *self.launches[1:]))

    def rows(self) -> list[dict]:
        """One printable dict per launch."""
        return [{"function": k.function, "grid": "x".join(map(str, k.grid)), "block": k.block,
                 "cluster": k.cluster, "blocks/SM": k.blocks_per_sm, "dynamic smem B": k.dynamic_smem,
                 "overlaps previous": k.overlap, "args": ", ".join(_describe(arg) for arg in k.args)}
                for k in self.launches]

    def as_json(self) -> dict:
        return {"stage": self.stage, "path": self.path, "workspace_bytes": self.workspace_bytes,
                "facts": {key: value for key, value in self.facts},
                "knobs": dataclasses.asdict(self.knobs) if self.knobs is not None else {},
                "launches": [{"function": k.function, "grid": list(k.grid), "block": k.block, "cluster": k.cluster,
                              "blocks_per_sm": k.blocks_per_sm, "dynamic_smem": k.dynamic_smem,
                              "overlaps_previous": k.overlap, "args": [_describe(arg) for arg in k.args]}
                             for k in self.launches]}


def _arg_size(arg) -> int:
    if isinstance(arg, (str, Workspace)):
        return 8                  # a device pointer
    if isinstance(arg, np.generic):
        return arg.itemsize       # NULL (a np.uint64) and the scalars, passed as they are
    if isinstance(arg, TensorMap):
        return TensorMap.SIZE
    raise TypeError(f"a launch argument of type {type(arg).__name__} ({arg!r}): expected an input or output name, "
                    "a Workspace, NULL, a numpy scalar or a TensorMap")


def _describe(arg) -> str:
    if isinstance(arg, str):
        return arg
    if isinstance(arg, Workspace):
        return f"workspace+{arg.offset}"
    if isinstance(arg, np.uint64) and arg == NULL:
        return "null"
    if isinstance(arg, TensorMap):
        return f"tensor map of {arg.array} ({arg.box_rows} x {arg.box_cols} boxes)" if arg.encode else "no tensor map"
    return repr(arg.item() if isinstance(arg, np.generic) else arg)


def knob_help(knobs_type) -> dict[str, str]:
    """Knob name -> its help text (the field's metadata) and default."""
    return {f.name: f"{f.metadata.get('help', '')} (default {f.default!r})" for f in dataclasses.fields(knobs_type)}


def knob(default, help: str):
    """A knob field: its default and what it changes."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class LaunchKnobs:
    """The knobs every stage has: each launcher's Knobs derives from this, and kdt.ops applies them to its plan."""

    overlap_previous: bool | None = knob(
        None, "the plan's first kernel by programmatic dependent launch: its blocks start while the launch before it "
              "in the stream ends, and wait for that launch before touching memory (every kdt entry point waits, "
              "then lets the next launch in). None (auto): the launcher's choice, which is to overlap only while the "
              "stream is captured into a CUDA graph (eager calls keep the plain launch, which costs less host time) "
              "and only where it measured faster so: `kdt plan` prints 'in graphs' there")


def make_knobs(knobs_type, overrides: Mapping[str, object] | None, argument: str = "knobs"):
    """`knobs_type` with `overrides` applied. Values may be strings (from the command line): they are converted to
    the field's type. An unknown name or a value of the wrong type is BadInput naming `argument`."""
    if not overrides:
        return knobs_type()
    fields = {f.name: f for f in dataclasses.fields(knobs_type)}
    hints = typing.get_type_hints(knobs_type)
    values = {}
    for name, value in overrides.items():
        if name not in fields:
            raise BadInput(argument, f"a knob of this stage ({', '.join(fields) or 'it has none'})", name)
        values[name] = _convert(hints[name], value, f"{argument} {name}")
    return knobs_type(**values)


def _convert(hint, value, argument: str):
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if isinstance(value, str):
        text = value.strip()
        if type(None) in options and text.lower() in ("none", "auto", ""):
            return None
        for option in options:
            try:
                if option is bool:
                    if text.lower() in ("1", "true", "yes", "on"):
                        return True
                    if text.lower() in ("0", "false", "no", "off"):
                        return False
                    continue
                if option is int:
                    return int(text, 0)
                if option is float:
                    return float(text)
                if option is str:
                    return text
            except ValueError:
                continue
        raise BadInput(argument, " or ".join(getattr(o, "__name__", str(o)) for o in options), value)
    if value is None and type(None) in options:
        return None
    for option in options:
        if option is not type(None) and isinstance(value, option) and not (option is int and isinstance(value, bool)):
            return value
    if int in options and isinstance(value, np.integer):
        return int(value)
    if float in options and isinstance(value, (int, np.integer, np.floating)) and not isinstance(value, bool):
        return float(value)                     # a whole number where a fraction is asked for, as Python allows
    raise BadInput(argument, " or ".join(getattr(o, "__name__", str(o)) for o in options), value)


def parse_knob_options(items: list[str] | None, argument: str = "--knob") -> dict[str, str]:
    """`["name=value", ...]` from the command line -> {name: value} (BadInput for an item without '=')."""
    knobs = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise BadInput(argument, "NAME=VALUE", item)
        knobs[name.strip()] = value.strip()
    return knobs


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
