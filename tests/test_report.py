"""The JSON and JUnit writers of kdt verify."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from kdt.compare import Diff, FieldResult
from kdt.report import verify_json, verify_junit, write_atomically
from kdt.verify import CaseResult

RESULTS = [
    CaseResult("tree-build", "b1", "B=1", True, 3.5, [FieldResult("parent", 6, 0)]),
    CaseResult("tree-build", "ties", "ties", False, 4.0,
               [FieldResult("logw", 41, 1, [Diff((0, 3), -1.5, -1.25, "0xbfc00000", "0xbfa00000", 2097152)])]),
    CaseResult("topk", "v1", "V=1", False, None, [], "CUDADriverError: illegal address"),
]


def test_junit_counts_and_messages():
    root = ET.fromstring(verify_junit(RESULTS))
    suites = {suite.get("name"): suite for suite in root}
    build_suite = suites["kdt.verify.tree-build"]
    assert build_suite.get("tests") == "2" and build_suite.get("failures") == "1" and build_suite.get("errors") == "0"
    failure = build_suite.find("testcase[@name='ties']/failure")
    assert "logw: 1 of 41 mismatch" in failure.get("message") and "0xbfa00000" in failure.text
    assert suites["kdt.verify.topk"].find("testcase/error").get("message").startswith("CUDADriverError")


def test_json_roundtrip(tmp_path):
    path = tmp_path / "out" / "verify.json"
    write_atomically(path, verify_json(RESULTS))
    data = json.loads(path.read_text())
    assert data["passed"] is False and len(data["cases"]) == 3
    assert data["cases"][1]["fields"][0]["diffs"][0]["index"] == [0, 3]
