"""The two GPU proofs every stage's kernel owes: the golden file, and fresh random inputs."""

from __future__ import annotations

import numpy as np

from kdt import golden, stages


def _describe(result) -> str:
    if result.error:
        return f"{result.case}: {result.error}"
    return f"{result.case} ({result.description}): " + ", ".join(
        f"{f.name} {f.mismatches}/{f.checked} {f.worst} first {f.diffs[:1]}" for f in result.fields if not f.ok)


def assert_golden_passes(kernel: str, root, graph: bool = False, knobs: dict | None = None) -> None:
    from kdt import verify

    spec = stages.get(kernel)
    results = verify.verify_file(spec, golden.default_path(root / "golden", kernel), graph=graph, knobs=knobs)
    assert results, "no golden case ran"
    failed = [_describe(r) for r in results if not r.passed]
    assert not failed, "\n".join(failed)


def assert_random_case_passes(kernel: str, seed: int, knobs: dict | None = None) -> None:
    from kdt import verify

    spec = stages.get(kernel)
    case = spec.random_case(np.random.default_rng(seed))
    result = verify.verify_fresh(spec, case, knobs=knobs)
    assert result.passed, f"seed {seed}: " + _describe(result)
