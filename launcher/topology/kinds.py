"""Core kinds of hybrid CPUs: the model, hwloc's registration and ranking rules, and the readers of an hwloc XML
``<topology>`` and of a snapshot's JSON; pure. Doubtful evidence gives no kinds and one warning, never an
exception. Every rule and where it comes from: docs/core-kinds.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launcher.base.cpulist import format_cpulist, id_problem, parse_hexmask
from launcher.base.records import BadRecord, from_dict
from launcher.base.untrusted import ascii_hex, ascii_int, ascii_uint, clip

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET
    from collections.abc import Iterable, Sequence
    from typing import Any

Info = tuple[str, str]

MAX_MHZ = 10_000_000  # 10 THz: no CPU clock is near it; a value beyond is not a frequency
MAX_CAPACITY = 1 << 20  # the kernel scales cpu_capacity to 1024 (SCHED_CAPACITY_SCALE); 1024 times that is garbage
MAX_KINDS = 64
_INT_MAX = (1 << 31) - 1
# hwloc's CoreType infos (topology-linux.c PMU sets, topology-x86.c CPUID) -> the names people use
CORE_TYPE_NAMES = {"IntelCore": "P-core", "IntelAtom": "E-core", "IntelLowPower": "LP E-core",
                   "AMDPerformance": "P-core", "AMDEfficiency": "E-core", "AMDLowPower": "LP core"}
# arch/arm64/include/asm/cputype.h: Arm Ltd (implementer 0x41) part numbers of cores found in hybrid SoCs
ARM_PARTS = {0xD03: "Cortex-A53", 0xD05: "Cortex-A55", 0xD07: "Cortex-A57", 0xD08: "Cortex-A72", 0xD09: "Cortex-A73",
             0xD0A: "Cortex-A75", 0xD0B: "Cortex-A76", 0xD0D: "Cortex-A77", 0xD41: "Cortex-A78", 0xD44: "Cortex-X1",
             0xD46: "Cortex-A510", 0xD47: "Cortex-A710", 0xD48: "Cortex-X2", 0xD4D: "Cortex-A715", 0xD4E: "Cortex-X3",
             0xD80: "Cortex-A520", 0xD81: "Cortex-A720", 0xD82: "Cortex-X4", 0xD85: "Cortex-X925",
             0xD87: "Cortex-A725"}
# hwloc__cpukinds_summarize_info: the Intel core type's weight in the ranking (Core > Atom > LowPower)
_INTEL_TYPE_RANK = {"IntelLowPower": 1, "IntelAtom": 2, "IntelCore": 3}


@dataclass(frozen=True)
class CoreKind:
    """CPUs of one kind. ``efficiency``: hwloc's rank, 0 (least performant) to N-1 (most)."""

    cpus: frozenset[int]
    efficiency: int
    name: str  # "P-core", "E-core", "Cortex-X925", "big core"...: singular, for people
    source: str  # where the evidence came from: "cpufreq+pmu", "cpu_capacity", "midr", "hwloc-xml"...
    infos: tuple[Info, ...] = ()  # hwloc's infos, in its order: FrequencyMaxMHz, FrequencyBaseMHz, CoreType...


@dataclass(frozen=True)
class CoreKinds:
    """What a reader found: ``kinds`` fastest first (empty or one entry on a homogeneous machine), and why
    the evidence was refused where it was (``warnings``)."""

    kinds: tuple[CoreKind, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def hybrid(self) -> bool:
        return len(self.kinds) > 1

    def kind_of(self, cpu: int) -> CoreKind | None:
        for kind in self.kinds:
            if cpu in kind.cpus:
                return kind
        return None

    def restricted(self, cpus: frozenset[int]) -> CoreKinds:
        """Kinds narrowed to ``cpus`` (the allowed CPUs): empty kinds dropped, efficiencies renumbered 0..N-1 in
        the same order (hwloc_internal_cpukinds_restrict, then its re-ranking)."""
        kept = [(k, k.cpus & cpus) for k in self.kinds if k.cpus & cpus]
        n = len(kept)
        kinds = tuple(CoreKind(c, n - 1 - i, k.name, k.source, k.infos) for i, (k, c) in enumerate(kept))
        return CoreKinds(kinds, self.warnings)


def refused(problem: str) -> CoreKinds:
    """The homogeneous result for doubtful evidence, with the one warning that says why."""
    return CoreKinds((), (f"core kinds ignored ({clip(problem, 200)}): all cores are treated as one kind",))


def printable(text: str, limit: int = 40) -> str:
    """Printable ASCII only (names and infos come from files; they end up in one-line messages and tables)."""
    return clip("".join(c for c in text if " " <= c <= "~").strip(), limit)


class _Kind:
    __slots__ = ("cpus", "forced", "hint", "infos", "sources")

    def __init__(self, cpus: set[int], forced: int | None, infos: list[Info], sources: list[str],
                 hint: str | None) -> None:
        self.cpus, self.forced, self.infos, self.sources, self.hint = cpus, forced, infos, sources, hint

    def add(self, infos: Sequence[Info], source: str, hint: str | None) -> None:
        self.infos.extend(i for i in infos if i not in self.infos)  # hwloc__cpukind_add_infos skips duplicates
        if source not in self.sources:
            self.sources.append(source)
        self.hint = self.hint or hint


class KindRegistry:
    """hwloc's ``hwloc_internal_cpukinds_register`` and ``_rank`` over plain data. ``forced``: an efficiency a
    source states (``cpu_capacity``, XML ``forced_efficiency``); ``None`` is hwloc's "unknown"."""

    def __init__(self) -> None:
        self._kinds: list[_Kind] = []

    def register(self, cpus: Iterable[int], forced: int | None, infos: Sequence[Info], source: str, *,
                 overwrite: bool = False, hint: str | None = None) -> None:
        todo = set(cpus)
        if not todo:
            return
        for kind in list(self._kinds):
            common = todo & kind.cpus
            if not common:
                continue
            if common == kind.cpus:  # the new set contains (or equals) this kind: annotate it
                kind.add(infos, source, hint)
                if overwrite or kind.forced is None:
                    kind.forced = forced
            else:  # it intersects or is included: split off the common part, which takes the new efficiency
                kind.cpus -= common
                split = _Kind(common, forced, list(kind.infos), list(kind.sources), kind.hint)
                split.add(infos, source, hint)
                self._kinds.append(split)
            todo -= common
            if not todo:
                return
        self._kinds.append(_Kind(todo, forced, [], [], None))
        self._kinds[-1].add(infos, source, hint)

    def rank(self) -> CoreKinds:
        """The kinds fastest first, or a refusal when hwloc's heuristics cannot order them."""
        kinds = self._kinds
        if not kinds:
            return CoreKinds()
        if len(kinds) > MAX_KINDS:
            return refused(f"{len(kinds)} kinds of core; no CPU has more than a few")
        values = [0] if len(kinds) == 1 else _ranking_values(kinds)
        if values is None:
            described = "; ".join(f"{format_cpulist(k.cpus)}: {_describe(k)}" for k in kinds)
            return refused(f"kinds that cannot be ranked by efficiency, core type or frequency: {clip(described, 120)}")
        order = sorted(range(len(kinds)), key=lambda i: values[i], reverse=True)
        names = _names([kinds[i] for i in order])
        n = len(kinds)
        return CoreKinds(tuple(CoreKind(frozenset(kinds[i].cpus), n - 1 - pos, names[pos], "+".join(kinds[i].sources),
                                        tuple(kinds[i].infos)) for pos, i in enumerate(order)))


def arm_part_name(implementer: int | None, part: int | None) -> str | None:
    """``Cortex-X925`` for MIDR implementer 0x41, part 0xd85; ``None`` when not known."""
    return ARM_PARTS.get(part) if implementer == 0x41 and part is not None else None


def _describe(kind: _Kind) -> str:
    return ", ".join(f"{k}={v}" for k, v in kind.infos) or "no infos"


def _info_uint(kind: _Kind, name: str) -> int:
    value = 0
    for key, text in kind.infos:
        if key == name:  # hwloc keeps the last one (atoi; 0 when not a number)
            value = ascii_uint(text) or 0
    return value


def _ranking_values(kinds: list[_Kind]) -> list[int] | None:
    """hwloc's default ranking: forced efficiencies when every kind has one and they differ; else the Intel core
    type (Core > Atom > LowPower) then the base frequency if every kind has one, else the max frequency."""
    forced = [k.forced for k in kinds]
    if None not in forced:
        forced_values = [f for f in forced if f is not None]
        if len(set(forced_values)) == len(forced_values):
            return forced_values
    types = [max((_INTEL_TYPE_RANK.get(v, 0) for n, v in k.infos if n == "CoreType"), default=0) for k in kinds]
    maxes = [_info_uint(k, "FrequencyMaxMHz") for k in kinds]
    bases = [_info_uint(k, "FrequencyBaseMHz") for k in kinds]
    if not all(types) and not all(maxes) and not all(bases):
        return None
    freqs = bases if all(bases) else maxes
    values = [(t << 20) + f for t, f in zip(types, freqs)]
    return values if len(set(values)) == len(values) else None


def _names(kinds: list[_Kind]) -> list[str]:
    """Names, fastest first: the core type, else the reader's hint (an ARM part), else by rank."""
    n = len(kinds)
    generic = ["core"] if n == 1 else (["big core"] + [f"mid core{'' if n == 3 else f' {i}'}" for i in range(1, n - 1)]
                                       + ["little core"])
    names: list[str] = []
    for pos, kind in enumerate(kinds):
        core_type = next((v for k, v in kind.infos if k == "CoreType"), None)
        name = CORE_TYPE_NAMES.get(core_type or "") or kind.hint or printable(core_type or "") or generic[pos]
        names.append(name)
    repeated = {name for name in names if names.count(name) > 1}
    for pos, name in enumerate(names):
        if name in repeated:  # two kinds of one core type (E-cores and LP E-cores both in cpu_atom)
            mhz = _info_uint(kinds[pos], "FrequencyMaxMHz") or _info_uint(kinds[pos], "FrequencyBaseMHz")
            names[pos] = f"{name} ({mhz} MHz)" if mhz else f"{name} (kind {n - 1 - pos})"
    return names


def partition_problem(sets: Sequence[tuple[str, frozenset[int]]], cpus: frozenset[int]) -> str | None:
    """Why ``sets`` (label, CPUs) are not a partition of ``cpus``: an overlap, or CPUs in no set."""
    seen: dict[int, str] = {}
    for label, members in sets:
        for cpu in sorted(members):
            if cpu in seen:
                return f"{label} and {seen[cpu]} both hold CPU {cpu}: overlapping kinds"
            seen[cpu] = label
    missing = cpus - seen.keys()
    if seen and missing:
        return f"CPUs {clip(format_cpulist(missing), 40)} are in no kind"
    return None


# --------------------------------------------------------------------------------------------- hwloc XML
def kinds_from_hwloc_xml(top: ET.Element, cpus: frozenset[int] | None = None, what: str = "hwloc XML",
                         read: list[tuple[frozenset[int], dict[str, str]]] | None = None) -> CoreKinds:
    """The ``<cpukind>`` children of an hwloc ``<topology>`` (hwloc__xml_import_cpukind), ranked. ``cpus``: the
    topology's PUs (default: its PU objects'); CPUs a kind names beyond them are dropped. ``read`` receives each
    kind's CPUs and infos as read, before ranking, for :func:`launcher.topology.priority.priority_from_xml`."""
    elements = top.findall("cpukind")
    if not elements:
        return CoreKinds()
    if cpus is None:
        cpus = frozenset(v for o in top.iter("object") if o.get("type") == "PU"
                         and (v := ascii_uint(o.get("os_index") or "")) is not None)
    machine = top.find("object")
    try:
        complete = parse_hexmask((machine.get("complete_cpuset") or machine.get("cpuset") or "0x0")
                                 if machine is not None else "0x0") | cpus
    except ValueError:  # CpuIdTooLarge too
        complete = cpus
    package = next((o for o in top.iter("object") if o.get("type") == "Package"), None)
    implementer = _hex_info(package.findall("info") if package is not None else [], "CPUImplementer")
    registry = KindRegistry()
    sets: list[tuple[str, frozenset[int], list[Info]]] = []
    for i, element in enumerate(elements[: MAX_KINDS + 1]):
        label = f"<cpukind> #{i}"
        parsed = _xml_kind(element, label, complete)
        if isinstance(parsed, str):
            return refused(f"{what}: {parsed}")
        members, forced, infos = parsed
        sets.append((label, members, infos))
        hint = arm_part_name(_hex_info(element.findall("info"), "CPUImplementer") or implementer,
                             _hex_info(element.findall("info"), "CPUPart"))
        registry.register(members & cpus, forced, infos, "hwloc-xml", overwrite=True, hint=hint)
    problem = partition_problem([(label, members & cpus) for label, members, _ in sets], cpus)
    if problem:
        return refused(f"{what}: {problem}")
    if read is not None:
        read.extend((members & cpus, dict(infos)) for _, members, infos in sets if members & cpus)
    return registry.rank()


def _hex_info(infos: list[ET.Element], name: str) -> int | None:
    text = next((i.get("value") for i in infos if i.get("name") == name), None)
    return ascii_hex(text.strip(), 8) if text else None


def _xml_kind(element: ET.Element, label: str, complete: frozenset[int]) -> str | tuple[frozenset[int], int | None,
                                                                                           list[Info]]:
    unknown = sorted(set(element.keys()) - {"cpuset", "forced_efficiency"})
    if unknown:
        return f"{label}: unknown attribute {printable(unknown[0], 30)!r}"
    text = element.get("cpuset")
    if text is None:
        return f"{label}: no cpuset"
    try:
        members = parse_hexmask(text)
    except ValueError:  # CpuIdTooLarge too
        return f"{label}: cpuset={printable(text, 40)!r} is not a bitmap"
    if not members <= complete:
        return f"{label}: names CPUs {clip(format_cpulist(members - complete), 40)} that the topology does not have"
    forced: int | None = None
    if (text := element.get("forced_efficiency")) is not None:
        forced = ascii_int(text.strip())
        if forced is None or not -_INT_MAX <= forced <= _INT_MAX:
            return f"{label}: forced_efficiency={printable(text, 30)!r} is not an integer"
        forced = None if forced == -1 else forced  # HWLOC_CPUKIND_EFFICIENCY_UNKNOWN
    infos: list[Info] = []
    for child in element:
        name, value = child.get("name"), child.get("value")
        if child.tag != "info" or name is None or value is None:
            return f"{label}: unexpected <{printable(str(child.tag), 20)}> (hwloc writes <info name= value=>)"
        problem = info_problem(name, value)
        if problem:
            return f"{label}: {problem}"
        infos.append((printable(name, 60), printable(value, 80)))
    return members, forced, infos


def info_problem(name: str, value: str) -> str | None:
    """Why an info a ranking reads is out of range: a frequency of 0 or beyond 10 THz, a capacity of 0."""
    if name in ("FrequencyMaxMHz", "FrequencyBaseMHz"):
        number = ascii_uint(value.strip())
        if number is None or not 1 <= number <= MAX_MHZ:
            return f"{name}={printable(value, 30)!r} is not a frequency (1 MHz to 10 THz)"
    if name == "LinuxCapacity":
        number = ascii_uint(value.strip())
        if number is None or not 1 <= number <= MAX_CAPACITY:
            return f"{name}={printable(value, 30)!r} is not a CPU capacity (1 to {MAX_CAPACITY})"
    return None


# ------------------------------------------------------------------------------------- JSON (snapshot)
def kinds_to_json(kinds: CoreKinds) -> list[dict[str, Any]]:
    """``[{"cpus": [int], "efficiency": int, "name": str, "source": str, "infos": {str: str}}]``, fastest first."""
    return [{"cpus": sorted(k.cpus), "efficiency": k.efficiency, "name": k.name, "source": k.source,
             "infos": dict(k.infos)} for k in kinds.kinds]


@dataclass(frozen=True)
class _KindJson:
    """One kind as :func:`kinds_to_json` writes it."""

    cpus: tuple[int, ...]
    efficiency: int
    name: str
    source: str
    infos: dict[str, str] = field(default_factory=dict)


def kinds_from_json(data: object, cpus: frozenset[int], what: str = "core_kinds") -> CoreKinds:
    """Read back :func:`kinds_to_json`'s list; ``cpus`` are the topology's online CPUs, which the kinds must
    partition. Anything else is a refusal (a warning and no kinds), never an exception."""
    if data is None or data == []:
        return CoreKinds()
    if not isinstance(data, list) or len(data) > MAX_KINDS:
        return refused(f"{what}: expected a list of at most {MAX_KINDS} kinds")
    kinds: list[CoreKind] = []
    for i, entry in enumerate(data):
        label, rank = f"{what}[{i}]", len(data) - 1 - i
        try:
            k = from_dict(_KindJson, entry, label)
        except BadRecord as exc:
            return refused(str(exc))
        problem = ("cpus must be a non-empty list of CPU ids" if not k.cpus or any(map(id_problem, k.cpus))
                   else f"efficiency must be {rank} (kinds are listed fastest first)" if k.efficiency != rank
                   else "name and source must be short printable strings" if not k.name or printable(k.name) != k.name
                   else next((p for key, v in k.infos.items() if (p := info_problem(key, v))), None))
        if problem is None and not set(k.cpus) <= cpus:
            problem = f"CPUs {clip(format_cpulist(set(k.cpus) - cpus), 40)} are not online CPUs"
        if problem:
            return refused(f"{label}: {problem}")
        kinds.append(CoreKind(frozenset(k.cpus), k.efficiency, k.name, printable(k.source, 60),
                              tuple((printable(key, 60), printable(v, 80)) for key, v in k.infos.items())))
    problem = partition_problem([(f"{what}[{i}]", k.cpus) for i, k in enumerate(kinds)], cpus)
    return refused(problem) if problem else CoreKinds(tuple(kinds))
