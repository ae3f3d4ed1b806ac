"""Machine-readable results: JSON for tools, JUnit XML for CI systems. Both written atomically."""

from __future__ import annotations

import json
import os
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import asdict, is_dataclass
from pathlib import Path

from kdt.verify import CaseResult


def write_atomically(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as f:
            f.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _plain(value):
    if is_dataclass(value):
        return {key: _plain(item) for key, item in asdict(value).items()}
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    return value


def verify_document(results: list[CaseResult]) -> dict:
    """kdt verify's results as plain data: {"passed": every case passed, "cases": [each CaseResult]}."""
    return {"passed": all(r.passed for r in results), "cases": [_plain(r) for r in results]}


def verify_json(results: list[CaseResult]) -> str:
    return json.dumps(verify_document(results), indent=2)


def verify_junit(results: list[CaseResult]) -> str:
    suites = ET.Element("testsuites")
    for kernel in dict.fromkeys(r.kernel for r in results):
        mine = [r for r in results if r.kernel == kernel]
        suite = ET.SubElement(suites, "testsuite", name=f"kdt.verify.{kernel}", tests=str(len(mine)),
                              failures=str(sum(not r.passed and r.error is None for r in mine)),
                              errors=str(sum(r.error is not None for r in mine)))
        for r in mine:
            case = ET.SubElement(suite, "testcase", classname=f"kdt.verify.{kernel}", name=r.case,
                                 time=f"{(r.time_us or 0) / 1e6:.9f}")
            if r.error is not None:
                ET.SubElement(case, "error", message=r.error[:200]).text = r.error
            elif not r.passed:
                lines = [f"{f.name}: {f.mismatches} of {f.checked} mismatch {f.worst}".strip() for f in r.fields if not f.ok]
                for f in r.fields:
                    for d in f.diffs:
                        lines.append(f"  {f.name}{list(d.index)} expected {d.expected} ({d.expected_bits}) got {d.got} "
                                     f"({d.got_bits})" + (f" ulp {d.ulp}" if d.ulp is not None else ""))
                ET.SubElement(case, "failure", message=lines[0] if lines else "mismatch").text = "\n".join(lines)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True)
