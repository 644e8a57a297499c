"""``affrun exec`` runs before every rank: its import path must not load heavy or optional packages."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("click", "psutil", "yaml", "cpuinfo", "submitit", "torch", "numpy")

PROBE = """
import json, sys
sys.argv = ["affrun"] + {argv!r}
from launcher.main import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}})), file=sys.stderr)
"""


@pytest.mark.parametrize(
    "argv",
    [["exec", "--dry-run", "--", "true"], ["exec", "--dry-run", "--nproc-per-node", "1", "--local-rank", "0", "--", "x"]],
)
def test_exec_path_loads_no_heavy_package(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stderr.strip().splitlines()[-1]))
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))
    assert "launcher" in loaded


@pytest.mark.parametrize("module", ["launcher.plan", "launcher.env", "launcher.topology", "launcher", "launcher.exec_cmd",
                                    "launcher.startup", "launcher.run_cmd", "launcher.inprocess_bind"])
def test_core_modules_load_no_heavy_package(module: str) -> None:
    code = f"import sys, json, {module}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(json.loads(proc.stdout))
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))
