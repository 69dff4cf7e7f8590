"""A suite's results as one JUnit XML document (``suite artifacts --download``): a test case
per test, its last try's device and duration, a failure for a failed test, and a flaky
test's earlier failures as ``flakyFailure`` elements (the Maven Surefire convention)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET  # writing only: nothing untrusted is parsed here
from collections.abc import Mapping

from .model import Suite


def merged_junit(suite: Suite, results: Mapping[str, str]) -> bytes:
    """The suite's results (``suite:ID:results``, test -> JSON) as JUnit XML."""
    counts = suite.counts
    root = ET.Element("testsuites", name=suite.name)
    ts = ET.SubElement(
        root,
        "testsuite",
        name=suite.name,
        tests=str(suite.tests),
        failures=str(counts.get("failed", 0)),
        skipped=str(counts.get("skipped", 0)),
        errors="0",
    )
    for test in sorted(results):
        r = json.loads(results[test])
        cls, _, name = test.rpartition("#")
        case = ET.SubElement(ts, "testcase", name=name or test, classname=cls)
        if r.get("d") is not None:
            case.set("time", f"{float(r['d']):.3f}")
        tries = r.get("tries") or []
        if r.get("dev"):
            props = ET.SubElement(case, "properties")
            ET.SubElement(props, "property", name="device", value=str(r["dev"]))
        status = r.get("s")
        if status == "failed":
            ET.SubElement(case, "failure", message=str(r.get("m") or "failed on every try"))
        elif status == "skipped":
            ET.SubElement(case, "skipped")
        elif status == "flaky":
            for t in tries:
                if t[0] != "passed":
                    ET.SubElement(case, "flakyFailure", message=f"{t[0]} on {t[1] or '?'}")
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)
