"""The startup hook under ``affrun run``: decide what this Python process is (:func:`launcher.context.run_role.decide`)
and apply it: bind it as a rank, move a DataLoader worker to its loader CPUs, mark a launcher, or leave it alone.
``_affrun_startup`` (build_backend/) loads this module by its path, which installed shims name, and calls
:func:`main`. Each role and why: docs/design.md §9.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from typing import TYPE_CHECKING

from launcher.context.run_role import (
    LAUNCHER_VARIABLE,
    OWN_JOBS,
    PROBE,
    RUN_VARIABLE,
    TASK_VARIABLE,
    BoundCheck,
    affrun_command,
    affrun_process,
    decide,
)

if TYPE_CHECKING:
    from launcher.bind.wire import Job

answered_probe = False  # set under AFFRUN_RUN=probe: the hook's answer to affrun run's question


def job_of(environ: MutableMapping[str, str]) -> Job:
    """The plan ``affrun run`` handed down (``AFFRUN_PLAN``), read and checked: nothing of the planner is imported."""
    from launcher.base.errors import LaunchError
    from launcher.bind.wire import PLAN_VARIABLE, read_job

    text = environ.get(PLAN_VARIABLE)
    if not text:
        raise LaunchError(f"{RUN_VARIABLE} is set but {PLAN_VARIABLE} is not (both come from affrun run)")
    return read_job(text)


def bind_as_rank(job: Job, rank_index: int, environ: MutableMapping[str, str], *, why: str) -> list[str]:
    """Bind this process as local rank ``rank_index`` of ``job``; return its notes."""
    from launcher.base.errors import LaunchError
    from launcher.bind.apply import bind_running
    from launcher.env.rank_line import mem_text, rank_line

    if not 0 <= rank_index < job.size:
        raise LaunchError(f"local rank {rank_index} ({why}) is not in the plan of affrun run "
                          f"({job.size} ranks): give affrun run --nproc-per-node to match the launcher")
    rank = job.ranks[rank_index]
    mem = bind_running(job, rank, environ, inherited=True)
    notes = [*mem.warnings, *job.env(rank).notes]
    if job.handoff.verbose:
        from launcher.base.untrusted import shown  # notes echo the user's values

        host = os.uname().nodename
        print(shown(rank_line(rank, job.size, mem_text(mem.policy, mem.nodes), host)
                    + f" pid {os.getpid()} ({why})"), file=sys.stderr)
        for note in notes:
            print(shown(f"affrun: note: rank {rank_index}: {note}"), file=sys.stderr)
    return notes


def bind_as_worker(bound: int, environ: MutableMapping[str, str]) -> None:
    """A multiprocessing child of bound rank ``bound``: its loader CPUs when the rank has some (the one apply,
    ``bind_process``), no placement. The rank's values it inherited are read by the one strict reader."""
    from launcher.base.errors import LaunchError
    from launcher.bind.apply import apply_environment, bind_process
    from launcher.bind.readback import read_binding
    from launcher.env.variables import PLACE_VARIABLES

    try:
        binding = read_binding(environ)
    except ValueError as exc:
        raise LaunchError(f"the binding of rank {bound} this process inherited: {exc}") from None
    if binding is not None and binding.loader_cpus:
        bind_process(sorted(binding.loader_cpus), "none", (), "syscall")
    apply_environment(environ, {}, PLACE_VARIABLES)


_done = False


def bound_check(job: Job) -> BoundCheck:
    """This process's :class:`~launcher.context.run_role.BoundCheck` against ``job``: its plan's identity and its
    real mask."""
    return BoundCheck(job.identity, tuple(frozenset(r.cpus) for r in job.ranks), frozenset(os.sched_getaffinity(0)))


def leave_run(environ: MutableMapping[str, str]) -> None:
    """Take ``affrun run``'s variables (meant for this hook) out of ``environ``, for an affrun launcher below it:
    a sub-job of its own (docs/design.md §9, "an affrun launcher below it")."""
    from launcher.bind.wire import PLAN_VARIABLE

    for name in (RUN_VARIABLE, PLAN_VARIABLE, TASK_VARIABLE, LAUNCHER_VARIABLE):
        environ.pop(name, None)


def hook() -> None:
    """Decide what this process is and apply it; :class:`launcher.errors.AffrunError` for anything wrong."""
    if affrun_process(sys.orig_argv):
        if affrun_command(sys.orig_argv) in OWN_JOBS:
            leave_run(os.environ)
        return
    from launcher.bind.wire import PLAN_VARIABLE
    from launcher.env.variables import PLAN_ID_VARIABLE

    if PLAN_VARIABLE not in os.environ and PLAN_ID_VARIABLE in os.environ:
        return  # exec'd by an affrun binding (affrun exec), which takes the plan away: bound already, not ours
    job = job_of(os.environ)
    decision = decide(os.environ, sys.orig_argv, bound_check(job), pid=os.getpid())
    if decision.action == "launcher":
        os.environ.setdefault(LAUNCHER_VARIABLE, str(os.getpid()))  # its children: a launcher is above
    elif decision.action == "rank" and decision.rank is not None:
        bind_as_rank(job, decision.rank, os.environ, why=decision.reason)
    elif decision.action == "worker" and decision.rank is not None:
        bind_as_worker(decision.rank, os.environ)


def fail(line: str, status: int) -> None:
    """End the process with ``line`` on file descriptor 2 (when it is open: ``2>&-`` closes it) and ``status``;
    never on stdout, never through ``SystemExit`` (``site`` would print it as a failed .pth line and go on to
    run the user's code unbound)."""
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
    except (OSError, ValueError):
        pass
    try:
        os.write(2, (line + "\n").encode("utf-8", "replace"))
    except OSError:
        pass
    os._exit(status)


def main() -> None:
    """Run through ``_affrun_startup`` when ``AFFRUN_RUN`` is set, once per process. Anything wrong ends the
    process with one ``affrun: error:`` line and exit status 2; with stderr closed, what the hook prints goes
    nowhere (never to stdout)."""
    global _done, answered_probe
    if _done:  # site may read site-packages twice, through a lib64 link
        return
    _done = True
    if os.environ.get(RUN_VARIABLE) == PROBE:
        answered_probe = True
        return
    from launcher.base.errors import AffrunError, LaunchError, error_line

    closed = sys.stderr is None
    if closed:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # closed below
    try:
        hook()
    except AffrunError as exc:
        from launcher.options.table import spell_error

        fail(error_line(spell_error(exc)), exc.exit_code)
    except Exception as exc:  # a fault of the hook itself: still one line, and no user code unbound
        fail(error_line(LaunchError(f"the startup hook failed: {type(exc).__name__}: {exc}")), 2)
    finally:
        if closed:
            sys.stderr.close()
            sys.stderr = None
