"""One verdict per rank: is its GPU fed, and if not, what starves it (:func:`judge`). Pure.
The rules and why: docs/doctor.md, "Verdicts".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FED = "fed"
DATA = "starved-by-data"
CPU = "starved-of-cpu"
UNDERUSED = "underused"  # the GPU idles, but neither the loader nor a CPU is what it waits for
UNKNOWN = "unknown"
KINDS = (FED, DATA, CPU, UNDERUSED, UNKNOWN)

FED_BUSY = 0.80  # a GPU busy at least this share of the time is fed
STARVED_WAIT = 0.20  # a wait (for data, for a CPU) of at least this share of the time starves the loop

# What starves a main thread of CPU, in the order a cause is named (the first that applies), and its fix.
COLLAPSE = "collapse"
THROTTLED = "throttled"
OVERSUBSCRIBED = "oversubscribed"
NEIGHBOURS = "neighbours"
CPU_FIXES = {
    COLLAPSE: "launch with affrun torchrun (or affrun exec/run), or unset the binding variable in the launcher's "
              "environment, so that the rank and its workers get CPUs of their own",
    THROTTLED: "raise the CPU quota (cgroup cpu.max, a Kubernetes CPU limit) or run fewer busy threads: "
               "OMP_NUM_THREADS, DataLoader workers",
    OVERSUBSCRIBED: "fewer busy threads per CPU: lower OMP_NUM_THREADS or num_workers, or give the rank more "
                    "cores (affrun tune finds the split)",
    NEIGHBOURS: "other processes run on the rank's CPUs: give the rank cores of its own (affrun torchrun, affrun "
                "exec) or move the neighbours",
}
CPU_UNKNOWN_FIX = ("find what keeps the main thread from a CPU (a binding that piles the job onto few CPUs, a CPU "
                   "quota, too many busy threads, other processes): affrun doctor --pid PID names it")
DATA_FIX = "more loader cores or DataLoader workers: affrun tune tries them"
UNDERUSED_FIX = ("the CPU side is not the bound: profile the step (host-device syncs, small kernels, "
                 "communication, a small batch)")


@dataclass(frozen=True)
class Signals:
    """What was measured over one stretch of time, each a fraction of it (0..1), ``None`` where not measured."""

    gpu_busy: float | None = None  # NVML: the share of the time a kernel ran on the rank's GPU
    data_wait: float | None = None  # the meter: the loop's time blocked in next(loader)
    cpu_wait: float | None = None  # schedstat: the main thread's time on a run queue, waiting for a CPU
    throttled: float | None = None  # cgroup cpu.stat: the time the rank's cgroup was throttled by its quota
    cpu_cause: str | None = None  # what the caller found behind a CPU wait (COLLAPSE, ...), None: not known
    cause_text: str = ""  # that cause in words, for the evidence ("every process of the job on CPU 0")


@dataclass(frozen=True)
class Verdict:
    kind: str  # one of KINDS
    evidence: str  # the figures behind it, in words
    fix: str  # what to do ("" for fed)
    likely: str | None = None  # UNKNOWN only: what the CPU side alone suggests (DATA, CPU or None)
    cause: str | None = None  # CPU (or UNKNOWN likely CPU): the cause (COLLAPSE, THROTTLED, OVERSUBSCRIBED, NEIGHBOURS) if known

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.kind, "evidence": self.evidence, "fix": self.fix, "likely": self.likely,
                "cause": self.cause}


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def cpu_side(s: Signals) -> tuple[str | None, str]:
    """What the CPU side alone says: (DATA, CPU or None, the evidence in words). The data wait includes the
    main thread's own wait for a CPU inside ``next()``, so the wait for data proper is the difference."""
    cpu = s.cpu_wait if s.cpu_wait is not None else 0.0
    data = max(0.0, s.data_wait - cpu) if s.data_wait is not None else None
    parts = []
    if s.cpu_wait is not None:
        parts.append(f"its main thread waited {_pct(s.cpu_wait)} for a CPU")
    if s.throttled:
        parts.append(f"its cgroup was held back by its CPU quota {_pct(s.throttled)} of the time (or of its periods)")
    if s.data_wait is not None:
        parts.append(f"the loop waited {_pct(s.data_wait)} in next(loader)")
    if s.cause_text:
        parts.append(s.cause_text)
    words = "; ".join(parts)
    if s.cpu_wait is not None and cpu >= STARVED_WAIT and (data is None or cpu >= data):
        return CPU, words
    if data is not None and data >= STARVED_WAIT:
        return DATA, words
    return None, words


def _cpu_cause(s: Signals) -> str | None:
    """The cause the caller found, else throttling where it was measured, else none (never a guess)."""
    if s.cpu_cause in CPU_FIXES:
        return s.cpu_cause
    return THROTTLED if s.throttled and s.throttled >= STARVED_WAIT / 2 else None


def judge(s: Signals) -> Verdict:
    """The rank's verdict from ``s`` (docs/doctor.md, "Verdicts")."""
    side, words = cpu_side(s)
    if s.gpu_busy is None:
        why = "no GPU signal (NVML: pip install affrun[nvml])"
        cause = _cpu_cause(s) if side == CPU else None
        fix = (CPU_FIXES[cause] if cause else CPU_UNKNOWN_FIX) if side == CPU else DATA_FIX if side == DATA else ""
        return Verdict(UNKNOWN, f"{why}; {words}" if words else why, fix, likely=side, cause=cause)
    busy = f"the GPU was busy {_pct(s.gpu_busy)}"
    evidence = f"{busy}; {words}" if words else busy
    if s.gpu_busy >= FED_BUSY:
        return Verdict(FED, evidence, "")
    if side == CPU:
        cause = _cpu_cause(s)
        return Verdict(CPU, evidence, CPU_FIXES[cause] if cause else CPU_UNKNOWN_FIX, cause=cause)
    if side == DATA:
        return Verdict(DATA, evidence, DATA_FIX)
    if s.data_wait is None:
        why = "no data-wait figure (start the job with --feed-report)"
        return Verdict(UNKNOWN, f"{evidence}; {why}", "")
    return Verdict(UNDERUSED, evidence, UNDERUSED_FIX)
