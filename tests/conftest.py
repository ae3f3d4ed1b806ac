"""Shared fixtures. GPU tests are marked `gpu` and skip, with the reason shown, where there is none."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python3 -m pytest` from a checkout, installed or not
    sys.path.insert(0, str(ROOT))


def _gpu_reason() -> str | None:
    try:
        import cupy
    except Exception as error:
        return f"no GPU: CuPy is not importable ({type(error).__name__})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no GPU: CuPy sees no device"
    except Exception as error:
        return f"no GPU: {type(error).__name__}: {error}"
    return None


GPU_SKIP_REASON = _gpu_reason()


def pytest_collection_modifyitems(config, items):
    for item in items:  # by marker: item.keywords also holds test names and parameter ids (a "gpu" backend)
        if item.get_closest_marker("gpu") and GPU_SKIP_REASON:
            item.add_marker(pytest.mark.skip(reason=GPU_SKIP_REASON))
        if item.get_closest_marker("nvcc") and shutil.which("nvcc") is None:
            from kdt.toolkit import find_nvcc

            if find_nvcc() is None:
                item.add_marker(pytest.mark.skip(reason="no nvcc: the CUDA toolkit is not installed"))


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(autouse=True)
def _no_step_summary(monkeypatch):
    """Under GitHub Actions the tests' own kdt runs must not append to the job's real step summary (the tests of the
    summary set GITHUB_STEP_SUMMARY themselves)."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
