"""Apply a rank's binding to this process: CPU mask and memory policy (both survive ``execve`` and are inherited
by children), then ``execvpe`` the rank's command. The last step of ``affrun exec`` and of the startup hook."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from launcher.base.cpulist import format_cpulist
from launcher.base.errors import LaunchError, error_line

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, MutableMapping, Sequence

    from launcher.bind.mempolicy import MemResult
    from launcher.bind.wire import Job
    from launcher.plan.record import RankPlan


def bind_process(cpus: Sequence[int], mem_policy: str, mem_nodes: tuple[int, ...], mem_backend: str,
                 inherited: RankPlan | None = None) -> MemResult:
    """Set this process's CPU mask and memory policy (both survive ``execve`` and are inherited by children).
    Memory nodes this machine lacks are a :class:`LaunchError` first; a mask the kernel narrows is one warning
    line, or for a rank of an inherited plan (``inherited``) a :class:`LaunchError` (docs/design.md §7)."""
    from launcher.bind.mempolicy import apply_mempolicy, missing_nodes

    missing = missing_nodes(mem_nodes) if mem_policy != "none" else ()
    if missing:
        raise LaunchError(f"memory policy {mem_policy} names NUMA node(s) {','.join(map(str, missing))}, which this "
                          "machine does not have: the plan was made for another machine")
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        raise LaunchError(f"cannot bind to CPUs {format_cpulist(cpus)}: {exc.strerror} "
                          f"(allowed here: {format_cpulist(os.sched_getaffinity(0))})") from None
    got = os.sched_getaffinity(0)
    if got != set(cpus) and inherited is not None:
        from launcher.bind.inherited import binding_fault
        from launcher.bind.wire import PLAN_VARIABLE

        fault = binding_fault(inherited, frozenset(got)) or f"it got CPUs {format_cpulist(got)}"
        raise LaunchError(f"the inherited plan ({PLAN_VARIABLE}) cannot be rank {inherited.local_rank}'s binding "
                          f"here: {fault}")
    if got != set(cpus):
        print(f"affrun: warning: the kernel narrowed the CPUs {format_cpulist(cpus)} to "
              f"{format_cpulist(got)}: the plan was made for CPUs this process's cpuset does not allow",
              file=sys.stderr)
    return apply_mempolicy(mem_policy, mem_nodes, mem_backend)


def exec_or_status(argv: Sequence[str], env: Mapping[str, str],
                   explain: Callable[[OSError], tuple[str, int] | None] | None = None) -> int:
    """``execvpe`` ``argv`` in place; when that fails, one ``affrun: error:`` line and the shell's status
    (127: not found, 126: not executable), or what ``explain`` makes of the error (a ``#!`` interpreter)."""
    try:
        os.execvpe(argv[0], list(argv), env)
    except OSError as exc:
        said = explain(exc) if explain is not None else None
        if said is not None:
            print(error_line(LaunchError(said[0])), file=sys.stderr)
            return said[1]
        if isinstance(exc, FileNotFoundError):
            print(error_line(LaunchError(f"{argv[0]}: command not found")), file=sys.stderr)
            return 127
        if isinstance(exc, PermissionError):
            print(error_line(LaunchError(f"{argv[0]}: permission denied")), file=sys.stderr)
            return 126
        print(error_line(LaunchError(f"{argv[0]}: {exc.strerror}")), file=sys.stderr)
        return 126
    return 0  # pragma: no cover - execvpe does not return


def rank_variables(job: Job, rank: RankPlan) -> dict[str, str]:
    """Every variable affrun sets for ``rank``: the OpenMP/BLAS ones its parent decided, ``AFFRUN_*`` written
    from its fields, and ``AFFRUN_PLAN_ID``, the proof of this binding that the startup hook asks of the rank's
    children."""
    from launcher.env.variables import PLAN_ID_VARIABLE, affrun_variables

    env, handoff = job.env(rank), job.handoff
    return {**env.set, **affrun_variables(rank, job.size, handoff.bind, policy=handoff.env_policy,
                                          hooks=handoff.rank_hooks, user_pools=env.user_pools),
            PLAN_ID_VARIABLE: job.identity}


def rank_environ(job: Job, rank: RankPlan, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment ``rank``'s command is exec'd with: ``environ`` without what the policy removes and without
    ``AFFRUN_PLAN`` (the rank's binding is applied: its children need no plan), plus :func:`rank_variables`."""
    from launcher.bind.wire import PLAN_VARIABLE

    unset = job.env(rank).unset
    env = {k: v for k, v in environ.items() if k not in unset and k != PLAN_VARIABLE}
    env.update(rank_variables(job, rank))
    return env


def apply_environment(environ: MutableMapping[str, str], set_: Mapping[str, str], unset: Sequence[str]) -> None:
    """Remove ``unset`` from ``environ``, then set ``set_``."""
    for name in unset:
        environ.pop(name, None)
    environ.update(set_)


def bind_running(job: Job, rank: RankPlan, environ: MutableMapping[str, str], inherited: bool) -> MemResult:
    """Bind the running process as ``rank`` (the startup hook, ``bind_rank``): its mask, its memory policy through
    the system call (numactl cannot wrap a running process), and its variables in ``environ``, ``AFFRUN_MEM`` the
    policy that took. ``inherited``: ``job`` came from ``AFFRUN_PLAN``."""
    from launcher.env.rank_line import MEM_VARIABLE, mem_text

    handoff = job.handoff
    backend = "syscall" if handoff.mem_backend in ("auto", "numactl") else handoff.mem_backend
    mem = bind_process(rank.cpus, handoff.mem_policy, rank.mem_nodes, backend, rank if inherited else None)
    if handoff.mem_backend == "numactl" and mem.policy != "none":
        mem.warnings += ("--mem-backend numactl cannot wrap a running process: set_mempolicy was used",)
    apply_environment(environ, {**rank_variables(job, rank), MEM_VARIABLE: mem_text(mem.policy, mem.nodes)},
                      job.env(rank).unset)
    return mem
