"""What a stage is, as plain data: its inputs, parameters, outputs with their comparison policy, its
reference, its golden cases. Each stage module in `kdt/stages/` defines one `SPEC`; nothing else in kdt
names a stage, so a fifth stage is a new module there plus its reference, kernel and launcher."""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, Iterator, Protocol

import numpy as np

from kdt.refs.errors import BadInput

Shapes = dict[str, tuple[int, ...]]
Arrays = dict[str, np.ndarray]
Params = dict[str, object]

DEFAULT_BENCH_SET = "default"   # the set `bench_shapes` makes: what kdt bench / plan / profile run without --set


class Policy(Protocol):
    def describe(self) -> str: ...

    def compare(self, name: str, expected: np.ndarray, got: np.ndarray, max_diffs: int = 10): ...


@dataclass(frozen=True)
class Case:
    """One golden case: named, described, seeded, with its scalar parameters and its input arrays."""

    name: str
    description: str
    seed: int
    params: Params
    inputs: Arrays
    redrawn: int = 0   # a generator's draws redrawn off a knife's edge (stages with decision margins; kdt fuzz counts)


@dataclass(frozen=True)
class OutputLayout:
    shape: tuple[int, ...]
    dtype: str  # a numpy dtype name, or "bfloat16"


@dataclass(frozen=True)
class StageSpec:
    name: str                                   # the contract's kernel name, e.g. "tree-build"
    position: int                               # order in the speculative step (listing order)
    params: tuple[str, ...]                     # scalar case attributes the reference and kernel take
    inputs: tuple[str, ...]                     # every input name the stage knows (some may be optional)
    outputs: dict[str, Policy]                  # output name -> comparison policy, in contract order
    reference_module: ModuleType                # refs/<stage>.py, hashed into the golden file
    run_reference: Callable[[Arrays, Params], Arrays]
    make_cases: Callable[[], list[Case]]
    output_layout: Callable[[Shapes, Params], dict[str, OutputLayout]]
    check_layout: Callable[[Shapes, dict[str, str], Params], None]  # the contract's shapes, dtypes and limits
    description: str = ""
    random_case: Callable[[np.random.Generator], Case] | None = None  # fresh inputs of random shape (tests, fuzz)
    shrink: Callable[[Case], Iterator[Case]] | None = None   # smaller variants of a failing case (fuzz)
    bench_shapes: Callable[[bool], list] | None = None      # (quick) -> [kdt.bench.BenchShape]: the default set
    # more named sets of bench shapes (kdt bench / plan / profile --set NAME), each (quick) -> [BenchShape]
    bench_sets: dict[str, Callable[[bool], list]] = field(default_factory=dict)
    torch_baseline: Callable[[dict, Params], Callable[[], object]] | None = None  # the obvious PyTorch version
    # the kernel's own limits beyond the contract's (a supported head dim, a grid bound), checked by kdt.ops after
    # check_layout and before any launch; the references take everything the contract allows
    check_launch: Callable[[Shapes, dict[str, str], Params], None] | None = None

    @property
    def module_name(self) -> str:
        """`tree-build` -> `tree_build`: the kernel source, launcher and test file stem."""
        return self.name.replace("-", "_")

    def bench_set_names(self) -> list[str]:
        return ([DEFAULT_BENCH_SET] if self.bench_shapes is not None else []) + list(self.bench_sets)

    def bench_set(self, name: str, quick: bool = False) -> list:
        """The bench shapes of set `name` (--quick: its headline shapes); BadInput naming --set for a set this stage
        does not declare."""
        if name == DEFAULT_BENCH_SET and self.bench_shapes is not None:
            return self.bench_shapes(quick)
        if name not in self.bench_sets:
            known = ", ".join(self.bench_set_names()) or "none (the stage has no bench shapes)"
            raise BadInput("--set", f"a bench shape set of {self.name}: {known}", repr(name))
        return self.bench_sets[name](quick)

    def every_bench_shape(self) -> list:
        """Every shape of every set, once (by name): what kdt build holds to the arch's limits and the plan tests
        check."""
        shapes = {}
        for name in self.bench_set_names():
            for shape in self.bench_set(name):
                shapes.setdefault(shape.name, shape)
        return list(shapes.values())

    def reference_digest(self) -> str:
        source = inspect.getsource(self.reference_module).encode()
        return "sha256:" + hashlib.sha256(source).hexdigest()

    def reference(self, inputs: Arrays, params: Params) -> Arrays:
        return self.run_reference(inputs, {name: params[name] for name in self.params})
