"""test_hwloc_xml: the tests that start processes or load real runtimes (tests/system). The in-process ones are tests/unit/test_hwloc_xml.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import FIXTURES

GPU_XML = FIXTURES / "hwloc-xml-gpu"


def test_cli_reads_xml_and_reports_bad_xml(tmp_path: Path) -> None:
    good = subprocess.run([sys.executable, "-m", "launcher", "topology", "--topology", str(GPU_XML / "nvidiaDGX2.xml"),
                           "--json"], capture_output=True, text=True, check=False)
    assert good.returncode == 0, good.stderr
    data = json.loads(good.stdout)
    assert data["packages"] == 2 and len(data["gpus"]) == 16 and data["cpus"] == [0, 1, 24, 25]
    assert [n["id"] for n in data["numa_nodes"]] == [0, 1]
    bad = tmp_path / "broken.xml"
    bad.write_text("<topology><object")
    out = subprocess.run([sys.executable, "-m", "launcher", "topology", "--topology", str(bad)],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("affrun: error: ") and str(bad) in out.stderr
    assert "Traceback" not in out.stderr
