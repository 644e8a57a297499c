"""test_cli_plan: the tests that start processes or load real runtimes (tests/system). The in-process ones are tests/unit/test_cli_plan.py."""

from __future__ import annotations

import json

from tests import cli_contract
from tests.cli_contract import (
    TOPOLOGY_KEYS,
    check_plan_contract,
    check_types,
)
from tests.launch import affrun

root = cli_contract.root  # the module-scoped fixture shared with the unit half


def test_real_process_plan_and_topology(root: str) -> None:
    proc = affrun("plan", "--fsroot", root, "--json", "--nproc-per-node", "4", env={"CUDA_VISIBLE_DEVICES": "3,2,1,0"})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    check_plan_contract(data)
    assert [(r["gpu"], r["gpu_pci"]) for r in data["ranks"]] == [
        (0, "0000:ab:00.0"),
        (1, "0000:9a:00.0"),
        (2, "0000:2a:00.0"),
        (3, "0000:18:00.0"),
    ]
    proc = affrun("topology", "--fsroot", root, "--json")
    assert proc.returncode == 0, proc.stderr
    check_types(json.loads(proc.stdout), TOPOLOGY_KEYS, "topology")


def test_real_process_error_is_one_line(root: str) -> None:
    proc = affrun("plan", "--fsroot", root, "--json", "--nproc-per-node", "40")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("affrun: error: 40 ranks but only 16 whole core(s)")
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
