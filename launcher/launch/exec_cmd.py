"""``affrun exec [OPTIONS] -- CMD ARGS...``: bind one rank, then ``execvpe`` CMD (same PID, no wrapper).

A thin front end: the plan comes from the parent (:mod:`launcher.bind.handoff`, ``AFFRUN_PLAN``) or is made here
(:func:`launcher.bind.handoff.plan_job`), the environment from :mod:`launcher.env.policy`, and :mod:`launcher.bind.apply` binds
and execs. This module is the hot path: it runs before every rank. It imports the pure core and as little of
the standard library as it can: argparse only when there are options to parse, json only to read
``AFFRUN_PLAN``, no typing or dataclasses (docs/design.md §11), and no click, psutil, yaml, cpuinfo, submitit
or torch.
tests/test_light_imports.py holds that.
"""

from __future__ import annotations

import os
import sys

from launcher.base.untrusted import short
from launcher.bind.apply import bind_process, exec_or_status
from launcher.bind.handoff import PLAN_ID_VARIABLE, PLAN_VARIABLE, ParentPlan, option_values, plan_job, rank_line
from launcher.context.local_rank import LocalRank
from launcher.env.policy import RankEnvironment, rank_environment
from launcher.env.rank_line import MEM_VARIABLE, mem_text
from launcher.errors import LaunchError, error_line
from launcher.options.plan_options import plan_options_from
from launcher.options.table import BINDING_OPTIONS, add_binding_arguments, non_negative
from launcher.plan.planner import RankPlan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a rank imports this module (docs/design.md §11)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping, Sequence
    from types import SimpleNamespace

    Args = argparse.Namespace | SimpleNamespace


def build_parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(
        prog="affrun exec",
        description="Bind this rank (local rank from LOCAL_RANK, SLURM_LOCALID, OMPI_..., MPI_..., PMI_...), "
        "set its OpenMP/BLAS environment and memory policy, then exec CMD in place.",
        usage="affrun exec [OPTIONS] -- CMD [ARGS...]",
    )
    p.add_argument("--local-rank", type=non_negative, help="This process's local rank (default: from the launcher's variables).")
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc", type=non_negative,
                   help="Local ranks on this node (default: from the launcher's variables).")
    add_binding_arguments(p)
    p.add_argument("-v", "--verbose", action="store_true", help="Print one line per rank on stderr.")
    p.add_argument("--dry-run", action="store_true", help="Print what would be applied and exit 0.")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return p


def default_args() -> SimpleNamespace:
    """What ``build_parser().parse_args([])`` gives (a test holds the two equal), without importing argparse: a
    rank started with no options (every ``affrun torchrun`` worker, most srun tasks) skips the 4 ms that argparse,
    gettext and locale cost it."""
    from types import SimpleNamespace

    values = {spec.dest: False if spec.is_flag else spec.default for spec in BINDING_OPTIONS}
    return SimpleNamespace(local_rank=None, nproc=None, **values, verbose=False, dry_run=False, command=[])


def parse_args(before: Sequence[str]) -> Args:
    return build_parser().parse_args(before) if before else default_args()


def _split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = list(argv).index("--")
        return list(argv[:i]), list(argv[i + 1 :])
    return list(argv), []


def _parent_or_standalone(
    args: Args, environ: Mapping[str, str]
) -> tuple[ParentPlan, RankPlan, LocalRank | None]:
    from launcher.context.local_rank import LocalRankError, detect_local_rank

    detected: LocalRank | None = None
    if args.local_rank is None or args.nproc is None:  # both flags given: the launcher's variables do not matter
        try:
            detected = detect_local_rank(environ)
        except LocalRankError as exc:
            raise LaunchError(str(exc)) from None
    parent_text = environ.get(PLAN_VARIABLE)
    if parent_text:
        parent = ParentPlan.from_env(parent_text)
        rank = args.local_rank if args.local_rank is not None else (detected.rank if detected else None)
        if rank is None:
            raise LaunchError(f"{PLAN_VARIABLE} is set but no local rank: pass --local-rank")
        if not 0 <= rank < len(parent.plan.ranks):
            raise LaunchError(f"local rank {rank} is not in the plan ({len(parent.plan.ranks)} ranks)")
        return parent, parent.plan.ranks[rank], detected

    nproc = args.nproc if args.nproc is not None else (detected.size if detected else None)
    rank = args.local_rank if args.local_rank is not None else (detected.rank if detected else None)
    if rank is None or nproc is None:
        if rank is None and nproc is None:
            rank, nproc = 0, plan_options_from(args).rank_count() or 1
        else:
            raise LaunchError("give both --local-rank and --nproc-per-node, or neither (then LOCAL_RANK, "
                              "SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or PMI_LOCAL_RANK)")
    if not 0 <= rank < nproc:
        raise LaunchError(f"local rank {rank} is outside 0..{nproc - 1}")
    _, parent = plan_job(option_values(args), nproc, environ=environ)
    return parent, parent.plan.ranks[rank], detected


def _local_ranks(args: Args, environ: Mapping[str, str]) -> int:
    """How many local ranks this rank has, as far as the flags and the launcher's variables say (1: unknown)."""
    if args.nproc is not None:
        return int(args.nproc)
    from launcher.context.local_rank import LocalRankError, detect_local_rank

    try:
        detected = detect_local_rank(environ)
    except LocalRankError:
        return 1
    return detected.size if detected else 1


def prepare(args: Args, environ: Mapping[str, str]) -> tuple[ParentPlan, RankPlan, RankEnvironment]:
    parent, rank, detected = _parent_or_standalone(args, environ)
    # The policy judges what the *user* set: in a torchrun child, OMP_NUM_THREADS=1 came from torchrun, not the user.
    user_env = dict(environ)
    if parent.user_env or PLAN_VARIABLE in environ:
        user_env.pop("OMP_NUM_THREADS", None)
        user_env.update(parent.user_env)
    renv = rank_environment(rank, local_world_size=len(parent.plan.ranks), user_env=user_env, bind=parent.bind,
                            smt=parent.plan.smt, policy=parent.env_policy)
    renv.set[MEM_VARIABLE] = mem_text(parent.mem_policy, rank.mem_nodes)  # as planned; main() writes what took
    renv.set[PLAN_ID_VARIABLE] = parent.identity()  # the hook's proof that this process is bound (startup.py)
    if detected is not None and PLAN_VARIABLE not in environ:
        # Under srun/mpirun nobody sets torch's env:// variables (torchrun does): derive the missing ones.
        from launcher.context.local_rank import torch_distributed_env

        for name, value in torch_distributed_env(environ, detected).items():
            renv.set.setdefault(name, value)
    return parent, rank, renv


def main(argv: Sequence[str]) -> int:
    before, command = _split_command(argv)
    args = parse_args(before)
    if args.command:
        build_parser().error(f"unexpected argument {short(args.command[0])}: put the command after --")
    if not command and not args.dry_run:
        build_parser().error("no command: use affrun exec [OPTIONS] -- CMD [ARGS...]")
    environ = os.environ
    from launcher.context.inherited_mask import read_collapse

    collapse = read_collapse(environ, lambda: _local_ranks(args, environ))
    if collapse is not None:
        print(f"affrun: warning: {collapse.message()}. Fix: {collapse.fix()}", file=sys.stderr)
    parent, rank, renv = prepare(args, environ)
    verbose = args.verbose or parent.verbose
    env = renv.apply_to(environ)
    env.pop(PLAN_VARIABLE, None)
    host = os.uname().nodename  # gethostname() without importing socket on the per-rank path
    if args.dry_run:
        print(rank_line(rank, len(parent.plan.ranks), mem_text(parent.mem_policy, rank.mem_nodes), host))
        for name in sorted(renv.set):
            print(f"{name}={renv.set[name]}")
        for name in renv.unset:
            print(f"unset {name}")
        for note in (*renv.notes, *rank.warnings):
            print(f"note: {note}")
        if command:
            import shlex

            print("exec " + shlex.join(command))
        return 0
    mem = bind_process(rank.cpus, parent.mem_policy, rank.mem_nodes, parent.mem_backend)
    env[MEM_VARIABLE] = mem_text(mem.policy, mem.nodes)
    for warning in mem.warnings:
        print(f"affrun: warning: rank {rank.local_rank}: {warning}", file=sys.stderr)
    if verbose:
        print(rank_line(rank, len(parent.plan.ranks), mem_text(mem.policy, mem.nodes), host), file=sys.stderr)
        for note in renv.notes:
            print(f"affrun: note: rank {rank.local_rank}: {note}", file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    if mem.wrapper and _missing(command[0]):
        # Through numactl a missing command would exit 1 with numactl's message; keep the shell's 127.
        print(error_line(LaunchError(f"{command[0]}: command not found")), file=sys.stderr)
        return 127
    return exec_or_status([*mem.wrapper, *command], env)


def _missing(command: str) -> bool:
    import shutil  # only with a numactl wrapper: shutil costs the exec path about 3 ms

    return shutil.which(command) is None
