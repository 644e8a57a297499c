"""Priority cores: the few cores of one kind that run at a higher clock than the rest (Intel Turbo Boost Max 3.0
favoured cores under ITMT, SST-TF/SST-BF high-priority cores, Xeon 6 Priority Core Turbo). The model and its
snapshot reader; pure. The rule that finds them: :mod:`launcher.topology.priority_rule`; what is read, and why:
docs/priority-cores.md.

A rank's main thread may live on one of them (``--main-thread priority``, :mod:`launcher.plan.priority`). Where
none are found, :attr:`PriorityCores.why_none` says why, for ``affrun topology``.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.base.cpulist import format_cpulist, id_problem
from launcher.base.untrusted import clip, unwritable

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

    def to_json(self) -> dict[str, object]:
        return {"cpus": sorted(self.cpus), "order": list(self.order), "source": self.source,
                "why_none": self.why_none, "one_kind": self.one_kind}


def none_found(why: str, *, one_kind: bool = False) -> PriorityCores:
    """No priority cores, with the reason (one line, clipped)."""
    return PriorityCores(why_none=clip(" ".join(why.split()), MAX_TEXT), one_kind=one_kind)


def priority_from_json(data: object, online: frozenset[int], what: str = "priority_cores") -> PriorityCores:
    """Read back :meth:`PriorityCores.to_json` from a snapshot; ``online``: the topology's online CPUs. Anything
    but what affrun writes is no priority cores with the reason, never an exception."""
    if data is None:
        return none_found(f"{what}: not in this snapshot (saved by an affrun that did not look for them)")
    if not isinstance(data, dict):
        return none_found(f"{what}: expected an object; ignored")
    cpus, order, source, why, one_kind = (data.get(k) for k in ("cpus", "order", "source", "why_none", "one_kind"))
    if not isinstance(cpus, list) or not isinstance(order, list) or not all(
            type(c) is int and id_problem(c) is None for c in (*cpus, *order)):
        return none_found(f"{what}: cpus and order must be lists of CPU ids; ignored")
    if len(set(cpus)) != len(cpus) or sorted(order) != sorted(cpus):
        return none_found(f"{what}: order must hold each of cpus once; ignored")
    if not set(cpus) <= online:
        return none_found(f"{what}: CPUs {clip(format_cpulist(set(cpus) - online), 40)} are not online; ignored")
    texts = (source, why)
    if not all(isinstance(t, str) and unwritable(t) is None for t in texts) or type(one_kind) is not bool:
        return none_found(f"{what}: source and why_none must be one-line strings, one_kind a boolean; ignored")
    assert isinstance(source, str) and isinstance(why, str)
    if cpus and not source:
        return none_found(f"{what}: priority CPUs without their evidence (source); ignored")
    if not cpus:
        return PriorityCores(why_none=clip(why, MAX_TEXT), one_kind=one_kind)
    return PriorityCores(frozenset(cpus), tuple(order), clip(source, MAX_TEXT), one_kind=one_kind)
