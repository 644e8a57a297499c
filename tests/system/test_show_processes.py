"""test_show: the tests that start processes or load real runtimes (tests/system). The in-process ones are tests/unit/test_show.py."""

from __future__ import annotations

from pathlib import Path

from launcher.topology import load_topology
from tests.drawing import assert_every_core_under_its_owner, plan_for, rects, svg_root, two_node_four_gpus
from tests.launch import affrun


def test_reserved_cpus_in_plan_json_and_table(tmp_path: Path) -> None:
    import json

    root = two_node_four_gpus(tmp_path / "m")
    shown = affrun("plan", "--fsroot", str(root), "--nproc-per-node", "2", "--reserve", "0", "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    topo = load_topology(fsroot=str(root), environ={})
    (core0,) = [c for c in topo.cores if 0 in c.pus]
    assert data["reserved"] == sorted(core0.pus)
    assert not set(data["reserved"]) & {p for r in data["ranks"] for p in r["cpus"]}
    table = affrun("plan", "--fsroot", str(root), "--nproc-per-node", "2", "--reserve", "0")
    assert f"reserved {','.join(map(str, sorted(core0.pus)))}" in table.stdout
    plain = json.loads(affrun("plan", "--fsroot", str(root), "--nproc-per-node", "2", "--json").stdout)
    assert plain["reserved"] == []


def test_cli_show_writes_the_svg(tmp_path: Path) -> None:
    root = two_node_four_gpus(tmp_path / "m")
    out = tmp_path / "out.svg"
    proc = affrun("show", "--fsroot", str(root), "--nproc-per-node", "4", "--svg", str(out), "--no-color")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout
    topo = load_topology(fsroot=str(root), environ={})
    assert_every_core_under_its_owner(topo, plan_for(topo, 4), proc.stdout)
    assert len(rects(svg_root(out.read_text(encoding="utf-8")), "core")) == len(topo.cores)
    assert f"wrote {out}" in proc.stdout


def test_cli_show_bad_svg_path_is_one_clear_error(tmp_path: Path) -> None:
    root = two_node_four_gpus(tmp_path / "m")
    proc = affrun("show", "--fsroot", str(root), "--svg", str(tmp_path / "missing" / "x.svg"), "--no-color")
    assert proc.returncode != 0
    assert proc.stderr.startswith("affrun: error: ") and "Traceback" not in proc.stderr


def test_cli_show_color_emits_ansi_even_into_a_pipe(tmp_path: Path) -> None:
    root = two_node_four_gpus(tmp_path / "m")
    proc = affrun("show", "--fsroot", str(root), "--nproc-per-node", "4", "--color")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[48;5;" in proc.stdout
