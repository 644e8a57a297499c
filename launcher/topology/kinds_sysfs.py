"""Core kinds and priority cores from a Linux sysfs tree (live ``/`` or an fsroot), from each online CPU's
performance files. Kinds are found as hwloc's Linux backend finds them (``look_sysfscpukinds``), then ranked by
:class:`launcher.topology.kinds.KindRegistry`; priority cores by :func:`launcher.topology.priority.find_priority`
(docs/core-kinds.md, docs/priority-cores.md). Every per-CPU file is all or nothing: doubtful evidence gives no
kinds, or no priority cores, with the reason."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from launcher.base.cpulist import format_cpulist
from launcher.base.errors import TopologyError
from launcher.base.untrusted import ascii_uint, clip
from launcher.topology._files import numbered_entries, read_cpulist, read_int, read_text
from launcher.topology.cpuinfo_file import read_cpuinfo
from launcher.topology.kinds import (
    MAX_CAPACITY,
    MAX_MHZ,
    CoreKinds,
    KindRegistry,
    arm_part_name,
    partition_problem,
    refused,
)
from launcher.topology.priority import (
    Evidence,
    PriorityCores,
    find_priority,
    frequency_classes,
    none_found,
    priority_classes,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

CPU = "sys/devices/system/cpu"
PMU_SETS = (("cpu_atom", "IntelAtom"), ("cpu_core", "IntelCore"), ("cpu_lowpower", "IntelLowPower"))
ADJUST_PERCENT = 10  # hwloc's cpukinds_maxfreq_adjust default (HWLOC_CPUKINDS=freqadjust=N)
MIDR = "regs/identification/midr_el1"
_ARM_ARCH = {1: "4", 2: "4T", 3: "5", 4: "5T", 5: "5TE", 6: "5TEJ", 7: "6", 15: "8"}  # get_arm_midr_architecture


class Refused(Exception):
    """Evidence refused (message says why)."""


def kinds_from_sysfs(fsroot: str, cpus: frozenset[int] | None = None, *, use_midr: bool | None = None,
                     read: dict[str, dict[int, int]] | None = None) -> CoreKinds:
    """The core kinds of the machine under ``fsroot`` (``/`` for this one), fastest first. ``cpus``: the online
    CPUs (default: ``cpu/online``); ``use_midr=False`` is hwloc's ``midr=0``; ``read`` receives the checked
    per-CPU values read, by file, for :func:`priority_from_sysfs`."""
    try:
        return _read(fsroot, cpus, use_midr, {} if read is None else read)
    except (Refused, TopologyError) as exc:
        return refused(str(exc))


def _read(fsroot: str, cpus: frozenset[int] | None, use_midr: bool | None, read: dict[str, dict[int, int]]
          ) -> CoreKinds:
    cpu_dir = os.path.join(fsroot, CPU)
    existing: frozenset[int] | None = None  # the cpuN directories, listed here only where the online file is needed
    if cpus is None:
        existing = frozenset(numbered_entries(cpu_dir, "cpu", "cpu"))
        cpus = _online(cpu_dir, existing)
    if not cpus:
        return CoreKinds()
    pre_zen5, unknown = _pre_zen5_amd(fsroot)
    if pre_zen5:
        return CoreKinds()
    registry = KindRegistry()
    if use_midr is None:
        use_midr = read_text(os.path.join(cpu_dir, "cpu0", MIDR)) is not None
    if use_midr:
        _by_midr(registry, cpu_dir, sorted(cpus))
    else:
        _by_freq(registry, cpu_dir, sorted(cpus), read)
        _by_pmu_sets(registry, fsroot, cpus, existing)
    kinds = registry.rank()
    if unknown and kinds.hybrid:  # they count only where the CPU is not an AMD before Zen 5
        raise Refused(f"the CPU's vendor is unknown: {unknown}")
    return kinds


def _online(cpu_dir: str, existing: frozenset[int]) -> frozenset[int]:
    online = read_cpulist(os.path.join(cpu_dir, "online"))
    if online is not None:
        return online
    return frozenset(c for c in existing if read_text(os.path.join(cpu_dir, f"cpu{c}", "online")) != "0")


def _pre_zen5_amd(fsroot: str) -> tuple[bool, str | None]:
    """hwloc_linuxfs_look_cpu: no kinds on AMD before family 0x1a (Zen 5); CPPC there is slow and says nothing.
    The second value: why ``/proc/cpuinfo`` could not tell (it is there, but not readable)."""
    info = read_cpuinfo(fsroot)
    if info.problem and not info.present:
        return False, f"{clip(info.path, 120)}: {info.problem}"
    family = ascii_uint(info.fields.get("cpu family", ""))
    return info.fields.get("vendor_id") == "AuthenticAMD" and family is not None and family < 0x1A, None


def per_cpu_values(cpu_dir: str, pus: list[int], name: str, low: int, high: int, unit: str) -> dict[int, int]:
    """``cpuN/name`` of every CPU in ``pus``: all of them or none, each in ``[low, high]``, else :class:`Refused`
    (:class:`TopologyError` for a file that is not an integer or not a regular file). Shared with the reader of
    priority cores (:func:`priority_from_sysfs`)."""
    found: dict[int, int] = {}
    for pu in pus:
        value = read_int(f"{cpu_dir}/cpu{pu}/{name}")  # os.path.join's result, at a fifth of its cost
        if value is not None:
            found[pu] = value
    return _checked(found, pus, name, low, high, unit)


def _checked(found: dict[int, int], pus: list[int], name: str, low: int, high: int, unit: str) -> dict[int, int]:
    if found and len(found) != len(pus):
        missing = format_cpulist(set(pus) - found.keys())
        raise Refused(f"{name} exists for {len(found)} of the {len(pus)} online CPUs, not for {clip(missing, 40)}")
    for pu, value in found.items():
        if not low <= value <= high:
            raise Refused(f"cpu{pu}/{name} is {clip(str(value), 30)}{unit}, outside {low} to {high}{unit}")
    return found


def _bases(cpu_dir: str, pus: list[int]) -> tuple[dict[int, int], bool]:
    """Base frequencies in kHz: ``cpufreq/base_frequency`` (intel_pstate), else ``acpi_cppc/nominal_freq`` (MHz),
    decided as hwloc_fill_sysfscpukinds_arrays decides: the first CPU that has either fixes which is read, and a
    nominal_freq of 0 (some Sapphire Rapids firmware) is no evidence. The flag: ``base_frequency`` was read."""
    use_cppc = -1
    found: dict[int, int] = {}
    for pu in pus:
        base = None
        if use_cppc != 1:
            base = read_int(f"{cpu_dir}/cpu{pu}/cpufreq/base_frequency")
            if base is not None:
                use_cppc = 0
        if use_cppc != 0:
            nominal = read_int(f"{cpu_dir}/cpu{pu}/acpi_cppc/nominal_freq")
            if nominal is not None and nominal > 0:
                if nominal > MAX_MHZ:
                    raise Refused(f"cpu{pu}/acpi_cppc/nominal_freq is {clip(str(nominal), 30)} MHz, beyond 10 THz")
                base, use_cppc = nominal * 1000, 1
            else:
                use_cppc = 0
        if base is not None:
            found[pu] = base
    return _checked(found, pus, "cpufreq/base_frequency", 1, MAX_MHZ * 1000, " kHz"), use_cppc != 1


def _by_freq(registry: KindRegistry, cpu_dir: str, pus: list[int], read: dict[str, dict[int, int]]) -> None:
    maxes = per_cpu_values(cpu_dir, pus, "cpufreq/cpuinfo_max_freq", 1, MAX_MHZ * 1000, " kHz")
    bases, base_frequency = _bases(cpu_dir, pus)
    read["cpufreq/cpuinfo_max_freq"] = dict(maxes)  # before adjust_max_freqs changes them
    if base_frequency:
        read["cpufreq/base_frequency"] = dict(bases)
    capacities = per_cpu_values(cpu_dir, pus, "cpu_capacity", 1, MAX_CAPACITY, "")
    adjust_max_freqs(pus, maxes, bases, capacities)
    _register(registry, {pu: khz // 1000 for pu, khz in maxes.items()}, "FrequencyMaxMHz", "cpufreq", forced=False)
    _register(registry, {pu: khz // 1000 for pu, khz in bases.items()}, "FrequencyBaseMHz", "cpufreq", forced=False)
    _register(registry, capacities, "LinuxCapacity", "cpu_capacity", forced=True)


def adjust_max_freqs(pus: list[int], maxes: dict[int, int], bases: dict[int, int], capacities: dict[int, int],
                     percent: int = ADJUST_PERCENT) -> None:
    """hwloc_linux_cpukinds_adjust_maxfreqs, in place: among CPUs of one base frequency (none: 0), max
    frequencies within ``percent`` of the smallest become the smallest, and so do their capacities."""
    groups: dict[int, list[int]] = {}
    for pu in pus:
        groups.setdefault(bases.get(pu, 0), []).append(pu)
    for members in groups.values():
        freqs = [maxes[p] for p in members if p in maxes]
        if not freqs:
            continue
        low, high = min(freqs), max(freqs)
        if low != high and (high - low) * 100 < percent * low:
            least = min((capacities[p] for p in members if p in capacities), default=0)
            for pu in members:
                maxes[pu] = low
                if pu in capacities:
                    capacities[pu] = least


def _register(registry: KindRegistry, values: dict[int, int], info: str, source: str, *, forced: bool) -> None:
    """hwloc_linux_cpukinds_register: one kind per value, in increasing order of value."""
    by_value: dict[int, set[int]] = {}
    for pu, value in values.items():
        by_value.setdefault(value, set()).add(pu)
    for value in sorted(by_value):
        registry.register(by_value[value], value if forced else None, [(info, str(value))], source)


def _by_pmu_sets(registry: KindRegistry, fsroot: str, cpus: frozenset[int], existing: frozenset[int] | None
                 ) -> None:
    """The CPUs each Intel hybrid PMU counts on: their core type (a kind of unknown efficiency each). ``existing``:
    the ``cpuN`` directories, when listed already (listed here where a PMU names CPUs: on hybrid CPUs only)."""
    sets: list[tuple[str, str, frozenset[int]]] = []
    for pmu, core_type in PMU_SETS:
        members = read_cpulist(os.path.join(fsroot, "sys/devices", pmu, "cpus"))
        if members is None:
            continue
        if existing is None:
            existing = frozenset(numbered_entries(os.path.join(fsroot, CPU), "cpu", "cpu"))
        existing |= cpus
        if not members <= existing:
            raise Refused(f"{pmu}/cpus names CPUs {clip(format_cpulist(members - existing), 40)} that do not exist")
        sets.append((pmu, core_type, members))
    problem = partition_problem([(f"{pmu}/cpus", members) for pmu, _, members in sets], cpus)
    if problem:
        raise Refused(problem)
    for _, core_type, members in sets:
        registry.register(members & cpus, None, [("CoreType", core_type)], "pmu")


def _by_midr(registry: KindRegistry, cpu_dir: str, pus: list[int]) -> None:
    """look_sysfscpukinds_by_midr_regs: one kind per MIDR_EL1 value, infos the fields that differ, efficiency the
    smallest capacity. One value is one kind: hwloc then registers none."""
    midrs = per_cpu_values(cpu_dir, pus, MIDR, 1, (1 << 64) - 1, "")
    capacities = per_cpu_values(cpu_dir, pus, "cpu_capacity", 1, MAX_CAPACITY, "")
    groups: dict[int, list[int]] = {}
    for pu in pus:
        if pu in midrs:
            groups.setdefault(midrs[pu], []).append(pu)
    if len(groups) < 2:
        return
    fields: dict[str, Callable[[int], str]] = {  # hwloc's MIDR_* fields, formatted as it writes them
        "CPUImplementer": lambda v: f"0x{(v >> 24) & 0xFF:02x}",
        "CPUArchitecture": lambda v: _ARM_ARCH.get((v >> 16) & 0xF, "unknown"),
        "CPUVariant": lambda v: f"0x{(v >> 20) & 0xF:x}",
        "CPUPart": lambda v: f"0x{(v >> 4) & 0xFFF:03x}",
        "CPURevision": lambda v: str(v & 0xF)}
    differing = [name for name, get in fields.items() if len({get(v) for v in groups}) > 1]
    for value, members in groups.items():
        infos = [(name, fields[name](value)) for name in differing]
        capacity = min((capacities[p] for p in members), default=None) if capacities else None
        if capacity is not None:
            infos.insert(0, ("LinuxCapacity", str(capacity)))
        name = arm_part_name((value >> 24) & 0xFF, (value >> 4) & 0xFFF)
        registry.register(members, capacity, infos, "midr", hint=name)


_U32 = (1 << 32) - 1
# (file under cpuN, lowest, highest, its unit; shown as value // scale, in unit), most trusted first
# (docs/priority-cores.md)
SOURCES = (
    ("cpufreq/amd_pstate_prefcore_ranking", 1, _U32, "", 1, ""),
    ("acpi_cppc/highest_perf", 1, _U32, "", 1, ""),
    ("cpufreq/cpuinfo_max_freq", 1, MAX_MHZ * 1000, " kHz", 1000, " MHz"),
    ("cpufreq/base_frequency", 1, MAX_MHZ * 1000, " kHz", 1000, " MHz"),
)
CPPC_UNKNOWN = 255  # an 8-bit highest_perf of 255: firmware that hard-codes it (intel_pstate then reads HWP instead)
# The ITMT switch: a sysctl until Linux 6.13 ("1"/"0"), then debugfs ("Y"/"N"), which only root can read.
ITMT_FILES = (("proc/sys/kernel/sched_itmt_enabled", "1", "0"), ("sys/kernel/debug/x86/sched_itmt_enabled", "Y", "N"))
ABSENT = ("no per-CPU performance evidence: no acpi_cppc/highest_perf, cpufreq/cpuinfo_max_freq, "
          "cpufreq/base_frequency or amd_pstate_prefcore_ranking (a VM, or no cpufreq driver)")


def priority_from_sysfs(fsroot: str, cores: Sequence[tuple[int, ...]], kinds: CoreKinds,
                        read: Mapping[str, dict[int, int]] | None = None) -> PriorityCores:
    """The priority cores of the machine under ``fsroot`` (``/`` for this one). ``cores``: its online cores, each a
    tuple of PUs; ``kinds``: its core kinds as hwloc reads them (the cores are compared within each kind, unless
    the kinds are priority classes); ``read``: what the kinds reader read already (``kinds_from_sysfs(read=)``)."""
    try:
        return _read_priority(fsroot, cores, kinds, read or {})
    except (Refused, TopologyError) as exc:
        return none_found(str(exc))


def _read_priority(fsroot: str, cores: Sequence[tuple[int, ...]], kinds: CoreKinds, read: Mapping[str, dict[int, int]]
          ) -> PriorityCores:
    cpu_dir = os.path.join(fsroot, CPU)
    pus = sorted(p for core in cores for p in core)
    online = frozenset(pus)
    classes = None
    raw = [(k.cpus, dict(k.infos)) for k in kinds.kinds]
    if frequency_classes(raw):  # only then the CPU's identity: /proc/cpuinfo of a big machine is large
        from launcher.topology.cpu_identity import read_cpu_identity  # off a standalone rank's imports

        identity, _ = read_cpu_identity(fsroot)
        classes = priority_classes(raw, identity.vendor if identity else None, identity.flags if identity else None)
    groups = ([(k.name, k.cpus) for k in kinds.kinds] if kinds.hybrid and classes is None
              else [("", online)])
    notes: list[str] = []
    evidence: list[Evidence] = []
    for name, low, high, raw_unit, scale, unit in SOURCES:
        values = read[name] if name in read else _present_values(cpu_dir, pus, name, low, high, raw_unit)
        unknown = [p for p, v in values.items() if v == CPPC_UNKNOWN] if name == "acpi_cppc/highest_perf" else []
        if unknown and len(unknown) < len(values):
            notes.append(f"{name} is 255 (no value) on CPUs {clip(format_cpulist(unknown), 40)}: not used")
            values = {}
        evidence.append(Evidence(name, values, scale, unit))
    itmt = _itmt(fsroot)
    return find_priority(cores, groups, evidence, absent=ABSENT, notes=[*notes, *([itmt] if itmt else [])],
                         one_kind=classes is not None)


def _present_values(cpu_dir: str, pus: list[int], name: str, low: int, high: int, unit: str) -> dict[int, int]:
    """``cpuN/name`` of every PU, all or none (:func:`per_cpu_values`); absent, after two failed opens, where
    neither the first nor the last PU has it (most of these files are absent on most machines)."""
    if all(read_text(os.path.join(cpu_dir, f"cpu{pu}", name)) is None for pu in {pus[0], pus[-1]}):
        return {}
    return per_cpu_values(cpu_dir, pus, name, low, high, unit)


def _itmt(fsroot: str) -> str | None:
    """``ITMT on`` or ``ITMT off`` where the switch can be read; ``None`` where it cannot (no ITMT, or debugfs)."""
    for path, on, off in ITMT_FILES:
        try:
            text = read_text(os.path.join(fsroot, path))
        except TopologyError:  # a FIFO, or too large: it says nothing
            continue
        if text in (on, off):
            return f"ITMT {'on' if text == on else 'off'}"
    return None
