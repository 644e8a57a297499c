"""The startup hook: under ``affrun run``, every Python process binds itself before any user import.

The package installs ``affrun-startup.pth`` into site-packages (see ``build_backend/``). Python's ``site``
module executes its one line at every interpreter start; without ``AFFRUN_RUN`` in the environment the line
is a dictionary lookup and imports nothing. ``affrun run`` sets ``AFFRUN_RUN`` (the role of the first process,
``rank0`` or ``launcher``), ``AFFRUN_PLAN`` (the plan, as for ``affrun torchrun``) and, when it runs inside a
scheduler's task, ``AFFRUN_RUN_TASK`` (the rank variables of that task); then this module decides what the
starting process is (:func:`decide`, pure) and applies it (:func:`main`):

- ``rank``: a launcher's rank (``LOCAL_RANK``, ``SLURM_LOCALID``, ``OMPI_...``: the variables ``affrun exec``
  reads) not bound yet, or a rank started by a bound rank with another rank number (Lightning's ranks 1..N-1,
  started by rank 0). It gets the plan's mask, memory policy and OpenMP/BLAS variables in ``os.environ``.
  With ``AFFRUN_RUN=launcher``, rank variables of the task ``affrun run`` itself runs in (``SLURM_LOCALID`` of
  the batch script or of an srun task, unchanged: ``AFFRUN_RUN_TASK``) are not a rank: they describe the task
  that runs the launcher, not the ranks it starts.
- the first process with no rank variable, when ``AFFRUN_RUN=rank0``: it is rank 0 (Lightning's script, a
  single-process job). ``LOCAL_RANK`` is not set: Lightning reads a set ``LOCAL_RANK`` as "launched externally".
- a script or module with no rank variable started below an unbound launcher (``AFFRUN_LAUNCHER_PID``, set by
  the launcher's own hook), itself no known launcher and no ``multiprocessing`` helper, when the plan has one
  rank or accelerate's simple launcher started it (``ACCELERATE_USE_CPU``, which only that launcher sets): it
  is rank 0. accelerate runs one process without any rank variable for 1 process, ``--cpu``, or no multi-GPU
  configuration.
- ``launcher``: no rank variable and ``AFFRUN_RUN=launcher`` otherwise (torchrun's agent, ``accelerate launch``,
  ``deepspeed`` and the ``launch.py`` it starts): left as it is, so that it never confines the ranks it starts.
- ``worker``: a ``multiprocessing`` child (spawn or forkserver bootstrap) of a bound rank, such as a DataLoader
  worker. It is not rebound as a rank: it moves to the rank's loader CPUs when the plan has some, and drops the
  per-thread placement variables (``OMP_PLACES``, ``OMP_PROC_BIND``) so that its OpenMP runtime cannot pin it to
  the first place of the rank (the DataLoader collapse) nor keep a place list of another rank (a
  ``torch.multiprocessing.spawn`` child that calls :func:`launcher.bind_rank` next).
- ``inherit``: any other process below a bound rank (a helper ``subprocess``, a re-exec of the rank itself):
  already bound, left alone.
- ``skip``: affrun's own processes (``affrun exec`` binds itself; ``affrun doctor`` audits).

``AFFRUN_RUN=probe`` is no role: ``affrun run`` asking whether this interpreter loads the hook
(:mod:`launcher.launch.run_target`). The hook sets :data:`answered_probe` and does nothing else.

A malformed plan or rank variable ends the process with one ``affrun: error:`` line and exit status 2.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from typing import TYPE_CHECKING

from launcher.context.run_role import (
    LAUNCHER_VARIABLE,
    PROBE,
    RUN_VARIABLE,
    BoundCheck,
    affrun_process,
    decide,
)

if TYPE_CHECKING:
    from launcher.bind.wire import Job

# Set when AFFRUN_RUN=probe (launcher.context.run_role.PROBE): the hook's answer to affrun run's question.
answered_probe = False


def job_of(environ: MutableMapping[str, str]) -> Job:
    """The plan ``affrun run`` handed down (``AFFRUN_PLAN``), read and checked: nothing of the planner is imported."""
    from launcher.bind.wire import PLAN_VARIABLE, read_job
    from launcher.errors import LaunchError

    text = environ.get(PLAN_VARIABLE)
    if not text:
        raise LaunchError(f"{RUN_VARIABLE} is set but {PLAN_VARIABLE} is not (both come from affrun run)")
    return read_job(text)


def bind_as_rank(job: Job, rank_index: int, environ: MutableMapping[str, str], *, why: str) -> list[str]:
    """Bind this process as local rank ``rank_index`` of ``job``; return its notes."""
    from launcher.bind.apply import bind_running
    from launcher.env.rank_line import mem_text, rank_line
    from launcher.errors import LaunchError

    if not 0 <= rank_index < job.size:
        raise LaunchError(f"local rank {rank_index} ({why}) is not in the plan of affrun run "
                          f"({job.size} ranks): give affrun run --nproc-per-node to match the launcher")
    rank = job.ranks[rank_index]
    mem = bind_running(job, rank, environ)
    notes = [*mem.warnings, *rank.notes]
    if job.mem_backend == "numactl" and mem.policy != "none":
        notes.append("--mem-backend numactl: applied with set_mempolicy instead (the process is already running)")
    if job.verbose:
        from launcher.base.untrusted import shown  # notes echo the user's values

        host = os.uname().nodename
        print(shown(rank_line(rank, job.size, mem_text(mem.policy, mem.nodes), host)
                    + f" pid {os.getpid()} ({why})"), file=sys.stderr)
        for note in notes:
            print(shown(f"affrun: note: rank {rank_index}: {note}"), file=sys.stderr)
    return notes


def bind_as_worker(bound: int, environ: MutableMapping[str, str]) -> None:
    """A multiprocessing child of bound rank ``bound``: its loader CPUs when the plan has some, no placement."""
    from launcher.base.cpulist import parse_cpulist
    from launcher.base.untrusted import short
    from launcher.bind.apply import apply_environment
    from launcher.env.variables import PLACE_VARIABLES

    try:
        loader = parse_cpulist(environ.get("AFFRUN_LOADER_CPUS", ""))
    except ValueError:
        from launcher.errors import LaunchError

        raise LaunchError(f"AFFRUN_LOADER_CPUS={short(environ.get('AFFRUN_LOADER_CPUS'))} is not a cpu list") from None
    if loader:
        from launcher.bind.apply import bind_process

        bind_process(sorted(loader), "none", (), "syscall")
    apply_environment(environ, {}, PLACE_VARIABLES)


_done = False


def bound_check(job: Job) -> BoundCheck:
    """This process's :class:`~launcher.context.run_role.BoundCheck` against ``job``: its plan's identity and its
    real mask."""
    return BoundCheck(job.identity, tuple(frozenset(r.cpus) for r in job.ranks), frozenset(os.sched_getaffinity(0)))


def hook() -> None:
    """Decide what this process is and apply it; :class:`launcher.errors.AffrunError` for anything wrong."""
    if affrun_process(sys.orig_argv):
        return
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
    """Run by ``affrun-startup.pth`` (through ``_affrun_startup``) when ``AFFRUN_RUN`` is set, once per process
    (``site`` may read the site-packages directory twice, through a ``lib64`` link). With stderr closed
    (``sys.stderr`` is None) what the hook prints goes nowhere, not to stdout, as ``print`` would send it."""
    global _done, answered_probe
    if _done:
        return
    _done = True
    if os.environ.get(RUN_VARIABLE) == PROBE:
        answered_probe = True
        return
    from launcher.errors import AffrunError, LaunchError, error_line

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
