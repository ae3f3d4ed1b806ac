"""The one error every reference raises for input the contract calls bad."""

from __future__ import annotations


class BadInput(ValueError):
    """Input outside the contract: names the argument, what was expected and what was found."""

    def __init__(self, argument: str, expected: str, actual: object):
        self.argument = argument
        self.expected = expected
        self.actual = actual
        super().__init__(f"{argument}: expected {expected}, got {actual}")


def require(condition: bool, argument: str, expected: str, actual: object) -> None:
    if not condition:
        raise BadInput(argument, expected, actual)


def require_shape(array, argument: str, shape: tuple) -> None:
    """`shape` entries of None match any extent."""
    ok = array.ndim == len(shape) and all(want is None or want == got for want, got in zip(shape, array.shape))
    expected = "shape (" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
    require(ok, argument, expected, tuple(array.shape))


def require_dtype(array, argument: str, dtype) -> None:
    import numpy as np

    require(array.dtype == np.dtype(dtype), argument, f"dtype {np.dtype(dtype)}", array.dtype)
