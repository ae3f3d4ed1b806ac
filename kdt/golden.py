"""Golden files: the contract's HDF5 layout, written atomically, read with every failure named.

    <kernel>.h5   attrs: kernel, schema_version, generator, ref_digest
      /<case>/              attrs: description, seed, and the stage's scalar parameters
      /<case>/inputs/<name>
      /<case>/expected/<name>   (bf16 stored as uint16 bits with attribute dtype="bfloat16")

h5py is imported where a file is read or written, not with this module (kdt --help need not load it).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

import kdt
from kdt import paths
from kdt.dtypes import from_storage, storage
from kdt.spec import Arrays, Case, StageSpec
from kdt.refs.errors import BadInput

SCHEMA_VERSION = 1
COMPRESS_ABOVE_BYTES = 64 * 1024


class GoldenError(Exception):
    """A golden file that cannot be used: missing, unreadable, foreign, of another schema, malformed."""

    def __init__(self, path: Path | str, problem: str):
        self.path, self.problem = Path(path), problem
        super().__init__(f"{path}: {problem}")


@dataclass(frozen=True)
class GoldenCase:
    case: Case
    expected: Arrays


@dataclass(frozen=True)
class GoldenFile:
    path: Path
    kernel: str
    schema_version: int
    generator: str
    ref_digest: str
    cases: list[GoldenCase]


def default_path(golden_dir: Path | str | None, kernel: str) -> Path:
    """golden_dir/<kernel>.h5; golden_dir None: the package's golden files (golden/ in a checkout), wherever kdt
    runs from."""
    return Path(paths.GOLDEN if golden_dir is None else golden_dir) / f"{kernel}.h5"


def expected_for(spec: StageSpec, cases: Iterable[Case], progress: Callable[[], None] | None = None,
                 source: Path | None = None) -> list[GoldenCase]:
    """The reference's outputs for each case. Input the contract calls bad is BadInput naming the case (and the
    file it came from, `source`) before the argument."""
    out = []
    for case in cases:
        try:
            out.append(GoldenCase(case, spec.reference(case.inputs, case.params)))
        except BadInput as error:
            where = f"{source} case {case.name!r}" if source is not None else f"case {case.name!r}"
            raise BadInput(f"{where}: {error.argument}", error.expected, error.actual) from None
        if progress:
            progress()
    return out


def _write_array(group: h5py.Group, name: str, array: np.ndarray) -> None:
    raw, dtype_attr = storage(np.ascontiguousarray(array))
    big = raw.nbytes >= COMPRESS_ABOVE_BYTES
    dataset = group.create_dataset(name, data=raw, track_times=False,
                                   **({"compression": "gzip", "compression_opts": 4, "shuffle": True} if big else {}))
    if dtype_attr:
        dataset.attrs["dtype"] = dtype_attr


def _scalar_attr(value):
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return np.int64(value)
    if isinstance(value, (float, np.floating)):
        return np.float64(value)
    return str(value)


def write(path: Path | str, spec: StageSpec, golden_cases: list[GoldenCase], inputs_only: bool = False) -> None:
    """Write the whole file to a temporary sibling, then rename it over `path`: a crash or a full disk
    leaves the old file intact and no half-written one."""
    import h5py
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        with h5py.File(temporary, "w", track_order=True) as f:
            f.attrs["kernel"] = spec.name
            f.attrs["schema_version"] = np.int64(SCHEMA_VERSION)
            f.attrs["generator"] = f"kdt {kdt.__version__}"
            f.attrs["ref_digest"] = spec.reference_digest()
            for item in golden_cases:
                case = item.case
                group = f.create_group(case.name, track_order=True)
                group.attrs["description"] = case.description
                group.attrs["seed"] = np.int64(case.seed)
                for key, value in case.params.items():
                    group.attrs[key] = _scalar_attr(value)
                inputs = group.create_group("inputs", track_order=True)
                for name, array in case.inputs.items():
                    _write_array(inputs, name, array)
                if not inputs_only:
                    expected = group.create_group("expected", track_order=True)
                    for name, array in item.expected.items():
                        _write_array(expected, name, array)
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp's 0600 would hide the file from other users
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _read_array(dataset: h5py.Dataset) -> np.ndarray:
    dtype_attr = dataset.attrs.get("dtype")
    if isinstance(dtype_attr, bytes):
        dtype_attr = dtype_attr.decode()
    return from_storage(dataset[()], dtype_attr)


def _attr_str(attrs, key, path) -> str:
    if key not in attrs:
        raise GoldenError(path, f"missing file attribute {key!r} (not a kdt golden file?)")
    value = attrs[key]
    return value.decode() if isinstance(value, bytes) else str(value)


def read(path: Path | str, spec: StageSpec | None = None, expect_outputs: bool = True) -> GoldenFile:
    """Read and check a golden file; `spec` (the stage it must belong to) enables layout checks."""
    import h5py
    path = Path(path)
    if not path.exists():
        raise GoldenError(path, "no such file (run `kdt gen-golden` to create it)")
    try:
        f = h5py.File(path, "r")
    except OSError as error:
        raise GoldenError(path, f"not a readable HDF5 file (truncated or foreign?): {error}") from None
    try:
        with f:
            kernel = _attr_str(f.attrs, "kernel", path)
            if spec is not None and kernel != spec.name:
                raise GoldenError(path, f"holds kernel {kernel!r}, expected {spec.name!r}")
            if "schema_version" not in f.attrs:
                raise GoldenError(path, "missing file attribute 'schema_version'")
            version = int(f.attrs["schema_version"])
            if version != SCHEMA_VERSION:
                raise GoldenError(path, f"schema_version {version}, this kdt reads {SCHEMA_VERSION}")
            generator = _attr_str(f.attrs, "generator", path) if "generator" in f.attrs else ""
            digest = _attr_str(f.attrs, "ref_digest", path) if "ref_digest" in f.attrs else ""
            cases = [_read_case(f[name], name, path, spec, expect_outputs) for name in f]
    except GoldenError:
        raise
    except (OSError, KeyError, ValueError, TypeError) as error:
        raise GoldenError(path, f"unreadable ({type(error).__name__}: {error}); truncated or corrupt?") from None
    return GoldenFile(path, kernel, version, generator, digest, cases)


def _read_case(group, name: str, path: Path, spec: StageSpec | None, expect_outputs: bool) -> GoldenCase:
    import h5py
    if not isinstance(group, h5py.Group) or "inputs" not in group:
        raise GoldenError(path, f"case {name!r} has no 'inputs' group")
    attrs = {key: (value.decode() if isinstance(value, bytes) else value) for key, value in group.attrs.items()}
    params = {key: value.item() if hasattr(value, "item") else value
              for key, value in attrs.items() if key not in ("description", "seed")}
    if spec is not None:
        missing = [key for key in spec.params if key not in params]
        if missing:
            raise GoldenError(path, f"case {name!r} lacks the parameter(s) {', '.join(missing)}")
    inputs = {key: _read_array(group["inputs"][key]) for key in group["inputs"]}
    expected: Arrays = {}
    if expect_outputs:
        if "expected" not in group:
            raise GoldenError(path, f"case {name!r} has no 'expected' group (an inputs-only file? see --inputs)")
        expected = {key: _read_array(group["expected"][key]) for key in group["expected"]}
    case = Case(name, str(attrs.get("description", "")), int(attrs.get("seed", -1)), params, inputs)
    if spec is not None and expect_outputs:
        _check_expected_layout(spec, case, expected, path)
    return GoldenCase(case, expected)


def _check_expected_layout(spec: StageSpec, case: Case, expected: Arrays, path: Path) -> None:
    from kdt.dtypes import name as dtype_name

    shapes = {key: tuple(array.shape) for key, array in case.inputs.items()}
    params = dict(case.params)
    if "out_dtype" not in params and "out" in expected:
        params["out_dtype"] = dtype_name(expected["out"].dtype)
    try:
        layout = spec.output_layout(shapes, params)
    except KeyError as missing:
        raise GoldenError(path, f"case {case.name!r} lacks the input dataset {missing}") from None
    for key, want in layout.items():
        if key not in expected:
            raise GoldenError(path, f"case {case.name!r} lacks the expected dataset {key!r}")
        got = expected[key]
        if tuple(got.shape) != want.shape or dtype_name(got.dtype) != want.dtype:
            raise GoldenError(path, f"case {case.name!r}: expected/{key} is {dtype_name(got.dtype)} {tuple(got.shape)}, "
                                    f"the contract says {want.dtype} {want.shape}")


@dataclass(frozen=True)
class Drift:
    kernel: str
    case: str
    item: str
    detail: str


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def drift(spec: StageSpec, path: Path, fresh: list[GoldenCase]) -> list[Drift]:
    """What differs between the file on disk and a fresh in-memory regeneration (empty: no drift)."""
    try:
        on_disk = read(path, spec)
    except GoldenError as error:
        return [Drift(spec.name, "-", "file", error.problem)]
    found = []
    if on_disk.ref_digest != spec.reference_digest():
        found.append(Drift(spec.name, "-", "ref_digest", "the reference source changed since the file was written"))
    disk_cases = {item.case.name: item for item in on_disk.cases}
    fresh_names = [item.case.name for item in fresh]
    for name in disk_cases.keys() - set(fresh_names):
        found.append(Drift(spec.name, name, "case", "on disk only (no longer generated)"))
    for item in fresh:
        name = item.case.name
        if name not in disk_cases:
            found.append(Drift(spec.name, name, "case", "generated but missing on disk"))
            continue
        old = disk_cases[name]
        if old.case.description != item.case.description or old.case.seed != item.case.seed:
            found.append(Drift(spec.name, name, "attrs", "description or seed differ"))
        for key in set(old.case.params) | set(item.case.params):
            if np.asarray(old.case.params.get(key)).tolist() != np.asarray(_scalar_attr(item.case.params.get(key))).tolist():
                found.append(Drift(spec.name, name, f"param {key}",
                                   f"disk {old.case.params.get(key)!r}, fresh {item.case.params.get(key)!r}"))
        for kind, old_arrays, new_arrays in (("inputs", old.case.inputs, item.case.inputs),
                                             ("expected", old.expected, item.expected)):
            for key in sorted(set(old_arrays) | set(new_arrays)):
                a, b = old_arrays.get(key), new_arrays.get(key)
                if a is None or b is None:
                    found.append(Drift(spec.name, name, f"{kind}/{key}", "present on one side only"))
                elif not _same_array(np.asarray(a), np.asarray(b)):
                    detail = (f"{a.dtype}{a.shape} vs {b.dtype}{b.shape}" if a.shape != b.shape or a.dtype != b.dtype
                              else f"{int(np.count_nonzero(a.view(np.uint8) != b.view(np.uint8)))} bytes differ")
                    found.append(Drift(spec.name, name, f"{kind}/{key}", detail))
    return found
