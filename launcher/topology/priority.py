"""Priority cores: the few cores of one kind that run at a higher clock than the rest (Intel Turbo Boost Max 3.0
favoured cores under ITMT, SST-TF/SST-BF high-priority cores, Xeon 6 Priority Core Turbo). The model only;
pure. Readers fill it from a sysfs tree, a snapshot or an hwloc XML; what is found and why: docs/priority-cores.md.

A rank's main thread may live on one of them (``--main-thread priority``, :mod:`launcher.plan.priority`). Where
none are found, :attr:`PriorityCores.why_none` says why, for ``affrun topology``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PriorityCores:
    """The priority CPUs of a machine (online PUs), best first in :attr:`order`; empty with :attr:`why_none`."""

    cpus: frozenset[int] = frozenset()
    order: tuple[int, ...] = ()  # the same CPUs, the highest priority first (ties in CPU order)
    source: str = ""  # the evidence, for people: "acpi_cppc/highest_perf 255 against 224 (ITMT on)"
    why_none: str = ""  # when ``cpus`` is empty: why none were found ("every core has highest_perf 255")

    def restricted(self, allowed: frozenset[int]) -> PriorityCores:
        """The priority CPUs among ``allowed``; none left is said in :attr:`why_none`."""
        cpus = self.cpus & allowed
        if cpus == self.cpus:
            return self
        if not cpus:
            return PriorityCores(why_none=f"none of the priority CPUs is allowed here ({self.source})")
        return PriorityCores(cpus, tuple(c for c in self.order if c in cpus), self.source)

    def to_json(self) -> dict[str, object]:
        return {"cpus": sorted(self.cpus), "order": list(self.order), "source": self.source,
                "why_none": self.why_none}
