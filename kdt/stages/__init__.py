"""The stage registry: every module in this package that defines `SPEC` is a stage."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kdt.spec import StageSpec


class UnknownStage(KeyError):
    def __init__(self, name: str, known: list[str]):
        self.name, self.known = name, known
        super().__init__(name)

    def __str__(self) -> str:
        import difflib

        guess = difflib.get_close_matches(self.name.replace("_", "-"), self.known, n=1, cutoff=0.6)
        hint = f" (did you mean {guess[0]!r}?)" if guess else ""
        return f"kernel: expected one of {', '.join(self.known)} (or 'all'), got {self.name!r}{hint}"


@cache
def all_stages() -> tuple[StageSpec, ...]:
    specs = []
    from kdt.spec import StageSpec

    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if isinstance(getattr(module, "SPEC", None), StageSpec):
            specs.append(module.SPEC)
    return tuple(sorted(specs, key=lambda spec: spec.position))


def available() -> list[str]:
    """The stages' names from the modules' file names (tree_build.py -> tree-build), without importing them: cheap
    enough for help texts."""
    return sorted(info.name.replace("_", "-") for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))


def names() -> list[str]:
    return [spec.name for spec in all_stages()]


def get(name: str) -> StageSpec:
    for spec in all_stages():
        if spec.name == name:
            return spec
    raise UnknownStage(name, names())


def select(requested: list[str] | None) -> list[StageSpec]:
    """Stages named on a command line; none or 'all' means every stage."""
    if not requested or requested == ["all"]:
        return list(all_stages())
    return [get(name) for name in requested]
