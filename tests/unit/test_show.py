"""``affrun show``: the picture and the SVG/HTML map, checked the way a user reads them.

Machines come from fake sysfs trees (tests/fakesys.py) and from hwloc's captured trees (shared fixtures).
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from xml.sax.saxutils import escape as sax_escape

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.base.cpulist import parse_cpulist
from launcher.show.svg import escape, svg
from launcher.show.terminal import picture
from launcher.topology import load_topology
from launcher.topology.model import Topology
from tests.conftest import live_root
from tests.drawing import (
    CELL,
    SVG_NS,
    assert_every_core_under_its_owner,
    cells,
    owners,
    plan_for,
    rects,
    svg_root,
    two_node_four_gpus,
)
from tests.fakesys import FakeGPU, FakeMachine, uniform, write_live_like, write_tree

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def big_machine(root: Path) -> Path:
    """256 cores in 8 packages / 8 NUMA nodes, one GPU per node."""
    m = uniform(8, 32)
    m.gpus = [FakeGPU(pci=f"0000:{0x10 + 0x10 * i:02x}:00.0", numa_node=i) for i in range(8)]
    return write_tree(root, m)


@pytest.fixture
def two_node(tmp_path: Path) -> Topology:
    return load_topology(fsroot=str(two_node_four_gpus(tmp_path / "two")), environ={})


def kind_letters_drawn(text: str) -> dict[int, str]:
    """First CPU of each drawn core -> the kind letter after its id ("" where none is drawn)."""
    return {int(cpu): letter for cpu, letter, _ in CELL.findall(text.split("\nLegend ")[0])}


def drawing(text: str) -> list[str]:
    """The lines of the machine drawing (the part above the legend)."""
    lines = text.splitlines()
    return lines[: next(i for i, ln in enumerate(lines) if ln.startswith("Legend"))]


def swatch_colors(root: ET.Element) -> dict[int, str]:
    return {int(r.get("data-rank", "-1")): r.get("fill", "") for r in rects(root, "swatch")}


# ------------------------------------------------------------------------------------------------ picture
def test_each_core_shows_its_owner_and_loader_cores_differ(two_node: Topology) -> None:
    plan = plan_for(two_node, 4, loader_cores=1)
    text = picture(two_node, plan, color=False)
    assert_every_core_under_its_owner(two_node, plan, text)
    drawn = cells(text)
    for rank in plan.ranks:
        loader_cores = {c.pus[0] for c in two_node.cores if set(c.pus) <= set(rank.loader_cpus)}
        assert loader_cores, "the plan keeps one DataLoader core per rank"
        assert {drawn[c] for c in loader_cores} == {f"{rank.local_rank}L"}
        compute = {core[0] for core in rank.compute_cores}
        assert {drawn[c] for c in compute} == {str(rank.local_rank)}


def test_legend_lists_every_rank_with_cpus_gpu_and_threads(two_node: Topology) -> None:
    from launcher.base.cpulist import format_cpulist

    plan = plan_for(two_node, 4, loader_cores=1)
    lines = picture(two_node, plan, color=False).splitlines()
    legend = lines[lines.index(next(ln for ln in lines if ln.startswith("Legend"))):]
    for rank in plan.ranks:
        row = next(ln for ln in legend if ln.startswith(f"[{rank.local_rank:>2}]"))
        cols = row.split()
        assert cols[2] == str(rank.gpu) and cols[3] == rank.gpu_pci and cols[4] == (rank.nic_device or "-")
        assert cols[5] == str(rank.threads)
        assert format_cpulist(rank.cpus) in row and format_cpulist(rank.loader_cpus) in row


def test_gpus_are_drawn_beside_their_node_with_their_rank(two_node: Topology) -> None:
    plan = plan_for(two_node, 3)  # GPU 3 is left without a rank
    lines = drawing(picture(two_node, plan, color=False))
    node_line = {n: next(i for i, ln in enumerate(lines) if f"NUMA {n} " in ln) for n in (0, 1)}
    for visible, gpu in enumerate(two_node.visible_gpus()):
        (row,) = [i for i, ln in enumerate(lines) if gpu.pci in ln]
        other = 1 - (gpu.numa_node or 0)
        if gpu.numa_node == 0:
            assert node_line[0] <= row < node_line[other], f"GPU {visible} is not beside NUMA 0"
        else:
            assert row > node_line[1]
        users = [r.local_rank for r in plan.ranks if r.gpu == visible]
        assert (f"[rank {users[0]}]" if users else "no rank") in lines[row]
        title = next(ln for ln in lines[row - 2 : row] if f"GPU {visible} " in ln)
        assert title


def test_power9_gpus_their_memory_nodes_and_cpuless_nodes(hwloc_root) -> None:  # type: ignore[no-untyped-def]
    topo = load_topology(fsroot=str(hwloc_root("nvidiagpunumanodes")), environ={})
    plan = plan_for(topo, 6)
    text = picture(topo, plan, color=False)
    lines = drawing(text)
    assert_every_core_under_its_owner(topo, plan, text)
    node8 = next(i for i, ln in enumerate(lines) if "NUMA 8 " in ln)
    assert len(topo.visible_gpus()) == 6
    for visible, gpu in enumerate(topo.visible_gpus()):
        (row,) = [i for i, ln in enumerate(lines) if gpu.pci in ln]
        near_node8 = min(gpu.cpus) >= 88
        assert (row > node8) == near_node8, f"GPU {visible} ({gpu.pci}) drawn beside the wrong node"
        assert f"[rank {visible}]" in lines[row]
        # its CPU-less memory node is drawn as such, on the GPU's row
        assert gpu.memory_node is not None
        assert f"NUMA {gpu.memory_node} · no CPUs" in lines[row - 1]
    cpuless = [n.os_index for n in topo.numa_nodes if not n.cpus]
    assert len(cpuless) == 6 and all(f"NUMA {n} · no CPUs" in text for n in cpuless)


def test_cpuless_memory_nodes_without_gpus_sit_by_the_nearest_node(hwloc_root) -> None:  # type: ignore[no-untyped-def]
    topo = load_topology(fsroot=str(hwloc_root("64intel64-fakeKNL-SNC4-hybrid")), environ={})
    plan = plan_for(topo, 4, mode="numa")
    lines = picture(topo, plan, color=False).splitlines()
    for node in (n for n in topo.numa_nodes if not n.cpus):
        nearest = min((n for n in topo.numa_nodes if n.cpus), key=lambda n: node.distances[n.os_index])
        (row,) = [i for i, ln in enumerate(lines) if f"NUMA {node.os_index} · no CPUs" in ln]
        assert f"NUMA {nearest.os_index} " in lines[row], f"NUMA {node.os_index} should sit by NUMA {nearest.os_index}"


def test_shared_modes_show_every_sharing_rank(two_node: Topology) -> None:
    plan = plan_for(two_node, 4, mode="numa")
    assert all(r.shared for r in plan.ranks)
    text = picture(two_node, plan, color=False)
    assert_every_core_under_its_owner(two_node, plan, text)
    assert set(cells(text).values()) == {"0+1", "2+3"}
    plan = plan_for(two_node, 4, mode="socket")
    text = picture(two_node, plan, color=False)
    assert set(cells(text).values()) == {"0+1", "2+3"}


def test_disallowed_and_offline_cpus(hwloc_root) -> None:  # type: ignore[no-untyped-def]
    topo = load_topology(fsroot=str(hwloc_root("16amd64-8n2c-cpusets")), environ={})
    plan = plan_for(topo, 2)
    text = picture(topo, plan, color=False)
    drawn = cells(text)
    assert_every_core_under_its_owner(topo, plan, text)
    disallowed = [c.pus[0] for c in topo.cores if not set(c.pus) & topo.allowed]
    assert disallowed and all(drawn[c] == "x" for c in disallowed)
    assert topo.offline and all(drawn[c] == "-" for c in topo.offline)
    assert "x not allowed" in text and "- offline" in text
    for w in plan.warnings:
        assert w.split()[0] in text.split("warning:", 1)[1]


def test_reserved_cores_are_drawn_as_reserved_not_free(two_node: Topology) -> None:
    """--reserve 0,17: both CPUs' whole cores (0/16 and 1/17 are SMT siblings) are marked r, in the picture and SVG."""
    plan = plan_for(two_node, 2, reserve=frozenset({0, 17}))
    reserved_cores = [c for c in two_node.cores if {0, 17} & set(c.pus)]
    assert len(reserved_cores) == 2
    assert sorted(plan.reserved) == sorted(p for c in reserved_cores for p in c.pus)
    assert not set(plan.reserved) & {p for r in plan.ranks for p in r.cpus}
    text = picture(two_node, plan, color=False)
    drawn = cells(text)
    assert {drawn[c.pus[0]] for c in reserved_cores} == {"r"}
    assert "r reserved (--reserve)" in text
    unreserved = [c for c in two_node.cores if c not in reserved_cores and not owners(plan, c)]
    assert all(drawn[c.pus[0]] == "." for c in unreserved)
    root = svg_root(svg(two_node, plan))
    marked = {int(r.get("data-cpu", "-1")) for r in rects(root, "core") if "reserved" in (r.get("class") or "")}
    assert marked == {c.pus[0] for c in reserved_cores}


@pytest.mark.parametrize("width", [80, 120])
def test_big_machines_fit_the_terminal(tmp_path: Path, hwloc_root, width: int) -> None:  # type: ignore[no-untyped-def]
    machines = [
        load_topology(fsroot=str(big_machine(tmp_path / "big")), environ={}),
        load_topology(fsroot=str(hwloc_root("256ppc-8n8s4t")), environ={}),
    ]
    for topo in machines:
        for plan in (plan_for(topo, 8), plan_for(topo, 16, mode="numa"), plan_for(topo, 32, loader_cores=1)):
            text = picture(topo, plan, color=False, width=width)
            too_wide = [ln for ln in text.splitlines() if len(ln) > width]
            assert not too_wide, too_wide[:3]
            assert_every_core_under_its_owner(topo, plan, text)
            assert len(text.splitlines()) < 12 * len(topo.cores), "cores are wrapped into rows, not one per line"


def test_the_live_machine_is_drawn_core_by_core() -> None:
    """This host, whatever it is (or the fake live tree of AFFRUN_TEST_LIVE): only what holds on every Linux
    host. The allowed CPUs are this process's affinity (outside a Slurm step) and online in sysfs; every core is
    drawn once, under its owner, within 80 columns, with a kind letter exactly where there are two kinds."""
    topo = load_topology()
    online = parse_cpulist((live_root() / "sys/devices/system/cpu/online").read_text().strip())
    assert topo.allowed and topo.allowed <= online
    if "AFFRUN_FSROOT" not in os.environ and not any(k.startswith("SLURM_") for k in os.environ):
        assert topo.allowed == frozenset(os.sched_getaffinity(0))
    plan = plan_for(topo, 1)
    text = picture(topo, plan, color=False)
    assert_every_core_under_its_owner(topo, plan, text)
    assert all(len(ln) <= 80 for ln in text.splitlines())
    assert_kind_letters(topo, text)


def assert_kind_letters(topo: Topology, text: str) -> None:
    """Each core carries its kind's letter where the allowed CPUs hold two kinds or more, else none; the legend
    names each letter once."""
    kinds = topo.kinds()
    letters = kind_letters_drawn(text)
    legend = text.split("\nLegend ", 1)[1].split("\nrank ", 1)[0]
    if not kinds.hybrid:
        assert set(letters.values()) == {""}, letters
        assert "the letter after the id" not in text
        return
    by_kind: dict[str, set[str]] = {}
    for core in topo.cores:
        kind = kinds.kind_of(core.pus[0])
        by_kind.setdefault(kind.name if kind else "", set()).add(letters[core.pus[0]])
    assert all(len(v) == 1 for v in by_kind.values()), by_kind
    for kind in kinds.kinds:
        (letter,) = by_kind[kind.name]
        assert re.search(rf"(^|\s){letter} {re.escape(kind.name)}", legend), (letter, kind.name, legend)


@pytest.mark.parametrize(("variant", "cpus", "kinds"), [
    ("uniform-capacity", None, 1),  # issue 26: one cpu_capacity for every CPU
    ("no-cpufreq", None, 1),
    ("one-kind", None, 1),  # a hybrid part whose cgroup allows only its P-cores
    ("hybrid", "0-1", 1),  # narrowed to the P-cores by --cpus
    ("hybrid", "2-3", 1),  # ... and to the E-cores
    ("hybrid", None, 2),
    ("arm64", None, 0),
])
def test_one_core_kind_is_drawn_without_letters(tmp_path: Path, variant: str, cpus: str | None, kinds: int) -> None:
    topo = load_topology(fsroot=str(write_live_like(tmp_path / "t", variant, cpus=range(4))), cpus=cpus, environ={})
    assert len(topo.kinds().kinds) == kinds
    for plan in (plan_for(topo, 1), plan_for(topo, 2)):
        text = picture(topo, plan, color=False)
        assert_every_core_under_its_owner(topo, plan, text)
        assert_kind_letters(topo, text)
        assert len(rects(svg_root(svg(topo, plan)), "core")) == len(topo.cores)


def test_an_xml_with_one_cpukind_is_drawn(fixtures_dir: Path) -> None:
    """hwloc exports of homogeneous machines hold one ``<cpukind>`` (``32amd64-4s2n4c-cgroup2``): no letter."""
    topo = load_topology(topology_file=str(fixtures_dir / "hwloc-linux" / "32amd64-4s2n4c-cgroup2.xml"), environ={})
    assert len(topo.kinds().kinds) == 1
    plan = plan_for(topo, 4)
    text = picture(topo, plan, color=False)
    assert_every_core_under_its_owner(topo, plan, text)
    assert_kind_letters(topo, text)


def test_colour_marks_each_rank_with_its_own_background(two_node: Topology) -> None:
    plan = plan_for(two_node, 4, loader_cores=1)
    plain = picture(two_node, plan, color=False)
    coloured = picture(two_node, plan, color=True)
    backgrounds = set(re.findall(r"\x1b\[48;5;(\d+);", coloured))
    assert len(backgrounds) == 8, "4 ranks x (compute, DataLoader tint)"
    stripped = ANSI.sub("", coloured).splitlines()
    assert [len(ln) for ln in stripped] == [len(ln) for ln in plain.splitlines()], "same layout with and without colour"
    # each rank's compute cores share one background, distinct from every other rank's
    per_rank: dict[int, set[str]] = {}
    for rank in plan.ranks:
        first = str(rank.compute_cores[0][0])
        line = next(ln for ln in coloured.splitlines() if re.search(rf"\x1b\[48;5;\d+;38;5;16m\s+{first} {rank.local_rank}\s", ln))
        per_rank[rank.local_rank] = set(re.findall(rf"\x1b\[48;5;(\d+);38;5;16m\s+{first} ", line))
    assert len({frozenset(v) for v in per_rank.values()}) == 4


# ------------------------------------------------------------------------------------------------ SVG / HTML
def test_svg_has_one_rect_per_core_in_the_legend_colour_of_its_rank(two_node: Topology) -> None:
    plan = plan_for(two_node, 4, loader_cores=1)
    root = svg_root(svg(two_node, plan))
    cores = rects(root, "core")
    assert sorted(int(r.get("data-cpu", "-1")) for r in cores) == sorted(c.pus[0] for c in two_node.cores)
    legend = swatch_colors(root)
    assert sorted(legend) == [0, 1, 2, 3] and len(set(legend.values())) == 4
    for rect in cores:
        core = next(c for c in two_node.cores if c.pus[0] == int(rect.get("data-cpu", "-1")))
        (rank,) = owners(plan, core)
        assert rect.get("data-ranks") == str(rank)
        if "loader" in (rect.get("class") or ""):
            assert rect.get("fill") != legend[rank]  # a lighter tint of the same rank
            assert set(core.pus) <= set(plan.ranks[rank].loader_cpus)
        else:
            assert rect.get("fill") == legend[rank]
    texts = "".join(root.itertext())
    for gpu in two_node.visible_gpus():
        assert gpu.pci in texts
    assert len(rects(root, "package")) == 2 and len(rects(root, "numa")) == 2 and len(rects(root, "gpu")) == 4


def test_svg_shared_cores_are_striped_with_every_sharer(two_node: Topology) -> None:
    plan = plan_for(two_node, 4, mode="numa")
    root = svg_root(svg(two_node, plan))
    legend = swatch_colors(root)
    patterns = {p.get("id"): p for p in root.iter(f"{SVG_NS}pattern")}
    for rect in rects(root, "core"):
        ranks = [int(x) for x in (rect.get("data-ranks") or "").split(",")]
        assert len(ranks) == 2
        match = re.fullmatch(r"url\(#(.+)\)", rect.get("fill", ""))
        assert match, rect.attrib
        stripes = {r.get("fill") for r in patterns[match.group(1)].iter(f"{SVG_NS}rect")}
        assert stripes == {legend[r] for r in ranks}


def test_svg_is_self_contained(hwloc_root) -> None:  # type: ignore[no-untyped-def]
    topo = load_topology(fsroot=str(hwloc_root("nvidiagpunumanodes")), environ={})
    text = svg(topo, plan_for(topo, 2, loader_cores=1))
    root = svg_root(text)
    assert root.tag == f"{SVG_NS}svg"
    assert not list(root.iter(f"{SVG_NS}image")) and not list(root.iter(f"{SVG_NS}script"))
    assert "http" not in text.replace("http://www.w3.org/2000/svg", "")
    assert len(rects(root, "cpuless")) == 6


def test_map_document_svg_and_html(two_node: Topology) -> None:
    plan = plan_for(two_node, 4)
    svg_text = svg(two_node, plan, html=False)
    assert len(rects(svg_root(svg_text), "core")) == len(two_node.cores)
    page = svg(two_node, plan, html=True)
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page
    embedded = page[page.index("<svg") : page.index("</svg>") + len("</svg>")]
    assert len(rects(svg_root(embedded), "core")) == len(two_node.cores)


def test_pure_same_input_same_output(two_node: Topology) -> None:
    plan = plan_for(two_node, 4)
    assert picture(two_node, plan, color=True) == picture(two_node, plan, color=True)
    assert svg(two_node, plan) == svg(two_node, plan)


# ------------------------------------------------------------------------------------------------ CLI


def test_crossing_packages_and_nodes_are_drawn_as_parts(tmp_path: Path) -> None:
    m = FakeMachine(cores=[(i,) for i in range(8)], node_of_core=[0, 0, 0, 0, 0, 1, 1, 1],
                    package_of_core=[0, 0, 0, 1, 1, 1, 1, 1])
    topo = load_topology(fsroot=str(write_tree(tmp_path / "x", m)), environ={})
    plan = plan_for(topo, 3)
    text = picture(topo, plan, color=False)
    assert_every_core_under_its_owner(topo, plan, text)
    assert text.count("NUMA 0 (part)") == 2 and "Package 1" in text


@given(st.text(alphabet=st.sampled_from("&<>\"'a;#\n\t\u00e9") | st.characters()))
def test_the_svg_escapes_text_as_the_standard_library_does(text: str) -> None:
    """svg.py's own escape (no xml.sax import) writes what ``xml.sax.saxutils.escape`` writes, byte for byte."""
    assert escape(text) == sax_escape(text)
