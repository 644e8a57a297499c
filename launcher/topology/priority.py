"""Priority cores: the few cores of one kind that run at a higher clock than the rest (Turbo Boost Max 3.0, SST-TF,
SST-BF, Priority Core Turbo). The model, the rules over numbers a reader has read (:func:`find_priority`,
:func:`priority_classes`), and the readers of an hwloc XML's ``<cpukind>`` and of a snapshot; pure. The rules and
what each source shows: docs/priority-cores.md."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.base.cpulist import format_cpulist, id_problem
from launcher.base.records import BadRecord, from_dict
from launcher.base.untrusted import ascii_uint, clip, unwritable

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET
    from collections.abc import Mapping, Sequence

MAX_TEXT = 300  # source and why_none are one line for people; a snapshot's longer text is clipped


@dataclass(frozen=True)
class PriorityCores:
    """The priority CPUs of a machine (online PUs), best first in :attr:`order`; empty with :attr:`why_none`."""

    cpus: frozenset[int] = frozenset()
    # The same CPUs, best first as the kernel's ITMT ranks them: every core's first PU before any SMT sibling, then
    # the higher value first, then CPU order (docs/priority-cores.md, "Order").
    order: tuple[int, ...] = ()
    source: str = ""  # the evidence, for people: "acpi_cppc/highest_perf 46 against 42; ITMT on"
    why_none: str = ""  # when ``cpus`` is empty: why none were found ("every core has highest_perf 255 ...")
    # The machine's core kinds differ by one frequency alone on a non-hybrid Intel CPU: they are priority classes,
    # and the planner treats the machine as one kind (docs/core-kinds.md, "Priority classes are not kinds").
    one_kind: bool = False

    def restricted(self, allowed: frozenset[int]) -> PriorityCores:
        """The priority CPUs among ``allowed``; none left is said in :attr:`why_none`."""
        cpus = self.cpus & allowed
        if cpus == self.cpus:
            return self
        if not cpus:
            return PriorityCores(why_none=f"none of the priority CPUs is allowed here ({self.source})",
                                 one_kind=self.one_kind)
        return PriorityCores(cpus, tuple(c for c in self.order if c in cpus), self.source, one_kind=self.one_kind)


def none_found(why: str, *, one_kind: bool = False) -> PriorityCores:
    """No priority cores, with the reason (one line, clipped)."""
    return PriorityCores(why_none=clip(" ".join(why.split()), MAX_TEXT), one_kind=one_kind)


def priority_from_json(data: object, online: frozenset[int], what: str = "priority_cores") -> PriorityCores:
    """Read back a snapshot's ``priority_cores`` (``to_dict`` of :class:`PriorityCores`); ``online``: the
    topology's online CPUs. Anything but what affrun writes is no priority cores with the reason, never an
    exception."""
    if data is None:
        return none_found(f"{what}: not in this snapshot (saved by an affrun that did not look for them)")
    if not isinstance(data, dict) or not {"cpus", "order", "source", "why_none", "one_kind"} <= data.keys():
        return none_found(f"{what}: expected an object of cpus, order, source, why_none and one_kind; ignored")
    try:
        found = from_dict(PriorityCores, data, "")
    except BadRecord as exc:
        return none_found(f"{what}: {exc}; ignored")
    if any(map(id_problem, found.order)) or len(set(found.order)) != len(found.order) or set(found.order) != found.cpus:
        return none_found(f"{what}: order must hold each of cpus once, CPU ids; ignored")
    if not found.cpus <= online:
        return none_found(f"{what}: CPUs {clip(format_cpulist(found.cpus - online), 40)} are not online; ignored")
    if unwritable(found.source) or unwritable(found.why_none):
        return none_found(f"{what}: source and why_none must be one-line strings; ignored")
    if found.cpus and not found.source:
        return none_found(f"{what}: priority CPUs without their evidence (source); ignored")
    if not found.cpus:
        return PriorityCores(why_none=clip(found.why_none, MAX_TEXT), one_kind=found.one_kind)
    return PriorityCores(found.cpus, found.order, clip(found.source, MAX_TEXT), one_kind=found.one_kind)


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


def priority_from_xml(top: ET.Element, raw: Sequence[tuple[frozenset[int], dict[str, str]]],
                      cores: Sequence[tuple[int, ...]], online: frozenset[int]) -> PriorityCores:
    """Priority cores of an hwloc XML ``<topology>`` whose ``<cpukind>`` elements, as the kinds reader read them
    (``raw``: CPUs, infos), are priority classes (:func:`priority_classes`; the vendor: the first ``CPUVendor``
    info); else none, and why."""
    vendor = next((i.get("value") for i in top.iter("info") if i.get("name") == "CPUVendor"), None)
    if priority_classes(raw, vendor, None) is None:
        return none_found(XML_WHY)
    evidence = [Evidence(f"cpukind {name}", {cpu: int(infos[name]) for cpus, infos in raw for cpu in cpus}, unit=" MHz")
                for name in FREQUENCY_INFOS if all(name in infos for _, infos in raw)]
    return find_priority(cores, [("", online)], evidence, absent=XML_WHY, one_kind=True)
