"""Save a :class:`Topology` as JSON (``affrun topology --save``) and load it back (``--topology FILE.json``)."""

from __future__ import annotations

import json
from typing import Any

from launcher.cpulist import format_cpulist, parse_cpulist
from launcher.errors import TopologyError
from launcher.topology.model import GPU, Core, L3Group, NumaNode, Package, Topology

FORMAT = "affrun-topology/1"


def to_snapshot(topo: Topology) -> dict[str, Any]:
    def cl(cpus: Any) -> str:
        return format_cpulist(cpus)

    return {
        "format": FORMAT,
        "source": topo.source,
        "online": cl(topo.online),
        "offline": cl(topo.offline),
        "allowed": cl(topo.allowed),
        "allowed_mems": None if topo.allowed_mems is None else cl(topo.allowed_mems),
        "packages": [{"os_index": p.os_index, "cpus": cl(p.cpus)} for p in topo.packages],
        "numa_nodes": [
            {"os_index": n.os_index, "cpus": cl(n.cpus), "distances": {str(k): v for k, v in n.distances.items()},
             "memory_kb": n.memory_kb}
            for n in topo.numa_nodes
        ],
        "l3_groups": [cl(g.cpus) for g in topo.l3_groups],
        "cores": [
            {"os_index": c.os_index, "pus": list(c.pus), "package": c.package, "numa_node": c.numa_node, "l3": c.l3}
            for c in topo.cores
        ],
        "gpus": [
            {"index": g.index, "pci": g.pci, "vendor": g.vendor, "numa_node": g.numa_node, "cpus": cl(g.cpus),
             "uuid": g.uuid, "memory_node": g.memory_node}
            for g in topo.gpus
        ],
        "warnings": list(topo.warnings),
    }


def from_snapshot(data: Any, where: str = "snapshot") -> Topology:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TopologyError(f"{where}: not an affrun topology snapshot (expected \"format\": \"{FORMAT}\")")
    try:
        mems = data.get("allowed_mems")
        return Topology(
            packages=tuple(Package(p["os_index"], parse_cpulist(p["cpus"])) for p in data["packages"]),
            numa_nodes=tuple(
                NumaNode(n["os_index"], parse_cpulist(n["cpus"]), {int(k): int(v) for k, v in n["distances"].items()},
                         n.get("memory_kb"))
                for n in data["numa_nodes"]
            ),
            l3_groups=tuple(L3Group(parse_cpulist(g)) for g in data["l3_groups"]),
            cores=tuple(Core(c["os_index"], tuple(c["pus"]), c["package"], c["numa_node"], c["l3"]) for c in data["cores"]),
            online=parse_cpulist(data["online"]),
            offline=parse_cpulist(data["offline"]),
            allowed=parse_cpulist(data["allowed"]),
            allowed_mems=None if mems is None else parse_cpulist(mems),
            gpus=tuple(
                GPU(g["index"], g["pci"], g["vendor"], g["numa_node"], parse_cpulist(g["cpus"]), g.get("uuid"),
                    g.get("memory_node"))
                for g in data["gpus"]
            ),
            source=f"snapshot {where}",
            warnings=tuple(data.get("warnings", ())),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TopologyError(f"{where}: malformed topology snapshot ({type(exc).__name__}: {exc})") from None


def load_snapshot(path: str) -> Topology:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise TopologyError(f"{path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise TopologyError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    return from_snapshot(data, path)
