"""Priority cores from a Linux sysfs tree (live ``/`` or an fsroot), without root: each online CPU's
``cpufreq/amd_pstate_prefcore_ranking``, ``acpi_cppc/highest_perf``, ``cpufreq/cpuinfo_max_freq`` and
``cpufreq/base_frequency``, and whether the kernel's ITMT is on. The rules: :mod:`launcher.topology.priority_rule`.

Every file is untrusted and every attribute all-or-nothing, as for core kinds: present on some online CPUs and not
others, not an integer, out of range, a FIFO or a link loop, and there are no priority cores, with the reason;
never an exception. What each file means and where that comes from: docs/priority-cores.md.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from launcher.base.cpulist import format_cpulist
from launcher.base.untrusted import clip
from launcher.errors import TopologyError
from launcher.topology._files import read_text
from launcher.topology.kinds import MAX_MHZ
from launcher.topology.kinds_sysfs import CPU, Refused, per_cpu_values
from launcher.topology.priority import none_found
from launcher.topology.priority_rule import Evidence, find_priority, frequency_classes, priority_classes

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from launcher.topology.kinds import CoreKinds
    from launcher.topology.priority import PriorityCores

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
        return _read(fsroot, cores, kinds, read or {})
    except (Refused, TopologyError) as exc:
        return none_found(str(exc))


def _read(fsroot: str, cores: Sequence[tuple[int, ...]], kinds: CoreKinds, read: Mapping[str, dict[int, int]]
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
        values = read[name] if name in read else _values(cpu_dir, pus, name, low, high, raw_unit)
        unknown = [p for p, v in values.items() if v == CPPC_UNKNOWN] if name == "acpi_cppc/highest_perf" else []
        if unknown and len(unknown) < len(values):
            notes.append(f"{name} is 255 (no value) on CPUs {clip(format_cpulist(unknown), 40)}: not used")
            values = {}
        evidence.append(Evidence(name, values, scale, unit))
    itmt = _itmt(fsroot)
    return find_priority(cores, groups, evidence, absent=ABSENT, notes=[*notes, *([itmt] if itmt else [])],
                         one_kind=classes is not None)


def _values(cpu_dir: str, pus: list[int], name: str, low: int, high: int, unit: str) -> dict[int, int]:
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
