"""Core kinds from a Linux sysfs tree, found as hwloc's Linux backend finds them (hwloc/topology-linux.c,
``look_sysfscpukinds``), then ranked by :class:`launcher.topology.kinds.KindRegistry`.

* ARM with ``cpu0/regs/identification/midr_el1``: one kind per MIDR value, its efficiency the smallest
  ``cpu_capacity`` of its CPUs (``look_sysfscpukinds_by_midr_regs``); nothing else is read.
* Otherwise (``look_sysfscpukinds_by_freq``): ``cpufreq/cpuinfo_max_freq``, ``cpufreq/base_frequency`` (else
  ``acpi_cppc/nominal_freq``) and ``cpu_capacity``; max frequencies within 10% of each other among CPUs of one
  base frequency count as one (Turbo Boost Max 3.0 favoured cores). Then the hybrid PMUs' CPU lists
  ``/sys/devices/cpu_{atom,core,lowpower}/cpus`` (``look_sysfscpukinds_by_pmu_sets``) give the core types.

Every per-CPU attribute is all-or-nothing: present on some online CPUs and not others, out of range, or not an
integer, and the result is homogeneous with one warning (hwloc would skip such CPUs and invent kinds).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from launcher.base.cpulist import format_cpulist
from launcher.base.untrusted import ascii_uint, clip
from launcher.errors import TopologyError
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

if TYPE_CHECKING:
    from collections.abc import Callable

CPU = "sys/devices/system/cpu"
PMU_SETS = (("cpu_atom", "IntelAtom"), ("cpu_core", "IntelCore"), ("cpu_lowpower", "IntelLowPower"))
ADJUST_PERCENT = 10  # hwloc's cpukinds_maxfreq_adjust default (HWLOC_CPUKINDS=freqadjust=N)
MIDR = "regs/identification/midr_el1"
_ARM_ARCH = {1: "4", 2: "4T", 3: "5", 4: "5T", 5: "5TE", 6: "5TEJ", 7: "6", 15: "8"}  # get_arm_midr_architecture


class Refused(Exception):
    """Evidence refused (message says why); the priority-cores reader raises it too."""


def kinds_from_sysfs(fsroot: str, cpus: frozenset[int] | None = None, *, use_midr: bool | None = None,
                     read: dict[str, dict[int, int]] | None = None) -> CoreKinds:
    """The core kinds of the machine under ``fsroot`` (``/`` for this one), fastest first.

    ``cpus``: the online CPUs (default: ``cpu/online``). ``use_midr``: ``None`` does as hwloc does (MIDR when
    ``cpu0`` has one); ``False`` is hwloc's ``HWLOC_CPUKINDS=midr=0``. ``read``, when given, receives the checked
    per-CPU values read, by file (``cpufreq/cpuinfo_max_freq``, ``cpufreq/base_frequency``): the priority-cores
    reader then does not read them again.
    """
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
    priority cores (:mod:`launcher.topology.priority_sysfs`)."""
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
    """hwloc_linux_cpukinds_adjust_maxfreqs, in place: among CPUs of one base frequency, max frequencies that
    differ by less than ``percent`` of the smallest become the smallest, and so do their capacities.

    hwloc skips this when a CPU has a max frequency and no base one; here such CPUs form one group (base 0), so
    a few favoured cores of a cpufreq driver without base_frequency do not become a kind of their own.
    """
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
