"""``affrun doctor --pid``: the processes of an ``affrun run`` job that carry its plan but were never bound
(``run-unbound``), told by the startup hook's own rule (docs/design.md, "Under ``affrun run``")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from launcher.base.cpulist import format_cpulist
from launcher.doctor.findings import Finding


class Process(Protocol):
    """What the check reads of a sampled process (:class:`launcher.doctor.live.ProcessRecord`)."""

    pid: int
    comm: str
    cmdline: list[str]
    environ: dict[str, str]

    @property
    def mask(self) -> frozenset[int]: ...

    def label(self) -> str: ...


def planned_cpus(process: Process) -> tuple[int, frozenset[int]] | None:
    """The local rank and CPUs ``affrun run``'s hook binds ``process`` to (``None``: it binds none: no plan, a
    launcher, a worker or helper of a bound rank, a plan that cannot be read)."""
    from launcher.base.errors import AffrunError
    from launcher.bind.wire import PLAN_VARIABLE, read_job
    from launcher.context.run_role import PROBE, RUN_VARIABLE, BoundCheck, decide

    if not process.environ.get(RUN_VARIABLE) or process.environ.get(RUN_VARIABLE) == PROBE:
        return None
    try:
        job = read_job(process.environ.get(PLAN_VARIABLE) or "")  # refused (no plan): the hook said so and ended it
        # What the hook decided at the process's start: its environment then (/proc/PID/environ), and its mask
        check = BoundCheck(job.identity, tuple(frozenset(r.cpus) for r in job.ranks), process.mask)
        decision = decide(process.environ, process.cmdline, check, pid=process.pid)
    except AffrunError:
        return None  # the hook refused it with an error line: the process ended there
    if decision.action != "rank" or decision.rank is None or not 0 <= decision.rank < job.size:
        return None
    return decision.rank, frozenset(job.ranks[decision.rank].cpus)


def unbound_findings(processes: Iterable[Process]) -> list[Finding]:
    """A process the plan makes a rank, some of whose threads may run outside that rank's CPUs: the hook did not
    bind it (its interpreter does not load ``affrun-startup.pth``, or ``-S`` kept ``site`` from running)."""
    out: list[Finding] = []
    for process in processes:
        planned = planned_cpus(process)
        mask = process.mask
        if planned is None or not mask or mask <= planned[1]:
            continue
        rank, cpus = planned
        python = process.cmdline[0] if process.cmdline else process.comm
        out.append(Finding(
            "run-unbound", "error",
            f"pid {process.pid} ({python}) carries affrun run's plan as local rank {rank} (CPUs "
            f"{format_cpulist(cpus)}) but runs on CPUs {format_cpulist(mask)}: it was not bound",
            "its interpreter did not load affrun's startup hook (a Python without affrun installed, or run with "
            "-S), so it runs on the CPUs it started with, which other ranks may share",
            f"run the job with the python of the environment that has affrun, or install affrun into {python}'s "
            "environment; `affrun run --strict` refuses such a command before it starts",
            process.label(),
        ))
    return out
