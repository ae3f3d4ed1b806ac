"""Comparison policies: how an output of a kernel is checked against the reference (contract `compared:`).

Each policy takes (expected, got) numpy arrays and returns a FieldResult: how many elements (or rows)
mismatch and the first few as Diff records (index tuple, both values, their bits, ULP distance for floats).
NaN never passes any policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kdt.dtypes import BF16


@dataclass(frozen=True)
class Diff:
    index: tuple[int, ...]
    expected: object
    got: object
    expected_bits: str
    got_bits: str
    ulp: int | None = None
    note: str = ""


@dataclass
class FieldResult:
    name: str
    checked: int
    mismatches: int
    diffs: list[Diff] = field(default_factory=list)
    worst: str = ""

    @property
    def ok(self) -> bool:
        return self.mismatches == 0


def _bits_view(array: np.ndarray) -> np.ndarray:
    size = array.dtype.itemsize
    return array.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[size]) if size in (2, 4, 8) else array


def hex_bits(value: np.generic) -> str:
    array = np.asarray(value)
    if array.dtype.kind in "fiu" or array.dtype == BF16:
        return f"0x{int(_bits_view(array.reshape(1))[0]):0{2 * array.dtype.itemsize}x}"
    return repr(value)


def ulp_distance(expected: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Distance in units of the last place between floats of the same width (monotone integer map).

    +0 and -0 are 0 apart; infinities are at the ends of the map; NaN gives the largest distance.
    """
    width = {2: (np.int16, np.int64), 4: (np.int32, np.int64), 8: (np.int64, np.int64)}[expected.dtype.itemsize]
    signed, wide = width

    def ordered(values: np.ndarray) -> np.ndarray:
        ints = np.ascontiguousarray(values).view(signed).astype(wide)
        sign_mask = wide(np.iinfo(signed).min)
        return np.where(ints < 0, sign_mask - ints, ints)

    distance = np.abs(ordered(expected) - ordered(got))
    nan = np.isnan(expected.astype(np.float64)) | np.isnan(got.astype(np.float64))
    return np.where(nan, np.iinfo(np.int64).max, distance)


def _index_list(flat: np.ndarray, shape: tuple[int, ...], limit: int) -> list[tuple[int, ...]]:
    return [tuple(int(i) for i in np.unravel_index(f, shape)) for f in flat[:limit]]


def _make_diffs(expected, got, bad_flat, max_diffs, ulps=None) -> list[Diff]:
    diffs = []
    for index in _index_list(bad_flat, expected.shape, max_diffs):
        e, g = expected[index], got[index]
        ulp = None
        if ulps is not None:
            ulp = int(ulps[index])
        diffs.append(Diff(index, e.item() if hasattr(e, "item") else e, g.item() if hasattr(g, "item") else g,
                          hex_bits(e), hex_bits(g), ulp))
    return diffs


def _check_shape(name, expected, got) -> FieldResult | None:
    if expected.shape != got.shape or expected.dtype != got.dtype:
        return FieldResult(name, expected.size, max(expected.size, 1), [],
                           f"shape/dtype {got.shape} {got.dtype}, expected {expected.shape} {expected.dtype}")
    return None


@dataclass(frozen=True)
class Exact:
    """Bit for bit: integers equal, floats with identical bits (so -0.0 != +0.0 and NaN never passes)."""

    def describe(self) -> str:
        return "exact (bit for bit)"

    def compare(self, name: str, expected: np.ndarray, got: np.ndarray, max_diffs: int = 10) -> FieldResult:
        if (bad := _check_shape(name, expected, got)) is not None:
            return bad
        differs = _bits_view(np.ascontiguousarray(expected)) != _bits_view(np.ascontiguousarray(got))
        if expected.dtype.kind == "f" or expected.dtype == BF16:
            differs |= np.isnan(got.astype(np.float64))
        bad_flat = np.flatnonzero(differs)
        ulps = ulp_distance(expected, got) if expected.dtype.kind == "f" and bad_flat.size else None
        return FieldResult(name, expected.size, int(bad_flat.size),
                           _make_diffs(expected, got, bad_flat, max_diffs, ulps))


@dataclass(frozen=True)
class AbsTol:
    """|got - expected| <= atol elementwise; equal infinities pass; NaN never passes."""

    atol: float

    def describe(self) -> str:
        return f"|got - ref| <= {self.atol:g}"

    def compare(self, name: str, expected: np.ndarray, got: np.ndarray, max_diffs: int = 10) -> FieldResult:
        if (bad := _check_shape(name, expected, got)) is not None:
            return bad
        e = expected.astype(np.float64)
        g = got.astype(np.float64)
        with np.errstate(invalid="ignore"):
            close = (np.abs(g - e) <= self.atol) | ((e == g) & np.isinf(e))
        close &= ~np.isnan(g)
        bad_flat = np.flatnonzero(~close)
        ulps = ulp_distance(expected, got) if bad_flat.size else None
        worst = ""
        if bad_flat.size:
            with np.errstate(invalid="ignore"):
                diffs = np.abs(g - e)[~close]
            finite = diffs[~np.isnan(diffs)]
            worst = f"max |diff| {finite.max():.3g}" if finite.size else "max |diff| nan"
        return FieldResult(name, expected.size, int(bad_flat.size),
                           _make_diffs(expected, got, bad_flat, max_diffs, ulps), worst)


@dataclass(frozen=True)
class RowScaledTol:
    """Attention output: per row (last axis) max|got - ref| <= rtol * max(max|ref row|, floor),
    and over the whole tensor ||got - ref|| / ||ref|| <= global_rtol. Rows are counted as the mismatches."""

    rtol: float
    floor: float
    global_rtol: float

    def describe(self) -> str:
        return (f"per row max|d| <= {self.rtol:g} * max(|ref row|, {self.floor:g}); "
                f"||d|| / ||ref|| <= {self.global_rtol:g}")

    def compare(self, name: str, expected: np.ndarray, got: np.ndarray, max_diffs: int = 10) -> FieldResult:
        if expected.shape != got.shape:
            return FieldResult(name, expected.size, max(expected.size, 1), [],
                               f"shape {got.shape}, expected {expected.shape}")
        e = expected.astype(np.float64)
        g = got.astype(np.float64)
        rows_e = e.reshape(-1, e.shape[-1]) if e.ndim else e.reshape(1, 1)
        rows_g = g.reshape(-1, g.shape[-1]) if g.ndim else g.reshape(1, 1)
        err = np.abs(rows_g - rows_e)
        nan_rows = np.isnan(rows_g).any(axis=1)
        err = np.where(np.isnan(err), np.inf, err)
        row_err = err.max(axis=1) if err.shape[1] else np.zeros(err.shape[0])
        scale = np.maximum(np.abs(rows_e).max(axis=1) if err.shape[1] else 0.0, self.floor)
        bad_rows = np.flatnonzero((row_err > self.rtol * scale) | nan_rows)
        norm_ref = float(np.linalg.norm(rows_e))
        norm_err = float(np.linalg.norm(np.where(np.isfinite(err), err, 0.0)))
        rel = norm_err / norm_ref if norm_ref > 0 else norm_err
        global_bad = rel > self.global_rtol or bool(nan_rows.any())
        order = bad_rows[np.argsort(-(row_err[bad_rows] / scale[bad_rows]), kind="stable")]
        row_shape = e.shape[:-1] if e.ndim else (1,)
        diffs = []
        for row in order[:max_diffs]:
            col = int(np.argmax(err[row]))
            index = tuple(int(i) for i in np.unravel_index(row, row_shape)) + (col,)
            diffs.append(Diff(index, float(rows_e[row, col]), float(rows_g[row, col]),
                              hex_bits(expected.reshape(rows_e.shape)[row, col]),
                              hex_bits(got.reshape(rows_g.shape)[row, col]), None,
                              f"row max|d| {row_err[row]:.3g} vs allowed {self.rtol * scale[row]:.3g}"))
        mismatches = int(bad_rows.size) + (1 if global_bad and not bad_rows.size else 0)
        return FieldResult(name, rows_e.shape[0], mismatches, diffs, f"rel L2 {rel:.3g}")
