"""Reading affrun show's pictures back: the text cells, the SVG, and which rank owns each core."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from launcher.plan.planner import Plan, Request, make_plan
from launcher.topology.model import Core, Topology
from tests.fakesys import FakeGPU, uniform, write_tree

SVG_NS = "{http://www.w3.org/2000/svg}"


# a core in the plain picture: [first CPU, its kind's letter where there are two kinds or more, owner]
CELL = re.compile(r"\[\s*(\d+)([A-Za-z?]?) ([0-9A-Za-z.+\-]+)\s*\]")


# ------------------------------------------------------------------------------------------------ machines
def two_node_four_gpus(root: Path) -> Path:
    """2 packages x 8 cores x 2 threads, one NUMA node each, 2 GPUs per node."""
    m = uniform(2, 8, threads=2)
    m.gpus = [FakeGPU(pci=f"0000:{bus:02x}:00.0", numa_node=node)
              for bus, node in ((0x17, 0), (0x31, 0), (0x98, 1), (0xB1, 1))]
    return write_tree(root, m)


def plan_for(topo: Topology, nproc: int, **kw: object) -> Plan:
    return make_plan(topo, Request(nproc=nproc, **kw))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ readers
def cells(text: str) -> dict[int, str]:
    """First CPU of each drawn core -> its owner marker, from a plain picture; every core must appear once. The
    legend, below the picture, reads its first box aloud: it is not a core."""
    found: dict[int, str] = {}
    for cpu, _, marker in CELL.findall(text.split("\nLegend ")[0]):
        assert int(cpu) not in found, f"CPU {cpu} drawn twice"
        found[int(cpu)] = marker
    return found


def owners(plan: Plan, core: Core) -> list[int]:
    return sorted(r.local_rank for r in plan.ranks if set(core.pus) & set(r.cpus))


def expected_marker(topo: Topology, plan: Plan, core: Core) -> str:
    ranks = owners(plan, core)
    if not ranks:
        return "." if set(core.pus) & topo.allowed else "x"
    if len(ranks) > 1:
        return "+".join(map(str, ranks)) if len(ranks) == 2 else f"{ranks[0]}-{ranks[-1]}"
    rank = next(r for r in plan.ranks if r.local_rank == ranks[0])
    mine = [p for p in core.pus if p in rank.cpus]
    return f"{ranks[0]}L" if all(p in rank.loader_cpus for p in mine) else str(ranks[0])


def assert_every_core_under_its_owner(topo: Topology, plan: Plan, text: str) -> None:
    drawn = cells(text)
    assert set(drawn) >= {c.pus[0] for c in topo.cores}
    for core in topo.cores:
        assert drawn[core.pus[0]] == expected_marker(topo, plan, core), core
    for rank in plan.ranks:  # and the other way round: every CPU of every rank is inside a cell of that rank
        for cpu in rank.cpus:
            core = next(c for c in topo.cores if cpu in c.pus)
            assert str(rank.local_rank) in re.split(r"[+L-]", drawn[core.pus[0]]) or "-" in drawn[core.pus[0]]


def svg_root(text: str) -> ET.Element:
    return ET.fromstring(text)


def rects(root: ET.Element, cls: str) -> list[ET.Element]:
    return [r for r in root.iter(f"{SVG_NS}rect") if cls in (r.get("class") or "").split()]

