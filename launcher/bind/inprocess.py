"""``bind_rank(local_rank, nproc_per_node, **options)``: bind a rank from inside the process, for launchers that pass
the rank as a function argument (``torch.multiprocessing.spawn``, detectron2's ``launch()``), with ``affrun run``'s
plan or one made here. Each step and why: docs/launchers.md ("torch.multiprocessing.spawn"); the main thread's
core: docs/python-api.md.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.base.cpulist import format_cpulist
from launcher.base.errors import AffrunError, ConfigError, LaunchError
from launcher.base.untrusted import shown
from launcher.env.omp_syntax import thread_count

if TYPE_CHECKING:
    from collections.abc import Sequence

    from launcher.bind.wire import Job
    from launcher.context.runtimes import LoadedRuntime


@dataclass(frozen=True)
class BindReport:
    """What :func:`bind_rank` applied, what it could not, and the plan's notes and warnings for this rank."""

    local_rank: int
    nproc_per_node: int
    cpus: tuple[int, ...]
    threads: int
    applied: tuple[str, ...] = ()
    not_applied: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # the plan's for the job and this rank, when bind_rank planned it

    def __str__(self) -> str:
        lines = [f"rank {self.local_rank}/{self.nproc_per_node}: cpus {format_cpulist(self.cpus)}, "
                 f"{self.threads} thread(s)"]
        lines += [f"  applied: {a}" for a in self.applied]
        lines += [f"  not applied: {n}" for n in self.not_applied]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def _job(local_rank: int, nproc: int, options: dict[str, Any]) -> tuple[Job, bool]:
    """The :class:`~launcher.bind.wire.Job` to bind from: ``affrun run``'s, or one planned here (then ``True``)."""
    from launcher.bind.handoff import plan_job
    from launcher.bind.wire import PLAN_VARIABLE, read_job
    from launcher.context.run_role import RUN_VARIABLE
    from launcher.env.variables import user_values
    from launcher.options.keywords import BY_KEYWORD
    from launcher.options.record import Options
    from launcher.options.table import spell_error

    if os.environ.get(RUN_VARIABLE) and os.environ.get(PLAN_VARIABLE):
        if options:
            raise ConfigError(f"bind_rank: under affrun run the plan is affrun run's: drop {', '.join(options)} "
                              "(give them to affrun run)")
        job = read_job(os.environ[PLAN_VARIABLE])
        if job.size != nproc:
            raise ConfigError(f"bind_rank: nproc_per_node={nproc} but affrun run planned {job.size} "
                              f"ranks: give affrun run --nproc-per-node {nproc}")
        return job, False
    # Python's names (topology=, as the submitit executor takes it); the option's dest (topology_file=) as before.
    specs = {**BY_KEYWORD, **{spec.dest: spec for spec in BY_KEYWORD.values()}}
    unknown = sorted(set(options) - set(specs))
    if unknown:
        raise ConfigError(f"bind_rank: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(BY_KEYWORD))}")
    given = Options.from_keywords(**{specs[name].name("python"): value for name, value in options.items()})
    # Values a bound parent process left behind (AFFRUN_CPUS is set) are affrun's, not the user's.
    inherited = bool(os.environ.get("AFFRUN_CPUS"))
    user_env = {} if inherited else user_values(os.environ)
    try:
        return plan_job(given, nproc, user_env=user_env)[1].job(), True
    except AffrunError as exc:
        spell_error(exc, "python")  # the options were keyword arguments: loader_cores=5, not --loader-cores 5
        raise


def _pin_main_thread(cpus: tuple[int, ...], before: frozenset[int],
                     runtimes: Sequence[LoadedRuntime]) -> tuple[list[str], list[str]]:
    """The main thread on its core, ``cpus``: (applied, not applied). Pinned again only where it was there before
    (libgomp put it there from affrun's ``OMP_PLACES``); else it stays on the rank's CPUs (docs/python-api.md)."""
    from launcher.context.runtimes import OPENMP

    main, text = os.getpid(), format_cpulist(cpus)
    workers = ("DataLoader workers forked from it inherit that core: pass worker_init_fn=launcher.torch.worker_init_fn "
               "to each DataLoader")
    if before == frozenset(cpus):
        try:
            os.sched_setaffinity(main, cpus)
        except OSError as exc:
            return [], [f"the main thread on its core, CPU(s) {text}: {exc.strerror}"]
        return [f"the main thread (tid {main}) on its core, CPU(s) {text}, where the OpenMP runtime had put it; "
                + workers], []
    loaded = [r for r in runtimes if r.user_api == OPENMP]
    if not loaded:
        return [], [f"the main thread on its core, CPU(s) {text}, until the OpenMP runtime starts: it is the first "
                    "place of OMP_PLACES, where the runtime binds the thread that starts it (libgomp at `import "
                    "torch`); pinned now, libgomp would drop the team's places outside that core. Then " + workers]
    return [], [f"the main thread on its core, CPU(s) {text}: {loaded[0].name} was loaded before bind_rank "
                f"({loaded[0].path}) without affrun's OMP_PLACES, and the OpenMP threads it starts later inherit "
                "the main thread's mask: pinned, its whole team would share that core. It stays on the rank's CPUs "
                "(call bind_rank before `import torch` for it)"]


def bind_rank(local_rank: int, nproc_per_node: int, *, quiet: bool = False, **options: Any) -> BindReport:
    """Bind this process as local rank ``local_rank`` of ``nproc_per_node``: under ``affrun run`` with its plan
    (``options`` empty), else planned here with ``options`` (``affrun exec``'s, as keywords). Prints what it could
    not apply unless ``quiet``. Raises :class:`AffrunError` (``ConfigError`` for a wrong argument)."""
    from launcher.bind.apply import bind_running
    from launcher.bind.pools import pin_threads
    from launcher.context.runtimes import BY_NAME, OPENMP, in_process
    from launcher.options.keywords import check_argument, check_rank_keywords

    check_rank_keywords("bind_rank", nproc_per_node, local_rank)
    quiet = check_argument("bind_rank", "quiet", quiet, "flag")
    job, planned_here = _job(local_rank, nproc_per_node, options)
    rank, env = job.ranks[local_rank], job.env(job.ranks[local_rank])
    said = job.plan.warnings if planned_here and local_rank == 0 else ()  # once for the job, as affrun exec says them
    ranks = {f"rank {r.local_rank}: {w}" for r in job.ranks for w in r.warnings}
    warnings = (*(w for w in job.plan.warnings if w not in ranks), *rank.warnings) if planned_here else ()
    main_before = frozenset(os.sched_getaffinity(os.getpid()))  # libgomp may have put it on its core at load
    mem = bind_running(job, rank, os.environ, inherited=not planned_here)  # its own mask, policy and environ
    applied: list[str] = []
    not_applied: list[str] = []
    moved, failed = pin_threads(rank.cpus)
    if os.getpid() in failed or 0 in failed:
        raise LaunchError(f"bind_rank: cannot bind to CPUs {format_cpulist(rank.cpus)}: "
                          f"{failed.get(os.getpid(), failed.get(0))}")
    applied.append(f"CPU mask {format_cpulist(rank.cpus)} on {moved} thread(s)")
    not_applied += [f"thread {tid}: {error}" for tid, error in failed.items()]
    runtimes = in_process()  # threadpoolctl's controllers, which set the counts below
    if rank.main_cpus:
        pinned, missed = _pin_main_thread(rank.main_cpus, main_before, [r for r, _ in runtimes])
        applied += pinned
        not_applied += missed
    if mem.policy != "none":
        applied.append(f"memory policy {mem.policy} on node(s) {','.join(map(str, mem.nodes))}")
    not_applied += mem.warnings
    applied.append("OMP/KMP/MKL/OPENBLAS and AFFRUN_* variables in os.environ (for runtimes not started yet "
                   "and for child processes)")
    threads = env.set.get("OMP_NUM_THREADS", str(rank.threads))
    count = thread_count(threads) or rank.threads
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(count)
        applied.append(f"torch.set_num_threads({count})")
    for runtime, lib in runtimes:
        lib.set_num_threads(count)
        call = f"{runtime.name}: {BY_NAME[runtime.name].setter}({count})"
        if lib.num_threads == count:  # read back: a setter that did nothing is not said to be applied
            applied.append(call)
        else:
            not_applied.append(f"{call}: it still reports {lib.num_threads} thread(s)")
        if runtime.name == "libgomp":
            not_applied.append(f"per-thread places (OMP_PLACES={env.set.get('OMP_PLACES', '')}, "
                               f"OMP_PROC_BIND={env.set.get('OMP_PROC_BIND', '')}): libgomp read them when it was "
                               f"loaded ({runtime.path}); its threads stay inside the mask, unpinned")
        elif runtime.user_api == OPENMP:
            not_applied.append(f"{runtime.name} reads OMP_PLACES/KMP_AFFINITY at its first parallel region: applied "
                               "only if none has run in this process yet")
    report = BindReport(local_rank, nproc_per_node, rank.cpus, count, tuple(applied), tuple(not_applied),
                        env.notes, warnings)
    if not quiet:
        for item in said:
            print(shown(f"affrun: warning: bind_rank({local_rank}): {item}"), file=sys.stderr)
        for item in report.not_applied:
            print(shown(f"affrun: note: bind_rank({local_rank}): not applied: {item}"), file=sys.stderr)
    return report
