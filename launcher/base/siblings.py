"""The cores of the live machine, as its sysfs groups CPUs (each CPU's sibling list): what a rank and its DataLoader
workers read instead of the topology model (docs/threads.md, "Workers are cut by whole cores"). The topology reader
reads the same files (:data:`CORE_FILES`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from launcher.base.cpulist import parse_cpulist, parse_hexmask

if TYPE_CHECKING:
    from collections.abc import Iterable

# A CPU's core, as the kernel spells it: (file in cpuN/topology/, a list rather than a hex mask), preferred first.
CORE_FILES = (("core_cpus_list", True), ("core_cpus", False), ("thread_siblings_list", True),
              ("thread_siblings", False))


def _siblings(cpu: int, sysfs: str) -> frozenset[int]:
    """The CPUs of ``cpu``'s core as sysfs says; ``cpu`` alone where it does not say or says nonsense."""
    base = os.path.join(sysfs, "devices", "system", "cpu", f"cpu{cpu}", "topology")
    for name, is_list in CORE_FILES:
        try:
            with open(os.path.join(base, name), encoding="ascii") as fh:
                text = fh.read(1 << 16).strip()
            found = parse_cpulist(text) if is_list else parse_hexmask(text)
        except (OSError, ValueError):
            continue
        return found if cpu in found else frozenset({cpu})
    return frozenset({cpu})


def live_cores(cpus: Iterable[int], sysfs: str = "/sys") -> tuple[tuple[int, ...], ...]:
    """``cpus`` grouped by the core that holds them, each group sorted, the groups by their first CPU. One file
    is read per core met, not per CPU; a CPU that two cores claim stays in the first."""
    wanted = set(cpus)
    groups: list[tuple[int, ...]] = []
    placed: set[int] = set()
    for cpu in sorted(wanted):
        if cpu in placed:
            continue
        group = tuple(sorted((_siblings(cpu, sysfs) & wanted) - placed))  # holds cpu: _siblings makes sure
        placed.update(group)
        groups.append(group)
    return tuple(groups)
