"""``affrun topology --save F`` then ``--topology F`` gives the same machine; bad snapshots give one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, need
from tests.errors import ok
from tests.fakesys import FakeGPU, uniform, write_tree
from tests.launch import affrun


def round_trip(source: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> tuple[str, str, Path]:
    snapshot = tmp_path / "snap.json"
    ok(affrun("topology", *source, "--save", str(snapshot), env=env))
    direct = ok(affrun("topology", *source, "--json", env=env))
    loaded = ok(affrun("topology", "--topology", str(snapshot), "--json", env=env))
    return direct, loaded, snapshot


def gpu_machine(tmp_path: Path) -> Path:
    m = uniform(2, 8, threads=2, nodes_per_package=2, l3_per_node=2)
    m.gpus = [
        FakeGPU(pci=f"0000:{bus:02x}:00.0", numa_node=i // 2, uuid=f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd")
        for i, bus in enumerate((0x17, 0x3A, 0x5D, 0x86, 0xAF, 0xB1, 0xD8, 0xDB))
    ]
    m.cgroup_cpus = "0-5,8-13,16-21,24-29"
    return write_tree(tmp_path / "machine", m)


def test_fake_gpu_machine_round_trip(tmp_path: Path) -> None:
    root = gpu_machine(tmp_path)
    direct, loaded, snapshot = round_trip(["--fsroot", str(root)], tmp_path)
    assert loaded == direct
    data = json.loads(loaded)
    assert len(data["gpus"]) == 8 and data["cpus"] == sorted({*range(6), *range(8, 14), *range(16, 22), *range(24, 30)})
    assert json.loads(snapshot.read_text())["format"] == "affrun-topology/1"


def test_visibility_is_resolved_again_when_loading(tmp_path: Path) -> None:
    root = gpu_machine(tmp_path)
    env = {"CUDA_VISIBLE_DEVICES": "GPU-00000005-aaaa-bbbb-cccc-dddddddddddd,2"}
    direct, loaded, _ = round_trip(["--fsroot", str(root)], tmp_path, env=env)
    assert loaded == direct
    assert [g["pci"] for g in json.loads(loaded)["gpus"]] == ["0000:b1:00.0", "0000:5d:00.0"]


def test_plan_from_snapshot_equals_plan_from_tree(tmp_path: Path) -> None:
    root = gpu_machine(tmp_path)
    snapshot = tmp_path / "snap.json"
    ok(affrun("topology", "--fsroot", str(root), "--save", str(snapshot)))
    from_tree = ok(affrun("plan", "--fsroot", str(root), "--json"))
    from_snapshot = ok(affrun("plan", "--topology", str(snapshot), "--json"))
    assert from_snapshot == from_tree


@pytest.mark.parametrize(
    "name", ["nvidiagpunumanodes", "32amd64-4s2n4c-cgroup2", "offline-cpu0-node0", "48amd64-4pa2n6c-sparse", "16amd64-8n2c-cpusets"]
)
def test_real_machines_round_trip(name: str, hwloc_root, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    direct, loaded, _ = round_trip(["--fsroot", str(hwloc_root(name))], tmp_path)
    assert loaded == direct


def test_hwloc_xml_round_trip(tmp_path: Path) -> None:
    xml = FIXTURES / "hwloc-xml-gpu" / "irregulargroups-disallowed.xml"
    need(xml.is_file(), f"{xml} missing")
    direct, loaded, _ = round_trip(["--topology", str(xml)], tmp_path)
    assert loaded == direct


# ------------------------------------------------------------------------------------------ bad snapshots
def good_snapshot(tmp_path: Path) -> dict[str, object]:
    snapshot = tmp_path / "good.json"
    ok(affrun("topology", "--fsroot", str(gpu_machine(tmp_path)), "--save", str(snapshot)))
    data: dict[str, object] = json.loads(snapshot.read_text())
    return data


def broken(data: dict[str, object], path: list[object], value: object) -> dict[str, object]:
    copy = json.loads(json.dumps(data))
    target = copy
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    result: dict[str, object] = copy
    return result


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (["format"], "something-else", "not an affrun topology snapshot"),
        (["cores", 0, "pus"], "0,1", "cores[0].pus"),
        (["cores", 0, "package"], 7, "not a package index"),
        (["numa_nodes", 0, "cpus"], "0-x", "numa_nodes[0].cpus is not a cpu list"),
        (["allowed"], "", "\"allowed\" is empty"),
        (["allowed"], "0-500", "not online"),
        (["gpus", 0, "vendor"], "matrox", "gpus[0].vendor"),
        (["packages"], KeyError, "\"packages\" must be a list"),
        (["online"], KeyError, "missing key 'online'"),
        (["gpus", 0, "index"], "0", "gpus[0].index must be an integer"),
    ],
)
def test_bad_snapshot_is_one_line(tmp_path: Path, path: list[object], value: object, words: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(broken(good_snapshot(tmp_path), path, value)))
    result = affrun("topology", "--topology", str(bad))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"affrun: error: {bad}: "), result.stderr
    assert words in result.stderr


@pytest.mark.parametrize(
    ("content", "words"),
    [(b"{not json", "not valid JSON (line 1"), (b"[]", "not an affrun topology snapshot"), (b"\xff\xfe\x00", "not a text file")],
)
def test_unreadable_snapshot(tmp_path: Path, content: bytes, words: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    result = affrun("plan", "--topology", str(bad))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert str(bad) in result.stderr and words in result.stderr


def test_missing_snapshot(tmp_path: Path) -> None:
    result = affrun("topology", "--topology", str(tmp_path / "absent.json"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "No such file" in result.stderr


def test_save_to_unwritable_place(tmp_path: Path) -> None:
    target = tmp_path / "no-dir" / "snap.json"
    result = affrun("topology", "--fsroot", str(gpu_machine(tmp_path)), "--save", str(target))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and str(target) in result.stderr


def test_plan_from_snapshot_names_the_snapshot(tmp_path: Path) -> None:
    root = gpu_machine(tmp_path)
    snapshot = tmp_path / "snap.json"
    ok(affrun("topology", "--fsroot", str(root), "--save", str(snapshot)))
    table = ok(affrun("plan", "--topology", str(snapshot)))
    assert f"source snapshot {snapshot} (taken from fsroot {root})" in table, table
    assert f"source   snapshot {snapshot} (taken from fsroot {root})" in ok(affrun("topology", "--topology", str(snapshot)))
