"""The rules of priority cores, over numbers a reader has read and checked; pure. docs/priority-cores.md states them.

* :func:`find_priority`: the first evidence whose values differ among the cores of one kind decides; the priority
  cores are those above the kind's most common value, where they are fewer than half its cores.
* :func:`priority_classes`: core kinds that differ by one frequency alone (base or max, :func:`frequency_classes`)
  on a non-hybrid Intel CPU are priority classes (SST-BF, SST-TF, Priority Core Turbo), not kinds: the planner
  treats them as one kind.
* :func:`priority_from_xml`: what an hwloc XML export allows: its ``<cpukind>`` frequencies, where they are classes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.base.cpulist import parse_hexmask
from launcher.base.untrusted import ascii_uint, clip
from launcher.topology.kinds import MAX_KINDS, info_problem
from launcher.topology.priority import MAX_TEXT, PriorityCores, none_found

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET
    from collections.abc import Mapping, Sequence

FREQUENCY_INFOS = ("FrequencyMaxMHz", "FrequencyBaseMHz")  # hwloc's names, in the order hwloc adds them
XML_WHY = ("an hwloc XML export records no per-CPU CPPC highest_perf or frequency; priority cores are read from "
           "it only where its cpukinds differ by one frequency alone on an Intel CPU")


@dataclass(frozen=True)
class Evidence:
    """One per-CPU value (``values``: every online CPU, or empty where the source has none), checked in range."""

    name: str  # what was read, for people: "acpi_cppc/highest_perf", "cpufreq/cpuinfo_max_freq"
    values: Mapping[int, int]
    scale: int = 1  # shown as value // scale: 1000 turns kHz into MHz
    unit: str = ""

    def text(self, value: int) -> str:
        return f"{value // self.scale}{self.unit}"


def _group_members(cores: Sequence[tuple[int, ...]], groups: Sequence[tuple[str, frozenset[int]]]
                   ) -> list[tuple[str, list[int]]]:
    """Core indexes per group, a core going to the group of its first PU (cores of no group: a group of their own)."""
    where = {cpu: g for g, (_, cpus) in enumerate(groups) for cpu in cpus}
    members: list[list[int]] = [[] for _ in range(len(groups) + 1)]
    for i, core in enumerate(cores):
        members[where.get(core[0], len(groups))].append(i)
    names = [name for name, _ in groups] + ["other"]
    return [(names[g], m) for g, m in enumerate(members) if m]


def find_priority(cores: Sequence[tuple[int, ...]], groups: Sequence[tuple[str, frozenset[int]]],
                  evidence: Sequence[Evidence], *, absent: str, notes: Sequence[str] = (), one_kind: bool = False
                  ) -> PriorityCores:
    """The priority cores of ``cores`` (each a tuple of online PUs), judged within each of ``groups`` (a kind's
    name and CPUs; one group for a machine of one kind). A core's value is its weakest PU's. ``evidence`` is in
    order of trust: the first that varies within a group decides, the others only order ties. ``absent``: why
    none when no evidence has values; ``notes`` are added to the evidence or the reason."""
    tail = "".join(f"; {n}" for n in notes)
    members = _group_members(cores, groups)
    several = len(members) > 1
    uniform: list[str] = []
    for pos, ev in enumerate(evidence):
        if not ev.values:
            continue
        if any(p not in ev.values for core in cores for p in core):
            return none_found(f"{ev.name}: no value for some of the CPUs{tail}", one_kind=one_kind)
        value = [min(ev.values[p] for p in core) for core in cores]
        spread = [(name, m) for name, m in members if len({value[i] for i in m}) > 1]
        if not spread:
            shown = "/".join(dict.fromkeys(ev.text(value[m[0]]) for _, m in members))
            uniform.append(f"{ev.name} {shown}")
            continue
        picked: list[int] = []
        levels: list[str] = []
        for name, m in spread:
            counts = Counter(value[i] for i in m)
            most = max(counts.values())
            common = min(v for v, n in counts.items() if n == most)
            above = [i for i in m if value[i] > common]
            where = f" among the {name}s" if several else ""
            if 2 * len(above) >= len(m):
                return none_found(f"{ev.name} has no common level{where}: {len(counts)} values over {len(m)} cores, "
                                  f"{len(above)} of them above the most common ({ev.text(common)}), which is not a few"
                                  f"{tail}", one_kind=one_kind)
            if above:
                picked += above
                best = "/".join(ev.text(v) for v in sorted({value[i] for i in above}, reverse=True))
                levels.append(f"{best} against {ev.text(common)}{f' ({name}s)' if several else ''}")
        if not picked:
            return none_found(f"{ev.name}: a few cores are below the common level, none above it{tail}",
                              one_kind=one_kind)
        ties = [e for e in (*evidence[pos + 1:], *evidence[:pos]) if e.values]
        return _found(cores, picked, [ev, *ties], f"{ev.name} {', '.join(levels)}{tail}", one_kind)
    if not uniform:
        return none_found(f"{absent}{tail}", one_kind=one_kind)
    said = ", ".join(uniform[:-1]) + (" and " if len(uniform) > 1 else "") + uniform[-1]
    return none_found(f"{'the cores of each kind share' if several else 'every core has'} {said}{tail}",
                      one_kind=one_kind)


def _found(cores: Sequence[tuple[int, ...]], picked: list[int], evidence: list[Evidence], source: str,
           one_kind: bool) -> PriorityCores:
    """The picked cores' PUs, ordered as ITMT ranks them: first PUs before SMT siblings, then by the evidence in
    order (higher first), then by CPU id."""
    keys: list[tuple[int, ...]] = []
    for i in picked:
        core = sorted(cores[i])
        worth = tuple(-min(ev.values[p] for p in core) for ev in evidence)
        keys.extend((rank, *worth, cpu) for rank, cpu in enumerate(core))
    order = tuple(key[-1] for key in sorted(keys))
    return PriorityCores(frozenset(order), order, clip(source, MAX_TEXT), one_kind=one_kind)


def priority_classes(kinds: Sequence[tuple[frozenset[int], Mapping[str, str]]], vendor: str | None,
                     flags: Sequence[str] | None) -> str | None:
    """Why ``kinds`` (CPUs, hwloc infos) are priority classes and not kinds of core, or ``None`` when they are
    kinds: an Intel CPU (``vendor``) without the ``hybrid_cpu`` flag, and :func:`frequency_classes`."""
    if vendor != "GenuineIntel" or "hybrid_cpu" in (flags or ()):
        return None
    return frequency_classes(kinds)


def frequency_classes(kinds: Sequence[tuple[frozenset[int], Mapping[str, str]]]) -> str | None:
    """The shape of priority classes, whatever the CPU (readers check it before they read the CPU's identity):
    two kinds or more whose infos differ in one of ``FrequencyMaxMHz`` or ``FrequencyBaseMHz`` and nothing else,
    the faster ones fewer than half the CPUs. The reason, or ``None``."""
    if len(kinds) < 2:
        return None
    rest = [{k: v for k, v in infos.items() if k not in FREQUENCY_INFOS} for _, infos in kinds]
    if any(r != rest[0] for r in rest):
        return None  # a core type, a capacity or a MIDR of their own: kinds
    differ = [name for name in FREQUENCY_INFOS if len({infos.get(name) for _, infos in kinds}) > 1]
    if len(differ) != 1:
        return None  # both frequencies differ (P- and E-cores: i7-1370P, Lakefield), or neither
    values = [ascii_uint((infos.get(differ[0]) or "").strip()) for _, infos in kinds]
    if None in values:
        return None
    slowest = min(v for v in values if v is not None)
    fast = sum(len(cpus) for (cpus, _), v in zip(kinds, values) if v != slowest)
    if 2 * fast >= sum(len(cpus) for cpus, _ in kinds):
        return None
    return f"{differ[0]} alone differs ({', '.join(sorted({str(v) for v in values}, key=int, reverse=True))})"


def priority_from_xml(top: ET.Element, cores: Sequence[tuple[int, ...]], online: frozenset[int]) -> PriorityCores:
    """Priority cores of an hwloc XML ``<topology>``: its ``<cpukind>`` elements where :func:`priority_classes`
    makes them classes (the CPU vendor from the first ``CPUVendor`` info); else none, with the reason."""
    raw: list[tuple[frozenset[int], dict[str, str]]] = []
    for i, element in enumerate(top.findall("cpukind")[: MAX_KINDS + 1]):
        try:
            cpus = parse_hexmask(element.get("cpuset") or "") & online
        except ValueError:  # CpuIdTooLarge too
            return none_found(f"hwloc XML: <cpukind> #{i} has a cpuset that is not a bitmap; {XML_WHY}")
        infos = {n: v for info in element.findall("info")
                 if (n := info.get("name")) is not None and (v := info.get("value")) is not None}
        if cpus:
            raw.append((cpus, infos))
    vendor = next((i.get("value") for i in top.iter("info") if i.get("name") == "CPUVendor"), None)
    if priority_classes(raw, vendor, None) is None:
        return none_found(XML_WHY)
    counts = Counter(cpu for cpus, _ in raw for cpu in cpus)
    if any(n > 1 for n in counts.values()) or set(counts) != online:
        return none_found(f"hwloc XML: its cpukinds overlap or leave out CPUs; {XML_WHY}")
    evidence: list[Evidence] = []
    for name in FREQUENCY_INFOS:
        texts = [infos.get(name) for _, infos in raw]
        if all(t is None for t in texts):
            continue
        if any(t is None or info_problem(name, t) for t in texts):
            return none_found(f"hwloc XML: a cpukind's {name} is absent or not a frequency; {XML_WHY}")
        values = {cpu: int((t or "").strip()) for (cpus, _), t in zip(raw, texts) for cpu in cpus}
        evidence.append(Evidence(f"cpukind {name}", values, unit=" MHz"))
    return find_priority(cores, [("", online)], evidence, absent=XML_WHY, one_kind=True)
