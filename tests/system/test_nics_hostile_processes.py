"""NIC data that lies (issue 34, class 5) through the commands a user runs: ``affrun topology`` (text, JSON,
``--save`` and ``--topology`` on the snapshot), ``affrun plan --json``, ``affrun exec --dry-run --nic-env ucx`` and a
real rank, ``affrun doctor``, on fake sysfs trees whose NICs have odd names or lying ports, an hwloc XML that nests
its OS devices wrongly, and hostile snapshots. Each odd name is shown escaped in text and exact in JSON; a rank is
given no NIC rather than a mangled or a farther one; bad input is one ``affrun: error:`` line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.base.untrusted import shown
from tests.fakesys import (
    FakeNIC,
    dgx_like,
    lie_about_nics,
    nic_xml,
    rename_nics,
    this_machine_with_gpus,
    write_tree,
    xml_nic,
)
from tests.launch import affrun, affrun_argv, clean_env

# GPU i's switch NIC renamed (tests/fakesys.py dgx_like: mlx5_0,3,5,4 on package 0, mlx5_9,6,11,10 on package 1)
ODD = {"mlx5_0": "mlx5\n0", "mlx5_3": "mlx5,3", "mlx5_5": "mlx5_\udcff", "mlx5_4": "$(id);`x`",
       "mlx5_9": "mlx5\x1b[31m9", "mlx5_6": "all"}
# the ranks of GPUs 6 and 7 keep theirs; 0-5 get none (not the storage NICs, which are farther)
ODD_ANSWER = [None] * 6 + ["mlx5_11:1", "mlx5_10:1"]
GPU0 = "0000:1b:00.0"


@pytest.fixture
def odd(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "odd", rename_nics(dgx_like(), ODD))


def ok(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = affrun(*args, env=env)  # text=True: output that is not UTF-8 fails here
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    return result


def test_topology_shows_odd_names_escaped_and_json_keeps_them_exact(odd: Path, tmp_path: Path) -> None:
    text = ok("topology", "--fsroot", str(odd)).stdout
    lines = [ln for ln in text.splitlines() if ln.startswith("nic ")]
    assert len(lines) == 13 and all(ln.isprintable() for ln in text.splitlines())
    for name in ODD.values():
        assert any(ln.startswith(f"nic {shown(name)} ") for ln in lines), name
    assert "nic mlx5\\n0 " in text and "\x1b" not in text and "nic mlx5_\\udcff " in text
    listed = json.loads(ok("topology", "--fsroot", str(odd), "--json").stdout)["nics"]
    assert set(ODD.values()) <= {n["name"] for n in listed}
    saved = tmp_path / "snap.json"
    ok("topology", "--fsroot", str(odd), "--save", str(saved))
    assert json.loads(ok("topology", "--topology", str(saved), "--json").stdout)["nics"] == listed


def test_plan_gives_no_rank_a_nic_its_variables_cannot_name(odd: Path, tmp_path: Path) -> None:
    saved = tmp_path / "snap.json"
    ok("topology", "--fsroot", str(odd), "--save", str(saved))
    for source in (("--fsroot", str(odd)), ("--topology", str(saved))):
        data = json.loads(ok("plan", *source, "--json").stdout)
        assert [r["nic"]["device"] if r["nic"] else None for r in data["ranks"]] == ODD_ANSWER
        assert [r["env"]["AFFRUN_NIC"] for r in data["ranks"]] == ["" if d is None else d for d in ODD_ANSWER]
        for rank, name in enumerate(ODD.values()):
            assert f"rank {rank}: no NIC: the nearest, {name!r}, has a name AFFRUN_NIC and UCX_NET_DEVICES cannot " \
                   "carry" in "\n".join(data["warnings"]), name
    table = ok("plan", "--fsroot", str(odd))
    assert all(ln.isprintable() for ln in (table.stdout + table.stderr).splitlines())


def test_exec_dry_run_exports_no_mangled_nic(odd: Path) -> None:
    for rank, nic in ((0, None), (3, None), (6, "mlx5_11:1")):
        env = {"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "8"}
        out = ok("exec", "--fsroot", str(odd), "--dry-run", "--nic-env", "ucx", "--", "true", env=env).stdout
        lines = out.splitlines()
        assert all(ln.isprintable() for ln in lines)
        variables = dict(ln.split("=", 1) for ln in lines if "=" in ln and not ln.startswith(("exec", "note")))
        assert variables["AFFRUN_NIC"] == (nic or "")
        assert variables.get("UCX_NET_DEVICES") == nic
        assert f" nic {nic or '-'} " in lines[0]
        if nic is None:
            assert any(ln.startswith(f"note: no NIC: the nearest, {shown(repr(list(ODD.values())[rank]))}")
                       for ln in lines), lines


def test_a_real_rank_sees_no_mangled_nic(tmp_path: Path) -> None:
    # this machine's CPUs, two fake GPUs behind one switch with one NIC, named "mlx5,0 x": the rank runs
    m = this_machine_with_gpus(2)
    switch = ("pci0000:20", "0000:20:01.0", "0000:21:00.0")
    for i, gpu in enumerate(m.gpus):
        m.pci_paths[gpu.pci] = (*switch, f"0000:22:{i:02x}.0")
    m.nics.append(FakeNIC("mlx5,0 x", "0000:25:00.0", 0))
    m.pci_paths["0000:25:00.0"] = (*switch, "0000:22:05.0")
    root = write_tree(tmp_path / "m", m)
    code = "import os; print(repr(os.environ['AFFRUN_NIC']), repr(os.environ.get('UCX_NET_DEVICES')))"
    result = subprocess.run(affrun_argv("exec", "--fsroot", str(root), "--nic-env", "ucx", "--", sys.executable, "-c",
                                        code), env=clean_env(LOCAL_RANK="0", LOCAL_WORLD_SIZE="2"), capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["''", "None"]


def test_doctor_shows_odd_names_escaped_and_exact_in_json(odd: Path) -> None:
    env = {"AFFRUN_GPU_PCI": GPU0, "AFFRUN_CPUS": "0-7", "UCX_NET_DEVICES": "mlx5_1:1"}
    text = affrun("doctor", "--fsroot", str(odd), env=env)
    assert text.returncode in (0, 1) and "Traceback" not in text.stderr, text.stderr
    (line,) = [ln for ln in text.stdout.splitlines() if " nic-far" in ln]
    assert "but mlx5\\n0 is nearer" in line and line.isprintable() and "cannot be written in UCX_NET_DEVICES" in line
    data = json.loads(affrun("doctor", "--fsroot", str(odd), "--json", env=env).stdout)
    (far,) = [f for f in data["findings"] if f["id"] == "nic-far"]
    assert "but mlx5\n0 is nearer" in far["message"]


def test_lying_ports_and_links_through_the_cli(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "lies", dgx_like())
    lies = ("rate-nan", "rate-huge", "rate-negative", "rate-digits", "rate-word", "rate-unit", "link-layer",
            "port-huge", "port-word", "port-twice", "alias", "operstate")
    broken = {lie_about_nics(root, case) for case in lies}
    data = json.loads(ok("topology", "--fsroot", str(root), "--json").stdout)
    assert not broken & {n["name"] for n in data["nics"]}
    assert all(any(repr(name) in w for w in data["warnings"]) for name in broken)
    # left: mlx5_2 (its port down) and mlx5_7, package 1's storage NIC; every rank takes mlx5_7, the only one
    assert {n["name"] for n in data["nics"]} == {"mlx5_2", "mlx5_7"}
    plan = json.loads(ok("plan", "--fsroot", str(root), "--json").stdout)
    assert [r["nic"]["device"] for r in plan["ranks"]] == ["mlx5_7:1"] * 8


def test_hwloc_xml_that_nests_wrongly_through_the_cli(tmp_path: Path) -> None:
    stray = '<object type="OSDev" name="stray0" osdev_type="3"><info name="Port1State" value="4"/></object>'
    io = (stray + xml_nic("mlx5&#10;0", inner=stray) + xml_nic("", "0000:11:00.1")
          + xml_nic("mlx5_2", "0000:11:00.2", "banana") + xml_nic("mlx5_3", "0000:11:00.3")
          + xml_nic("mlx5_3", "0000:11:00.4"))
    path = tmp_path / "nics.xml"
    path.write_text(nic_xml(io))
    data = json.loads(ok("topology", "--topology", str(path), "--json").stdout)
    assert [n["name"] for n in data["nics"]] == ["mlx5\n0"] and len(data["warnings"]) == 2
    plan = json.loads(ok("plan", "--topology", str(path), "--json").stdout)
    assert [r["nic"] for r in plan["ranks"]] == [None]
    text = ok("topology", "--topology", str(path)).stdout
    assert "nic mlx5\\n0 " in text


@pytest.mark.parametrize(("field", "value"), [("name", "mlx5\x000"), ("name", "m" * 1_000_000), ("name", 7),
                                              ("ports", [{"number": 1, "state": "active"}] * 2),
                                              ("ports", [{"number": 1, "state": "active", "rate_gbps": 1e308}])])
def test_a_hostile_snapshot_nic_is_one_error_line(tmp_path: Path, field: str, value: object) -> None:
    saved = tmp_path / "snap.json"
    ok("topology", "--fsroot", str(write_tree(tmp_path / "dgx", dgx_like())), "--save", str(saved))
    data = json.loads(saved.read_text())
    data["nics"][1][field] = value
    saved.write_text(json.dumps(data))
    result = affrun("plan", "--topology", str(saved), "--json")
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("affrun: error: ") and "nics[1]" in line and len(line) < 400


def test_an_hwloc_xml_name_with_an_escape_sequence_is_one_error_line(tmp_path: Path) -> None:
    # XML 1.0 has no ESC (&#x1b; is not a character): the export is not XML, and the command says so in one line
    path = tmp_path / "esc.xml"
    path.write_text(nic_xml(xml_nic("mlx5&#x1b;[31m")))
    result = affrun("plan", "--topology", str(path), "--json")
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("affrun: error: ") and "not well-formed XML" in line
