"""The cores of the live machine, as its sysfs groups CPUs (each CPU's sibling list). A rank's DataLoader workers
are cut from its CPUs core by core (:func:`launcher.base.split.worker_cpus`), and the rank and its workers ask
here rather than load the topology model: it is their short import path (docs/threads.md, "Workers")."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from launcher.base.cpulist import parse_cpulist

if TYPE_CHECKING:
    from collections.abc import Iterable

SIBLING_FILES = ("core_cpus_list", "thread_siblings_list")  # 5.x kernels' name, then the older one


def _siblings(cpu: int, sysfs: str) -> frozenset[int]:
    """The CPUs of ``cpu``'s core as sysfs lists them; ``cpu`` alone where it does not say or says nonsense."""
    base = os.path.join(sysfs, "devices", "system", "cpu", f"cpu{cpu}", "topology")
    for name in SIBLING_FILES:
        try:
            with open(os.path.join(base, name), encoding="ascii") as fh:
                found = parse_cpulist(fh.read(4096).strip())
        except (OSError, ValueError):
            continue
        return found if cpu in found else frozenset({cpu})
    return frozenset({cpu})


def live_cores(cpus: Iterable[int], sysfs: str = "/sys") -> tuple[tuple[int, ...], ...]:
    """``cpus`` grouped by the core that holds them, each group sorted, the groups by their first CPU. One file
    is read per core met, not per CPU; a CPU that sysfs puts in a group already taken stays on its own."""
    groups: list[tuple[int, ...]] = []
    placed: set[int] = set()
    wanted = sorted(set(cpus))
    for cpu in wanted:
        if cpu in placed:
            continue
        group = tuple(c for c in sorted(_siblings(cpu, sysfs) & set(wanted)) if c not in placed) or (cpu,)
        if cpu not in group:
            group = (cpu,)
        placed.update(group)
        groups.append(group)
    return tuple(groups)
