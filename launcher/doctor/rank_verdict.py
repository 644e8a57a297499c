"""What ``affrun doctor --pid`` measured of one rank's supply (:class:`RankStarvation`): its main thread's CPU and
its wait for a CPU, the CPU its threads wanted against the CPUs they may use, its cgroup's throttling, the busy
processes outside the job on its CPUs, its GPU's busy share, and the verdict :func:`launcher.feed.verdict.judge`
gives from them. Plain records; :mod:`launcher.doctor.starvation` fills them. Rules: docs/doctor.md "Verdicts"."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launcher.base.cpulist import format_cpulist
from launcher.doctor.neighbours import Neighbour
from launcher.doctor.throttling import Throttling
from launcher.feed.verdict import Verdict


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{100 * value:.0f}%"


@dataclass(frozen=True)
class RankGpu:
    """The GPU a rank uses and how busy it was over the sample (a share, ``None`` when NVML gave no figure)."""

    index: int  # NVML's (PCI bus order)
    pci: str
    busy: float | None
    measured: str  # "process": the rank's own processes' share (nvmlDeviceGetProcessUtilization); "device"
    mapped_by: str  # how the rank was matched to it: "process", "AFFRUN_GPU_PCI", "CUDA_VISIBLE_DEVICES"...

    def text(self) -> str:
        return (f"gpu {self.index} ({self.pci}) {_pct(self.busy)} busy ({'its processes' if self.measured == 'process' else 'the whole device'}; "
                f"matched by {self.mapped_by})")

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "pci": self.pci, "busy_fraction": None if self.busy is None else round(self.busy, 3),
                "measured": self.measured, "mapped_by": self.mapped_by}


@dataclass
class RankStarvation:
    main_tid: int | None = None
    main_cpu_percent: float = 0.0
    main_cpu_wait: float | None = None  # the share of the sample the main thread waited on a run queue
    main_ran: frozenset[int] = frozenset()
    main_allowed: frozenset[int] = frozenset()
    demand: float | None = None  # CPUs' worth its threads (its children's too) wanted: on a CPU or waiting
    used: float | None = None  # CPUs' worth they ran
    busy_threads: int = 0  # of them, those that ran at least 5% of a CPU
    supply: frozenset[int] = frozenset()  # the CPUs they may use (the union of their masks)
    used_on_main: float | None = None  # CPUs' worth the job's other threads ran on the main thread's CPUs
    throttling: Throttling | None = None  # its cgroup's
    neighbours: list[Neighbour] = field(default_factory=list)  # busy outside processes that may run on its CPUs
    gpu: RankGpu | None = None
    cause: str | None = None  # launcher.feed.verdict's COLLAPSE, THROTTLED, OVERSUBSCRIBED, NEIGHBOURS
    cause_text: str = ""
    verdict: Verdict | None = None

    def main_line(self) -> str:
        return (f"main thread {self.main_tid}: CPU {self.main_cpu_percent:.0f}%, waited {_pct(self.main_cpu_wait)} "
                f"for a CPU, ran on CPUs {format_cpulist(self.main_ran) or '-'} (allowed "
                f"{format_cpulist(self.main_allowed) or '-'})")

    def supply_line(self) -> str:
        demand = "?" if self.demand is None else f"{self.demand:.1f}"
        used = "?" if self.used is None else f"{self.used:.1f}"
        on_main = "" if self.used_on_main is None else (
            f"; the job's other threads ran {self.used_on_main:.1f} CPUs' worth on the main thread's "
            f"{len(self.main_allowed)} CPU(s)")
        throttled = ""
        if self.throttling is not None and self.throttling.periods:
            t = self.throttling
            throttled = (f"; cgroup throttled in {t.throttled_periods} of {t.periods} quota periods "
                         f"({t.throttled_s:.2f} s)")
        return (f"CPU demand {demand} CPUs (ran {used}; {self.busy_threads} busy thread(s)) on {len(self.supply)} "
                f"CPU(s) {format_cpulist(self.supply) or '-'}{on_main}{throttled}")

    def to_json(self) -> dict[str, Any]:
        return {
            "main_thread": {"tid": self.main_tid, "cpu_percent": round(self.main_cpu_percent, 1),
                            "cpu_wait_fraction": None if self.main_cpu_wait is None else round(self.main_cpu_wait, 3),
                            "ran": format_cpulist(self.main_ran), "allowed": format_cpulist(self.main_allowed)},
            "cpu_demand": None if self.demand is None else round(self.demand, 2),
            "cpu_used": None if self.used is None else round(self.used, 2),
            "busy_threads": self.busy_threads,
            "supply_cpus": format_cpulist(self.supply),
            "job_used_on_main_cpus": None if self.used_on_main is None else round(self.used_on_main, 2),
            "throttling": self.throttling.to_json() if self.throttling else None,
            "neighbours": [n.to_json() for n in self.neighbours],
            "gpu": self.gpu.to_json() if self.gpu else None,
            "cpu_cause": self.cause,
        }

    def verdict_line(self) -> str:
        if self.verdict is None:
            return "verdict: -"
        v = self.verdict
        kind = v.kind + (f" (likely {v.likely}{f', {v.cause}' if v.cause else ''})" if v.likely else
                         f" ({v.cause})" if v.cause else "")
        return f"verdict: {kind}: {v.evidence}" + (f" -- fix: {v.fix}" if v.fix else "")
