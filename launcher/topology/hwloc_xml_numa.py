"""An hwloc XML export's attributes (bitmaps, integers), its NUMA nodes (each ``NUMANode``'s CPUs, each PU's node,
a broken table's warning), the NUMA latency matrix (``distances2``, 1.x ``distances``) and the node an I/O object
(GPU, NIC) is local to. Pure; the rules hwloc follows and affrun with it: docs/design.md §6."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.base.cpulist import MAX_NODE_ID, cpu_error, format_cpulist, id_text, parse_hexmask
from launcher.base.untrusted import ascii_int, ascii_uint, clip, short
from launcher.topology.model import NumaNode

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET
    from collections.abc import Sequence


class BadXML(Exception):
    """Something in the file is not what hwloc writes (message says what)."""


def mask(element: ET.Element, name: str) -> frozenset[int] | None:
    """A cpuset/nodeset attribute; ``None`` when absent or infinite (hwloc writes ``0xf...f``)."""
    text = element.get(name)
    if text is None or "..." in text:
        return None
    try:
        return parse_hexmask(text)
    except ValueError as exc:
        kind = kind_of(element)
        raise BadXML(cpu_error(exc, f"{name}={short(text)} on a {kind} object is not a bitmap",
                             f"{name} on a {kind} object: {{}}")) from None


def int_attr(element: ET.Element, name: str) -> int | None:
    text = element.get(name)
    if text is None:
        return None
    value = ascii_int(text.strip())
    if value is None:
        raise BadXML(f"{name}={short(text, 40)} on a {kind_of(element)} object is not an integer")
    return value


def kind_of(element: ET.Element) -> str:
    return clip(element.get("type") or "?", 20)


def narrowing(element: ET.Element) -> frozenset[int] | None:
    """An object's cpuset as it narrows the objects below it; ``None`` when absent, infinite or unreadable (the
    reader of that object's own set says what is wrong with it)."""
    try:
        return mask(element, "cpuset")
    except BadXML:
        return None


@dataclass
class XmlNode:
    os_index: int
    locality: frozenset[int] | None  # None: every PU (no object above it has a finite cpuset)
    normal_memory: bool  # no subtype (DRAM) as opposed to MCDRAM/HBM/GPUMemory
    memory_kb: int | None
    gp_index: str | None
    nodeset: frozenset[int] | None


def numa_node(element: ET.Element, inside: frozenset[int] | None, major: int, warnings: list[str]) -> XmlNode:
    """A ``NUMANode``'s CPUs: its parent's in 2.x/3.x (hwloc gives a memory child its parent's cpuset, whatever
    the file says), its own cpuset within its parents' in 1.x; a node without a cpuset is refused, as hwloc does."""
    os_index = int_attr(element, "os_index")
    if os_index is None:
        raise BadXML("a NUMANode object has no os_index")
    if not 0 <= os_index <= MAX_NODE_ID:  # before any work on it: the model refuses it anyway
        raise BadXML(f"NUMANode P#{id_text(os_index)}: NUMA node {id_text(os_index)} is outside 0..{MAX_NODE_ID}")
    if element.get("cpuset") is None:
        raise BadXML(f"NUMANode P#{os_index} has no cpuset (hwloc refuses an object without one)")
    own = mask(element, "cpuset")
    if major < 2:
        given = mask(element, "complete_cpuset") or own
        locality = inside if given is None else given if inside is None else given & inside
    else:
        locality = inside if inside is not None else own
        if own is not None and inside is not None and own != inside:
            warnings.append(f"NUMANode P#{os_index}: its cpuset {clip(format_cpulist(own), 40)} is not its parent's "
                            f"({clip(format_cpulist(inside), 40)}); hwloc gives a NUMA node its parent's CPUs, and so "
                            "does affrun")
    memory = int_attr(element, "local_memory")
    return XmlNode(
        os_index=os_index,
        locality=locality,
        normal_memory=element.get("subtype") in (None, "", "DRAM"),
        memory_kb=None if memory is None else memory // 1024,
        gp_index=element.get("gp_index"),
        nodeset=mask(element, "nodeset"),
    )


def xml_nodes(top: ET.Element, machine: ET.Element, found: list[XmlNode], online: frozenset[int],
              warnings: list[str]) -> tuple[tuple[NumaNode, ...], dict[int, int]]:
    """The machine's NUMA nodes from the ``NUMANode`` objects ``found`` (one node of every CPU when there is none),
    and each PU's node; a broken table's warning goes to ``warnings``."""
    if not found:
        return (NumaNode(0, online, {0: 10}),), dict.fromkeys(online, 0)
    node_of_pu = _assign_pus_to_nodes(found, online)
    overlap = _partial_overlap(found, online)
    if overlap:
        warnings.append(overlap)
    node_cpus: dict[int, set[int]] = {n.os_index: set() for n in found}
    for pu, node in node_of_pu.items():
        node_cpus[node].add(pu)
    distances = numa_distances(top, machine, [(n.gp_index, n.os_index) for n in found])
    nodes: dict[int, NumaNode] = {}
    for n in sorted(found, key=lambda node: node.os_index):
        if n.os_index not in nodes:
            nodes[n.os_index] = NumaNode(n.os_index, frozenset(node_cpus[n.os_index]), distances.get(n.os_index, {}), n.memory_kb)
    return tuple(nodes.values()), node_of_pu


def _assign_pus_to_nodes(nodes: list[XmlNode], online: frozenset[int]) -> dict[int, int]:
    """Each PU's NUMA node: the smallest locality holding it, normal memory first, then the lowest os_index."""
    ranked = sorted(nodes, key=lambda n: (len(_cpus_of(n, online)), not n.normal_memory, n.os_index))
    out: dict[int, int] = {}
    for node in ranked:
        for pu in _cpus_of(node, online):
            out.setdefault(pu, node.os_index)
    return out


def _cpus_of(node: XmlNode, online: frozenset[int]) -> frozenset[int]:
    return online if node.locality is None else node.locality & online


def _partial_overlap(nodes: list[XmlNode], online: frozenset[int]) -> str | None:
    """A warning when two NUMA nodes share CPUs but neither holds the other's (nodes of one cpuset, or nested
    ones, are how hwloc places several memories; a partial overlap is a broken table)."""
    first: dict[frozenset[int], int] = {}  # each distinct cpuset, by the lowest node that has it
    for n in sorted(nodes, key=lambda node: node.os_index):
        first.setdefault(_cpus_of(n, online), n.os_index)
    # Largest first, each CPU's smallest set so far: a set is nested in or apart from every larger one exactly
    # when all its CPUs have the same smallest set so far (docs/design.md §6): linear in the CPUs of all sets.
    inner: dict[int, frozenset[int]] = {}
    for cpus in sorted(first, key=len, reverse=True):
        owners = {inner.get(c) for c in cpus}
        if len(owners) > 1:
            other = next(o for o in owners if o is not None and not cpus <= o)
            a, b = sorted((first[cpus], first[other]))
            return (f"the NUMA table is broken: nodes {a} and {b} both claim CPUs "
                    f"{clip(format_cpulist(cpus & other), 40)}; each CPU goes to the node with the smaller cpuset, "
                    "then the lower number")
        inner.update(dict.fromkeys(cpus, cpus))
    return None


def locality_node(locality: ET.Element | None, nodes: tuple[NumaNode, ...]) -> int | None:
    """The NUMA node of an I/O object (GPU, NIC) whose first non-I/O ancestor is ``locality``: the one node of its
    nodeset; else the one node of that nodeset with CPUs (a Group holding DDR and CPU-less MCDRAM or HBM nodes);
    without a nodeset, the one node holding CPUs of its cpuset. ``None`` when that is not one node."""
    if locality is None:
        return None
    nodeset = mask(locality, "complete_nodeset") or mask(locality, "nodeset")
    if nodeset:
        in_set = [n for n in nodes if n.os_index in nodeset]
        alone = _one(frozenset(n.os_index for n in in_set))
        return alone if alone is not None else _one(frozenset(n.os_index for n in in_set if n.cpus))
    cpus = mask(locality, "complete_cpuset") or mask(locality, "cpuset") or frozenset()
    return _one(frozenset(n.os_index for n in nodes if n.cpus & cpus))


def _one(values: frozenset[int]) -> int | None:
    return next(iter(values)) if len(values) == 1 else None


_LATENCY_KIND = 4  # HWLOC_DISTANCES_KIND_MEANS_LATENCY


def numa_distances(
    top: ET.Element, machine: ET.Element, nodes: Sequence[tuple[str | None, int]]
) -> dict[int, dict[int, int]]:
    """NUMA latency matrix: ``distances2`` (2.x/3.x) or ``distances`` (1.x); empty when the file has none."""
    for matrix in top.iter("distances2"):
        if matrix.get("type") != "NUMANode":
            continue
        kind = _int_or_zero(matrix.get("kind"))
        if kind and not kind & _LATENCY_KIND:
            continue
        indexes = " ".join(e.text or "" for e in matrix.findall("indexes")).split()
        values = " ".join(e.text or "" for e in matrix.findall("u64values")).split()
        n = _int_or_zero(matrix.get("nbobjs"))
        if n == 0 or len(indexes) != n or len(values) != n * n:
            raise BadXML(f"{_label(matrix)}: expected {n} indexes and {n * n} values")
        if matrix.get("indexing") == "gp":
            by_gp = dict(nodes)
            maybe_ids = [by_gp.get(i) for i in indexes]
        else:
            maybe_ids = [ascii_uint(i) for i in indexes]
        maybe_numbers = [ascii_uint(v) for v in values]
        ids = [i for i in maybe_ids if i is not None]
        numbers = [v for v in maybe_numbers if v is not None]
        if len(ids) != n or len(numbers) != n * n:
            raise BadXML(f"{_label(matrix)}: indexes or values are not numbers of NUMA nodes")
        return {a: {b: numbers[i * n + j] for j, b in enumerate(ids)} for i, a in enumerate(ids)}
    order = list(dict.fromkeys(os_index for _, os_index in nodes))
    for matrix in machine.iter("distances"):  # hwloc 1.x: latencies relative to latency_base, NUMA nodes in order
        latencies = [e.get("value", "") for e in matrix.findall("latency")]
        n = _int_or_zero(matrix.get("nbobjs"))
        if n != len(order) or len(latencies) != n * n:
            continue
        base = _latency(matrix.get("latency_base", "1"))
        products = [_latency(v) * base for v in latencies]
        if any(not 0 <= p <= _MAX_DISTANCE for p in products):  # NaN, inf and 1e400 included
            raise BadXML("distances: latency values are not finite numbers from 0 to 2^32")
        rounded = [round(p) for p in products]
        return {a: {b: rounded[i * n + j] for j, b in enumerate(order)} for i, a in enumerate(order)}
    return {}


# hwloc's distances are u64 latencies; the kernel's NUMA distances are below 256.
_MAX_DISTANCE = float(1 << 32)


def _latency(text: str) -> float:
    """A hwloc 1.x latency (a float); NaN for anything that is not a finite number."""
    if not text.isascii():
        return math.nan
    try:
        value = float(text)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) else math.nan


def _label(matrix: ET.Element) -> str:
    """``distances2 'NUMALatency'``, or ``distances2`` alone for a matrix without a name."""
    name = matrix.get("name")
    return "distances2" if name is None else f"distances2 {short(name, 40)}"


def _int_or_zero(text: str | None) -> int:
    return ascii_uint((text or "0").strip()) or 0
