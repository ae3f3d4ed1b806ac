"""The stage registry: every module in this package that defines `SPEC` is a stage."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from kdt.spec import StageSpec


class UnknownStage(KeyError):
    def __init__(self, name: str, known: list[str]):
        self.name, self.known = name, known
        super().__init__(name)

    def __str__(self) -> str:
        return f"kernel: expected one of {', '.join(self.known)} (or 'all'), got {self.name!r}"


@cache
def all_stages() -> tuple[StageSpec, ...]:
    specs = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if isinstance(getattr(module, "SPEC", None), StageSpec):
            specs.append(module.SPEC)
    return tuple(sorted(specs, key=lambda spec: spec.position))


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
