"""Core kinds through the real CLI (issue 20, parts 2-3): ``affrun topology`` (JSON and text), ``plan`` and
``show`` on hwloc's hybrid trees and XMLs, read in place from the shared fixtures (copies only where a test
corrupts one); the snapshot round trip; hostile kind data (a warning and a homogeneous plan, never a traceback)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.system.test_hostile_input import affrun

RAPTOR = "20em64t-hybrid-1p6c2t+2ca4co1t"  # cpufreq is its only evidence: no PMU lists, no cpu_capacity
HOMOGENEOUS = "16em64t-4s2c2t-offlines"
XMLS = FIXTURES / "hwloc-hybrid"
CPU = "sys/devices/system/cpu"


def ok(*args: str | bytes) -> str:
    proc = affrun(*args)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc.stdout


def topology_json(*args: str) -> dict:  # type: ignore[type-arg]
    data: dict = json.loads(ok("topology", "--json", *args))  # type: ignore[type-arg]
    return data


def plan_json(*args: str) -> dict:  # type: ignore[type-arg]
    data: dict = json.loads(ok("plan", "--json", "--no-gpu", *args))  # type: ignore[type-arg]
    return data


@pytest.fixture(scope="module")
def raptor(hwloc_root) -> str:  # type: ignore[no-untyped-def]
    return str(hwloc_root(RAPTOR))


def test_topology_json_lists_kinds_fastest_first_from_cpufreq_alone(raptor: str) -> None:
    kinds = topology_json("--fsroot", raptor)["core_kinds"]
    assert [(k["cpus"], k["efficiency"], k["source"]) for k in kinds] == [
        (list(range(12)), 1, "cpufreq"), (list(range(12, 20)), 0, "cpufreq")]
    assert all(isinstance(k["name"], str) and k["name"] for k in kinds)
    # narrowed to the allowed CPUs: one kind left, with efficiency 0
    narrowed = topology_json("--fsroot", raptor, "--cpus", "12-19")["core_kinds"]
    assert [(k["cpus"], k["efficiency"]) for k in narrowed] == [(list(range(12, 20)), 0)]


def test_an_xml_with_three_kinds(raptor: str) -> None:
    kinds = topology_json("--topology", str(XMLS / "fakecpukinds.xml"))["core_kinds"]
    assert [(k["cpus"], k["efficiency"], k["name"]) for k in kinds] == [
        ([3], 2, "P-core"), ([2], 1, "YouBigcore"), ([0, 1], 0, "MySmallCore")]
    text = ok("topology", "--topology", str(XMLS / "fakecpukinds.xml"))
    assert "P-core" in text and "YouBigcore" in text and "MySmallCore" in text
    kinds = topology_json("--topology", str(XMLS / "Intel-RaptorLake-Corei7-1370P.xml"))["core_kinds"]
    assert [(k["cpus"], k["name"]) for k in kinds] == [(list(range(12)), "P-core"), (list(range(12, 20)), "E-core")]


def test_a_homogeneous_machine_shows_no_kinds(hwloc_root) -> None:  # type: ignore[no-untyped-def]
    root = str(hwloc_root(HOMOGENEOUS))
    assert len(topology_json("--fsroot", root)["core_kinds"]) <= 1
    assert "kind" not in ok("topology", "--fsroot", root)
    assert "kind" not in ok("show", "--fsroot", root, "--no-gpu", "--no-color")


def test_snapshot_round_trip_keeps_kinds_and_the_plan(raptor: str, tmp_path: Path) -> None:
    snap = tmp_path / "hybrid.json"
    ok("topology", "--fsroot", raptor, "--save", str(snap))
    assert topology_json("--topology", str(snap))["core_kinds"] == topology_json("--fsroot", raptor)["core_kinds"]
    assert (plan_json("--topology", str(snap), "--nproc-per-node", "2")["ranks"]
            == plan_json("--fsroot", raptor, "--nproc-per-node", "2")["ranks"])


def test_plan_one_and_two_ranks(raptor: str) -> None:
    (r,) = plan_json("--fsroot", raptor)["ranks"]
    assert r["env"]["OMP_NUM_THREADS"] == "6" and r["env"]["AFFRUN_COMPUTE_CPUS"] == "0-11"
    assert r["env"]["AFFRUN_LOADER_CPUS"] == "12-19" and r["env"]["AFFRUN_CPUS"] == "0-19"
    r0, r1 = plan_json("--fsroot", raptor, "--nproc-per-node", "2")["ranks"]
    assert (r0["env"]["AFFRUN_COMPUTE_CPUS"], r0["env"]["AFFRUN_LOADER_CPUS"]) == ("0-5", "12-15")
    assert (r1["env"]["AFFRUN_COMPUTE_CPUS"], r1["env"]["AFFRUN_LOADER_CPUS"]) == ("6-11", "16-19")
    assert r0["env"]["OMP_NUM_THREADS"] == r1["env"]["OMP_NUM_THREADS"] == "3"
    table = ok("plan", "--fsroot", raptor, "--no-gpu", "--nproc-per-node", "2")
    assert "3 big cores compute, 4 little cores load" in table
    (r,) = plan_json("--fsroot", raptor, "--spill", "compute")["ranks"]
    assert r["env"]["OMP_NUM_THREADS"] == "14"


def test_show_marks_each_cores_kind(raptor: str) -> None:
    out = ok("show", "--fsroot", raptor, "--no-gpu", "--no-color")
    assert "[ 0b 0 ]" in out and "[19l 0L]" in out
    assert "big core (fastest)" in out and "little core (slowest)" in out


# ---------------------------------------------------------------------------------------------- hostile kind data
def homogeneous_plan(args: list[str]) -> None:
    """The kinds were refused with a warning: one rank computes on all 14 cores, as before kinds existed."""
    proc = affrun("plan", "--json", "--no-gpu", *args)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    (r,) = data["ranks"]
    assert r["env"]["OMP_NUM_THREADS"] == "14" and r["env"]["AFFRUN_LOADER_CPUS"] == ""
    assert any("core kinds ignored" in w for w in data["warnings"]), data["warnings"]


@pytest.mark.parametrize("corrupt", ["pmu-ghost-cpus", "pmu-overlap", "capacity-0", "freq-0", "freq-10thz",
                                     "freq-text"])
def test_hostile_sysfs_kinds_give_a_warning_and_a_homogeneous_plan(raptor: str, tmp_path: Path,
                                                                  corrupt: str) -> None:
    root = tmp_path / "tree"
    shutil.copytree(raptor, root, symlinks=True)
    devices = root / "sys/devices"
    if corrupt.startswith("pmu"):
        (devices / "cpu_core").mkdir()
        (devices / "cpu_atom").mkdir()
        (devices / "cpu_core/cpus").write_text("0-11\n")
        (devices / "cpu_atom/cpus").write_text("12-99\n" if corrupt == "pmu-ghost-cpus" else "10-19\n")
    elif corrupt == "capacity-0":
        for cpu in range(20):
            (root / CPU / f"cpu{cpu}/cpu_capacity").write_text("0\n" if cpu == 3 else "1024\n")
    else:
        value = {"freq-0": "0\n", "freq-10thz": "10000000001\n", "freq-text": "fast\n"}[corrupt]
        freq = root / CPU / "cpu5/cpufreq/cpuinfo_max_freq"
        freq.unlink()
        freq.write_text(value)
    homogeneous_plan(["--fsroot", str(root)])


@pytest.mark.parametrize("kinds", [
    "not a list",
    [{"cpus": [0, 1], "efficiency": 1, "name": "P-core", "source": "x"},
     {"cpus": [1, 2], "efficiency": 0, "name": "E-core", "source": "x"}],  # overlapping
    [{"cpus": list(range(12)), "efficiency": 1, "name": "P-core", "source": "x"},
     {"cpus": list(range(12, 40)), "efficiency": 0, "name": "E-core", "source": "x"}],  # CPUs not online
    [{"cpus": list(range(12)), "efficiency": 0, "name": "P-core", "source": "x"},
     {"cpus": list(range(12, 20)), "efficiency": 1, "name": "E-core", "source": "x"}],  # not fastest first
    [{"cpus": list(range(12)), "efficiency": 1, "name": "P\x1b[31m", "source": "x"},
     {"cpus": list(range(12, 20)), "efficiency": 0, "name": "E-core", "source": "x"}],  # not printable
])
def test_hostile_snapshot_kinds_give_a_warning_and_a_homogeneous_plan(raptor: str, tmp_path: Path,
                                                                     kinds: object) -> None:
    snap = tmp_path / "snap.json"
    ok("topology", "--fsroot", raptor, "--save", str(snap))
    data = json.loads(snap.read_text())
    data["core_kinds"] = kinds
    snap.write_text(json.dumps(data))
    homogeneous_plan(["--topology", str(snap)])


# ---------------------------------------------------------------------------------------------- doctor
def doctor_ids(root: str, **env: str) -> list[dict]:  # type: ignore[type-arg]
    proc = affrun("doctor", "--fsroot", root, "--nproc-per-node", "1", "--json", env=env)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return [f for f in json.loads(proc.stdout)["findings"] if f["id"] == "core-kinds-mixed"]


def test_doctor_finds_a_team_that_spans_kinds(raptor: str, hwloc_root) -> None:  # type: ignore[no-untyped-def]
    (found,) = doctor_ids(raptor, OMP_NUM_THREADS="14")
    assert found["severity"] == "warning"
    assert "OMP_NUM_THREADS=6" in found["fix"] and "affrun" in found["fix"]
    (found,) = doctor_ids(raptor, OMP_NUM_THREADS="4", OMP_PLACES="{0:20},{10},{11},{12}")
    assert "OMP_NUM_THREADS=6" in found["fix"]
    assert doctor_ids(raptor, OMP_NUM_THREADS="6") == []
    assert doctor_ids(raptor, OMP_NUM_THREADS="4", OMP_PLACES="{0:20},{2},{4},{6}") == []
    assert doctor_ids(str(hwloc_root(HOMOGENEOUS)), OMP_NUM_THREADS="64") == []
