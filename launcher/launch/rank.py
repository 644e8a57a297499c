"""One rank, what ``affrun exec`` does once its options are read: take its record from the parent's ``AFFRUN_PLAN``
or plan here, bind it (:mod:`launcher.bind.apply`), then ``execvpe`` CMD (same PID, no wrapper). It runs before
every rank and imports no click, psutil, yaml, cpuinfo, submitit or torch (tests/system/test_light_imports.py).
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import TYPE_CHECKING

from launcher.base.errors import AffrunError, ConfigError, LaunchError, error_line
from launcher.base.untrusted import note_line, shell_join, shown, warning_line
from launcher.bind.apply import bind_process, exec_or_status, rank_environ, rank_variables
from launcher.bind.wire import PLAN_VARIABLE, Job, read_job
from launcher.context.local_rank import LocalRank
from launcher.env.rank_line import MEM_VARIABLE, mem_text, rank_line
from launcher.env.variables import user_values

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from types import SimpleNamespace as Args
    from typing import Any

    from launcher.plan.record import RankPlan


def _job_and_rank(args: Args, environ: Mapping[str, str],
                  given: Sequence[str] = ()) -> tuple[Job, RankPlan, LocalRank | None]:
    """The job this rank belongs to, its record, and the launcher's rank variables (when they were read): the
    parent's ``AFFRUN_PLAN``, or a plan made here (srun, mpirun, submitit, or options ``given``: docs/launchers.md)."""

    detected: LocalRank | None = None
    if args.local_rank is None or args.nproc is None:  # both flags given: the launcher's variables do not matter
        detected = _launcher_rank(environ)
    rank = args.local_rank if args.local_rank is not None else (detected.rank if detected else None)
    parent_text = environ.get(PLAN_VARIABLE)
    user_env: Mapping[str, str] | None = None
    if parent_text:
        job = read_job(parent_text)
        if not given:
            if rank is None:
                raise LaunchError(f"{PLAN_VARIABLE} is set but no local rank: pass --local-rank")
            if detected is not None and detected.size != job.size:
                raise LaunchError(f"{size_source(detected)}={detected.size} but the inherited plan ({PLAN_VARIABLE}) "
                                  f"has {job.size} rank(s), so it was made for another job: give its maker --nproc-per-node "
                                  f"{detected.size}, or give affrun exec options of its own to plan here")
            if not 0 <= rank < job.size:
                raise LaunchError(f"local rank {rank} is not in the plan ({job.size} ranks)")
            return job, job.ranks[rank], detected
        user_env = job.handoff.user_env  # the user's own values, before the parent set any (torchrun's OMP_NUM_THREADS)
    from launcher.bind.handoff import plan_job
    from launcher.options.record import Options

    nproc = args.nproc if args.nproc is not None else (detected.size if detected else None)
    if rank is None or nproc is None:
        if rank is None and nproc is None:
            # one rank, or one per --gpus/--map entry
            rank, nproc = 0, Options.from_args(args).rank_count() or 1
        else:
            raise LaunchError("give both --local-rank and --nproc-per-node, or neither (then LOCAL_RANK, "
                              "SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or PMI_LOCAL_RANK)")
    from launcher.plan.request import check_rank_count

    check_rank_count(nproc)
    if not 0 <= rank < nproc:
        raise LaunchError(f"local rank {rank} is outside 0..{nproc - 1}")
    if user_env is None:
        user_env = user_values(environ)
    tuned = getattr(args, "tuned_file", None)
    if tuned is None:
        _, parent = plan_job(Options.from_args(args), nproc, environ=environ, user_env=user_env)
    else:  # the file of another machine is warned about before planning; an error it caused names it
        from launcher.options.tuned import foreign_check, plan_tuned

        loaded = foreign_check(tuned, Options.from_args(args), environ, _warn if rank == 0 else lambda _: None)
        _, parent = plan_tuned(tuned, args, lambda a: plan_job(Options.from_args(a), nproc, environ=environ,
                                                                user_env=user_env, loaded=loaded))
    job = parent.job()
    for warning in job.plan.warnings if rank == 0 else ():  # planned here: nobody above printed them
        _warn(warning)
    return job, job.ranks[rank], detected


def _warn(text: str) -> None:
    print(warning_line(text), file=sys.stderr)


def size_source(detected: LocalRank) -> str:
    """The variable that gave ``detected``'s rank count (Slurm's from one of two)."""
    from launcher.context.local_rank import SOURCES

    if detected.source == "SLURM_LOCALID":
        return "SLURM_STEP_TASKS_PER_NODE/SLURM_NTASKS_PER_NODE"
    return dict(SOURCES).get(detected.source, "the launcher's rank count")


def _launcher_rank(environ: Mapping[str, str]) -> LocalRank | None:
    """The launcher's rank variables, unless they are an enclosing affrun rank's (a sub-job: docs/launchers.md,
    "Nested launchers")."""
    detected, enclosing = _read_launcher_rank(environ)
    return None if enclosing else detected


def _read_launcher_rank(environ: Mapping[str, str]) -> tuple[LocalRank | None, bool]:
    """The launcher's rank variables, and whether they are an enclosing affrun rank's (this is a sub-job)."""
    from launcher.context.local_rank import LocalRankError, detect_local_rank, enclosing_rank

    try:
        detected = detect_local_rank(environ)
    except LocalRankError as exc:
        raise LaunchError(str(exc)) from None
    return detected, detected is not None and PLAN_VARIABLE not in environ and enclosing_rank(environ, detected)


def _mark_subjob(env: dict[str, str], environ: Mapping[str, str], local_rank: int, size: int) -> None:
    """``AFFRUN_SUBJOB_OF`` for the command: the launcher's rank variables this process was not bound as, so that
    an ``affrun exec`` inside it does not read them again."""
    from launcher.context.local_rank import subjob_mark
    from launcher.env.variables import SUBJOB_VARIABLE

    env.pop(SUBJOB_VARIABLE, None)
    if PLAN_VARIABLE in environ:
        return
    try:
        detected, enclosing = _read_launcher_rank(environ)
    except LaunchError:  # malformed, and not read: both flags were given
        return
    if detected is not None and (enclosing or (detected.rank, detected.size) != (local_rank, size)):
        env[SUBJOB_VARIABLE] = subjob_mark(detected)


def _local_ranks(args: Args, environ: Mapping[str, str]) -> int:
    """How many local ranks this rank has, as far as the flags and the launcher's variables say (1: unknown)."""
    if args.nproc is not None:
        return int(args.nproc)
    try:
        detected = _launcher_rank(environ)
    except LaunchError:
        return 1
    return detected.size if detected else 1


def main(command: list[str], values: dict[str, Any], on_line: set[str]) -> int:
    """``affrun exec``: the options' ``values`` by ``dest`` (those the command line gave: ``on_line``), COMMAND."""
    from launcher.options.table import BINDING_OPTIONS, FEED_OPTIONS, NPROC_OPTION

    tuned = None
    if values["tuned"] is not None:  # affrun tune --save's options, under the flags given here
        from launcher.options.tuned import apply_tuned

        tuned = apply_tuned(values, on_line)
    args = SimpleNamespace(**values, tuned_file=tuned)
    if not command and not args.dry_run:
        raise ConfigError("no command: use affrun exec [OPTIONS] -- CMD [ARGS...]")
    environ = os.environ
    from launcher.context.inherited_mask import read_collapse

    collapse = read_collapse(environ, lambda: _local_ranks(args, environ))
    if collapse is not None:
        _warn(f"{collapse.message()}. Fix: {collapse.fix()}")
    given = [spec.flag for spec in (*BINDING_OPTIONS, NPROC_OPTION) if spec.dest in on_line]
    given += ["--tuned"] if tuned is not None else []  # its planning options, like those of the line
    job, rank, detected = _job_and_rank(args, environ, given)
    here = [f"planned here for {', '.join(given)}: the inherited {PLAN_VARIABLE} is set aside"] if (
        given and PLAN_VARIABLE in environ) else []
    notes = [*here, *job.env(rank).notes]
    verbose = args.verbose or job.handoff.verbose
    mem_policy = job.handoff.mem_policy
    env = rank_environ(job, rank, environ)
    _mark_subjob(env, environ, rank.local_rank, job.size)
    env[MEM_VARIABLE] = mem_text(mem_policy, rank.mem_nodes)  # as planned; what took is written below
    feed: dict[str, str] = {}
    # --feed-*, --loader-workers (0 is a value: "is False", since 0 == False)
    if any(values[spec.dest] is not None and values[spec.dest] is not False for spec in FEED_OPTIONS):
        from launcher.feed.variables import feed_variables

        feed = feed_variables(args)
        env.update(feed)
    if detected is not None and PLAN_VARIABLE not in environ:
        # Under srun/mpirun nobody sets torch's env:// variables (torchrun does): derive the missing ones.
        from launcher.context.local_rank import torch_distributed_env

        for name, value in torch_distributed_env(environ, detected).items():
            env.setdefault(name, value)
    host = os.uname().nodename  # gethostname() without importing socket on the per-rank path
    if args.dry_run:  # every line shown: values, notes and the command may hold a newline or an escape sequence
        print(shown(rank_line(rank, job.size, mem_text(mem_policy, rank.mem_nodes), host)))
        for name in sorted({*rank_variables(job, rank), MEM_VARIABLE, *feed}):
            print(shown(f"{name}={env[name]}"))
        for name in job.env(rank).unset:
            print(shown(f"unset {name}"))
        from launcher.launch.dry_run import rank_notes

        for line in rank_notes(job, rank, False, before=here, after=rank.warnings):
            print(line)
        if command:
            print("exec " + shell_join(command))
        return 0
    if feed and detected is None and PLAN_VARIABLE not in environ and job.size == 1 \
            and environ.get("WORLD_SIZE", "1") == "1" and environ.get("RANK", "0") == "0":
        from launcher.feed.variables import start_afresh

        start_afresh(feed)  # the job's only rank: an old --feed-json file goes, as under torchrun and run
    inherited = rank if environ.get(PLAN_VARIABLE) and not given else None  # the parent's plan: true here, or refused
    mem = bind_process(rank.cpus, mem_policy, rank.mem_nodes, job.handoff.mem_backend, inherited)
    env[MEM_VARIABLE] = mem_text(mem.policy, mem.nodes)
    for warning in mem.warnings:
        _warn(f"rank {rank.local_rank}: {warning}")
    if verbose:
        print(shown(rank_line(rank, job.size, mem_text(mem.policy, mem.nodes), host)), file=sys.stderr)
        for note in notes:
            print(note_line(f"rank {rank.local_rank}: {note}"), file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    if mem.wrapper:  # numactl would exit 1 with its own message: say what a shell says, with its status
        said = _cannot_start(command, env, None)
        if said is not None:
            print(error_line(LaunchError(said[0])), file=sys.stderr)
            return said[1]
    return exec_or_status([*mem.wrapper, *command], env, lambda exc: _cannot_start(command, env, exc))


def defaults() -> dict[str, Any]:
    """What ``affrun exec --`` reads as its options' values: the table's defaults, as click gives them."""
    from launcher.options.table import LAUNCH_OPTIONS

    values = {spec.dest: (spec.default or False) if spec.is_flag else () if spec.kind == "lines" else spec.default
              for spec in LAUNCH_OPTIONS}
    return {**values, "local_rank": None, "nproc": None, "verbose": False, "dry_run": False}


def unparsed(command: list[str]) -> int:
    """``affrun exec -- CMD`` with no option (every worker of ``affrun torchrun``), without a parser; an error is
    one line and its exit status."""
    from launcher.options.table import spell_error

    try:
        return main(command, defaults(), set())
    except AffrunError as exc:
        print(error_line(spell_error(exc)), file=sys.stderr)
        return exc.exit_code


def _cannot_start(command: Sequence[str], env: Mapping[str, str], exc: OSError | None) -> tuple[str, int] | None:
    """What a shell says when ``command`` cannot start (:func:`launcher.launch.shebang.exec_failure`)."""
    from launcher.launch.shebang import exec_failure

    return exec_failure(command, env, exc)
