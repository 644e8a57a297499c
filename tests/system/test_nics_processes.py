"""NICs through the real entry points (issue 29): ``affrun topology``, ``plan``, ``show``, ``exec`` (dry run and a
real rank) and ``torchrun``, on fake sysfs trees with a real PCI tree, an hwloc XML, and hostile NIC data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, need
from tests.fakesys import (
    HOSTILE_NIC_CASES,
    FakeMachine,
    FakeNIC,
    break_nics,
    dgx_like,
    this_machine_with_gpus,
    write_tree,
)
from tests.launch import affrun, affrun_argv, clean_env, rank_lines

# The NIC on each GPU's switch, by rank (GPU order): worked out in tests/fakesys.py's dgx_like docstring.
DGX_NICS = ["mlx5_0:1", "mlx5_3:1", "mlx5_5:1", "mlx5_4:1", "mlx5_9:1", "mlx5_6:1", "mlx5_11:1", "mlx5_10:1"]


@pytest.fixture
def dgx(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "dgx", dgx_like())


def test_topology_lists_every_nic(dgx: Path, tmp_path: Path) -> None:
    result = affrun("topology", "--fsroot", str(dgx), "--json")
    assert result.returncode == 0, result.stderr
    nics = {n["name"]: n for n in json.loads(result.stdout)["nics"]}
    assert len(nics) == 13
    assert nics["mlx5_4"] == {"name": "mlx5_4", "pci": "0000:62:00.0", "kind": "infiniband", "numa_node": 0,
                              "ports": [{"number": 1, "state": "active", "rate_gbps": 400.0}],
                              "pci_path": ["pci0000:5e", "0000:5e:01.0", "0000:5f:00.0", "0000:60:01.0"]}
    text = affrun("topology", "--fsroot", str(dgx))
    lines = [ln.split() for ln in text.stdout.splitlines() if ln.startswith("nic ")]
    assert {ln[1] for ln in lines} == set(nics)
    assert ["nic", "mlx5_2", "0000:2a:00.1", "infiniband", "numa", "0", "ports", "1:down@200Gb/s"] in lines
    saved = tmp_path / "snap.json"
    assert affrun("topology", "--fsroot", str(dgx), "--save", str(saved)).returncode == 0
    loaded = affrun("topology", "--topology", str(saved), "--json")
    assert json.loads(loaded.stdout)["nics"] == json.loads(result.stdout)["nics"]


def test_plan_json_and_table_carry_each_ranks_nic(dgx: Path) -> None:
    result = affrun("plan", "--fsroot", str(dgx), "--json")
    assert result.returncode == 0, result.stderr
    ranks = json.loads(result.stdout)["ranks"]
    assert [r["nic"]["device"] for r in ranks] == DGX_NICS
    assert ranks[3]["nic"] == {"name": "mlx5_4", "port": 1, "device": "mlx5_4:1", "pci": "0000:62:00.0",
                               "kind": "infiniband", "distance": "switch", "rate_gbps": 400.0}
    assert [r["env"]["AFFRUN_NIC"] for r in ranks] == DGX_NICS
    assert all("UCX_NET_DEVICES" not in r["env"] for r in ranks)
    table = affrun("plan", "--fsroot", str(dgx)).stdout.splitlines()
    assert "nic" in table[0].split()
    assert [ln.split()[7] for ln in table[1:9]] == DGX_NICS


def test_exec_dry_run_exports_the_nic(dgx: Path) -> None:
    env = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8", "UCX_NET_DEVICES": "mlx5_1:1"}
    result = affrun("exec", "--fsroot", str(dgx), "--dry-run", "--nic-env", "ucx", "--", "true", env=env)
    assert result.returncode == 0, result.stderr
    lines = dict(ln.split("=", 1) for ln in result.stdout.splitlines() if "=" in ln and not ln.startswith("exec"))
    assert lines["AFFRUN_NIC"] == "mlx5_4:1"
    assert lines["UCX_NET_DEVICES"] == "mlx5_1:1"  # the user's, kept by --env-policy safe
    assert "NCCL_IB_HCA" not in lines and "NCCL_SOCKET_IFNAME" not in lines
    override = affrun("exec", "--fsroot", str(dgx), "--dry-run", "--nic-env", "ucx", "--env-policy", "override",
                      "--", "true", env=env)
    assert "UCX_NET_DEVICES=mlx5_4:1" in override.stdout.splitlines()
    assert " nic mlx5_4:1 " in (override.stdout + override.stderr)


def test_show_draws_the_nic_beside_its_gpu(dgx: Path, tmp_path: Path) -> None:
    svg = tmp_path / "map.svg"
    result = affrun("show", "--fsroot", str(dgx), "--no-color", "--svg", str(svg))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    gpu0 = next(i for i, ln in enumerate(lines) if "0000:1b:00.0 [rank 0]" in ln)
    assert "nic mlx5_0:1 (switch)" in lines[gpu0 + 1]  # the line under GPU 0's address, in its box
    drawn = svg.read_text()
    assert all(f"nic {n} (switch)" in drawn for n in DGX_NICS)


@pytest.mark.parametrize("case", HOSTILE_NIC_CASES)
def test_hostile_nic_data_through_the_cli(dgx: Path, case: str) -> None:
    broken = break_nics(dgx, case)
    for args in (("topology", "--json"), ("plan", "--json")):
        result = affrun(*args, "--fsroot", str(dgx))
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        data = json.loads(result.stdout)
        listed = data["nics"] if args[0] == "topology" else [r["nic"]["name"] for r in data["ranks"] if r["nic"]]
        assert broken not in [n if isinstance(n, str) else n["name"] for n in listed]
        assert any(broken in w or "more than 1024" in w for w in data["warnings"])


def test_hwloc_xml_nics_through_the_cli() -> None:
    need(FIXTURES.is_dir(), "shared fixtures not found")
    xml = FIXTURES / "mpibind/topo-xml/coral-lassen.xml"
    result = affrun("plan", "--topology", str(xml), "--json")
    assert result.returncode == 0, result.stderr
    assert [r["nic"]["device"] for r in json.loads(result.stdout)["ranks"]] == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1",
                                                                                "mlx5_3:1"]


def _this_machine_with_nics() -> FakeMachine:
    """This machine's CPUs, two fake GPUs, each behind a switch with a NIC: the ranks can really run."""
    m = this_machine_with_gpus(2)
    for i, gpu in enumerate(m.gpus):
        bus = int(gpu.pci[5:7], 16)
        switch = (f"pci0000:{bus - 3:02x}", f"0000:{bus - 3:02x}:01.0", f"0000:{bus - 2:02x}:00.0")
        m.pci_paths[gpu.pci] = (*switch, f"0000:{bus - 1:02x}:00.0")
        nic = f"0000:{bus + 1:02x}:00.0"
        m.pci_paths[nic] = (*switch, f"0000:{bus - 1:02x}:01.0")
        m.nics.append(FakeNIC(f"mlx5_{1 - i}", nic, 0))  # names against PCI order
    return m


def test_a_real_rank_gets_its_nic(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "m", _this_machine_with_nics())
    code = "import os; print(os.environ['AFFRUN_NIC'], os.environ.get('UCX_NET_DEVICES'))"
    for rank, nic in ((0, "mlx5_1:1"), (1, "mlx5_0:1")):
        env = clean_env(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
        result = subprocess.run(affrun_argv("exec", "--fsroot", str(root), "--nic-env", "ucx", "--", sys.executable,
                                            "-c", code), env=env, capture_output=True, text=True, timeout=120,
                                check=False)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [nic, nic]


@pytest.mark.torch
def test_torchrun_rank_lines_show_the_nic(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "m", _this_machine_with_nics())
    script = tmp_path / "probe.py"
    # One write per line: the ranks share the pipe, and print() under python -u writes each word apart.
    script.write_text("import os\nos.write(1, f\"probe {os.environ['LOCAL_RANK']} {os.environ['AFFRUN_NIC']}\\n\".encode())\n")
    env = clean_env()
    env.pop("AFFRUN_FSROOT", None)
    result = subprocess.run(affrun_argv("torchrun", "--fsroot", str(root), "--nproc-per-node", "2", str(script)),
                            env=env, capture_output=True, text=True, timeout=300, check=False, cwd=os.getcwd())
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(ln.split()[1:] for ln in result.stdout.splitlines() if ln.startswith("probe")) == [
        ["0", "mlx5_1:1"], ["1", "mlx5_0:1"]]
    assert sorted((r["rank"], r["nic"]) for r in rank_lines(result.stderr)) == [("0", "mlx5_1:1"), ("1", "mlx5_0:1")]
