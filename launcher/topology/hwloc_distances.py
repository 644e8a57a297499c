"""The NUMA latency matrix of an hwloc XML export: ``distances2`` (hwloc 2.x/3.x) or ``distances`` (1.x).

:mod:`launcher.topology.hwloc_xml` reads the rest of the file and calls :func:`numa_distances` with the NUMA
nodes it found. Standard library only.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from launcher.base.untrusted import ascii_uint, short

_LATENCY_KIND = 4  # HWLOC_DISTANCES_KIND_MEANS_LATENCY


class BadDistances(Exception):
    """The distance matrix is not what hwloc writes (message says what; the caller names the file)."""


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
            raise BadDistances(f"{_label(matrix)}: expected {n} indexes and {n * n} values")
        if matrix.get("indexing") == "gp":
            by_gp = dict(nodes)
            maybe_ids = [by_gp.get(i) for i in indexes]
        else:
            maybe_ids = [ascii_uint(i) for i in indexes]
        maybe_numbers = [ascii_uint(v) for v in values]
        ids = [i for i in maybe_ids if i is not None]
        numbers = [v for v in maybe_numbers if v is not None]
        if len(ids) != n or len(numbers) != n * n:
            raise BadDistances(f"{_label(matrix)}: indexes or values are not numbers of NUMA nodes")
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
            raise BadDistances("distances: latency values are not finite numbers from 0 to 2^32")
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
