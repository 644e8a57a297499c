"""``affrun exec [OPTIONS] -- CMD ARGS...``: bind one rank, then ``execvpe`` CMD (same PID, no wrapper).

This module is the hot path: it runs before every rank. It imports argparse, json and the pure core only
(no click, psutil, yaml, cpuinfo, submitit or torch).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from launcher.cpulist import format_cpulist
from launcher.env import ENV_POLICIES, EnvPolicy, RankEnvironment, effective_mem_policy, rank_environment
from launcher.errors import AffrunError, LaunchError
from launcher.localrank import LocalRank
from launcher.omp_syntax import BIND_MODES, OmpBind
from launcher.option_table import BINDING_OPTIONS, MEM_BACKENDS, MemBackend
from launcher.options import MEM_POLICIES, PlanOptions
from launcher.plan import Plan, RankPlan
from launcher.untrusted import BadJSON, load_json, short

if TYPE_CHECKING:
    from launcher.mempolicy import MemResult

PLAN_VARIABLE = "AFFRUN_PLAN"
# Above this size the plan travels in a file (AFFRUN_PLAN=@path): one environment string may not exceed
# 128 KiB (MAX_ARG_STRLEN), and every worker's execve would fail.
INLINE_PLAN_LIMIT = 32 * 1024
# The memory policies a plan carries: resolved, never "auto".
APPLIED_MEM_POLICIES = tuple(p for p in MEM_POLICIES if p != "auto")
# How children start `affrun exec`: not `python -m launcher`, which would import a `launcher.py` or `launcher/`
# from the user's working directory first. `-c` puts '' (the cwd) at sys.path[0]; drop it before importing.
BOOT = "import sys; del sys.path[0]; from launcher.main import main; main()"


def exec_prefix() -> list[str]:
    """The argv that starts ``affrun exec`` with this interpreter, safe from modules in the working directory."""
    return [sys.executable, "-c", BOOT, "exec"]


def mem_text(policy: str, nodes: Sequence[int]) -> str:
    """``membind:0,1`` or ``none``, as in the rank line."""
    return f"{policy}:{','.join(map(str, nodes))}" if policy != "none" and nodes else "none"


@dataclass(frozen=True)
class ParentPlan:
    """What ``affrun torchrun`` hands to every worker's ``affrun exec`` through ``AFFRUN_PLAN``."""

    plan: Plan
    bind: OmpBind
    env_policy: EnvPolicy
    mem_policy: str  # already resolved (no "auto")
    mem_backend: MemBackend
    user_env: dict[str, str]  # the user's own values of the variables affrun sets, before torchrun touched them
    verbose: bool

    def to_json(self) -> str:
        return json.dumps(
            {
                "plan": self.plan.to_dict(),
                "bind": self.bind,
                "env_policy": self.env_policy,
                "mem_policy": self.mem_policy,
                "mem_backend": self.mem_backend,
                "user_env": self.user_env,
                "verbose": self.verbose,
            },
            separators=(",", ":"),
        )

    def to_env(self, spill_dir: str) -> str:
        """The value of ``AFFRUN_PLAN``: the JSON itself, or ``@FILE`` (written in ``spill_dir``) when it is large."""
        text = self.to_json()
        if len(text) <= INLINE_PLAN_LIMIT:
            return text
        path = os.path.join(spill_dir, "affrun-plan.json")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        return "@" + path

    @classmethod
    def from_env(cls, value: str) -> ParentPlan:
        if value.startswith("@"):
            from launcher.topology._files import read_document

            data = read_document(value[1:], "the plan file affrun torchrun wrote", LaunchError)
            try:
                value = data.decode("utf-8")
            except UnicodeDecodeError:
                raise LaunchError(f"{PLAN_VARIABLE}: the plan file {value[1:]} is not UTF-8 text") from None
        return cls.from_json(value)

    @classmethod
    def from_json(cls, text: str) -> ParentPlan:
        """Parse and check ``AFFRUN_PLAN`` like any input: one :class:`LaunchError` line for anything wrong."""
        from launcher.plan_json import BadPlan, choice, plan_from_json, string_map

        try:
            d = load_json(text)
            if not isinstance(d, dict):
                raise BadPlan(f"expected an object, not {short(d, 40)}")
            verbose = d.get("verbose", False)
            if not isinstance(verbose, bool):
                raise BadPlan(f"verbose must be true or false, not {short(verbose, 40)}")
            return cls(
                plan_from_json(d.get("plan")),
                choice(d.get("bind"), "bind", BIND_MODES),
                choice(d.get("env_policy"), "env_policy", ENV_POLICIES),
                choice(d.get("mem_policy"), "mem_policy", APPLIED_MEM_POLICIES),
                choice(d.get("mem_backend"), "mem_backend", MEM_BACKENDS),
                string_map(d.get("user_env", {}), "user_env"),
                verbose,
            )
        except (BadJSON, BadPlan) as exc:
            raise LaunchError(f"{PLAN_VARIABLE} is not a plan written by affrun: {exc}") from None


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is below 0")
    return value


def add_binding_arguments(group: argparse._ActionsContainer, prefix: str = "") -> None:
    """The topology, planning, environment and memory options of ``exec`` and ``torchrun``, argparse side, from
    :data:`launcher.option_table.BINDING_OPTIONS` (click builds its options from the same table). Each value lands
    in ``prefix + dest``; the planning ones are named like :class:`~launcher.options.PlanOptions`'s fields (see
    :func:`plan_options_from`)."""
    for spec in BINDING_OPTIONS:
        kwargs: dict[str, Any] = {"dest": prefix + spec.dest, "help": spec.help}
        if spec.is_flag:
            kwargs["action"] = "store_true"
        else:
            kwargs.update(default=spec.default, metavar=spec.metavar)
            if spec.choices:
                kwargs["choices"] = spec.choices
            if spec.count:
                kwargs["type"] = _non_negative
        group.add_argument(spec.flag, **kwargs)


def plan_options_from(args: argparse.Namespace, prefix: str = "") -> PlanOptions:
    """The :class:`PlanOptions` that :func:`add_binding_arguments` parsed into ``args``."""
    return PlanOptions(**{f.name: getattr(args, prefix + f.name) for f in fields(PlanOptions)})


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="affrun exec",
        description="Bind this rank (local rank from LOCAL_RANK, SLURM_LOCALID, OMPI_..., MPI_..., PMI_...), "
        "set its OpenMP/BLAS environment and memory policy, then exec CMD in place.",
        usage="affrun exec [OPTIONS] -- CMD [ARGS...]",
    )
    p.add_argument("--local-rank", type=int, help="This process's local rank (default: from the launcher's variables).")
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc", type=int,
                   help="Local ranks on this node (default: from the launcher's variables).")
    add_binding_arguments(p)
    p.add_argument("-v", "--verbose", action="store_true", help="Print one line per rank on stderr.")
    p.add_argument("--dry-run", action="store_true", help="Print what would be applied and exit 0.")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return p


def rank_line(rank: RankPlan, size: int, mem: str, host: str) -> str:
    """The documented, parseable one-line summary of a rank (``--verbose``, ``affrun torchrun``)."""
    gpu = "-" if rank.gpu is None else f"{rank.gpu} ({rank.gpu_pci or '?'})"
    numa = ",".join(map(str, rank.numa_nodes)) or "-"
    loader = format_cpulist(rank.loader_cpus) or "-"
    return (f"affrun: rank {rank.local_rank}/{size} host {host} cpus {format_cpulist(rank.cpus)} numa {numa} "
            f"gpu {gpu} omp {rank.threads} loader {loader} mem {mem}")


def _split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = list(argv).index("--")
        return list(argv[:i]), list(argv[i + 1 :])
    return list(argv), []


def _parent_or_standalone(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> tuple[ParentPlan, RankPlan, LocalRank | None]:
    from launcher.localrank import LocalRankError, detect_local_rank

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

    from launcher.plan import make_plan
    from launcher.topology import load_topology

    opts = plan_options_from(args)
    nproc = args.nproc if args.nproc is not None else (detected.size if detected else None)
    rank = args.local_rank if args.local_rank is not None else (detected.rank if detected else None)
    if rank is None or nproc is None:
        if rank is None and nproc is None:
            rank, nproc = 0, opts.rank_count() or 1
        else:
            raise LaunchError("give both --local-rank and --nproc-per-node, or neither (then LOCAL_RANK, "
                              "SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or PMI_LOCAL_RANK)")
    if not 0 <= rank < nproc:
        raise LaunchError(f"local rank {rank} is outside 0..{nproc - 1}")
    topo = load_topology(fsroot=args.fsroot, topology_file=args.topology_file, cpus=args.cpus, environ=environ,
                         gpus=not opts.no_gpu)
    the_plan = make_plan(topo, opts.request(nproc))
    parent = ParentPlan(the_plan, args.omp_bind, args.env_policy, effective_mem_policy(args.mem_policy, len(topo.cpu_nodes())),
                        args.mem_backend, {}, args.verbose)
    return parent, the_plan.ranks[rank], detected


def _local_ranks(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """How many local ranks this rank has, as far as the flags and the launcher's variables say (1: unknown)."""
    if args.nproc is not None:
        return int(args.nproc)
    from launcher.localrank import LocalRankError, detect_local_rank

    try:
        detected = detect_local_rank(environ)
    except LocalRankError:
        return 1
    return detected.size if detected else 1


def prepare(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[ParentPlan, RankPlan, RankEnvironment]:
    parent, rank, detected = _parent_or_standalone(args, environ)
    # The policy judges what the *user* set: in a torchrun child, OMP_NUM_THREADS=1 came from torchrun, not the user.
    user_env = dict(environ)
    if parent.user_env or PLAN_VARIABLE in environ:
        user_env.pop("OMP_NUM_THREADS", None)
        user_env.update(parent.user_env)
    renv = rank_environment(rank, local_world_size=len(parent.plan.ranks), user_env=user_env, bind=parent.bind,
                            smt=parent.plan.smt, policy=parent.env_policy)
    if detected is not None and PLAN_VARIABLE not in environ:
        # Under srun/mpirun nobody sets torch's env:// variables (torchrun does): derive the missing ones.
        from launcher.localrank import torch_distributed_env

        for name, value in torch_distributed_env(environ, detected).items():
            renv.set.setdefault(name, value)
    return parent, rank, renv


def bind_process(cpus: Sequence[int], mem_policy: str, mem_nodes: tuple[int, ...], mem_backend: str) -> MemResult:
    """Set this process's CPU mask and memory policy (both survive ``execve`` and are inherited by children)."""
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        raise LaunchError(f"cannot bind to CPUs {format_cpulist(cpus)}: {exc.strerror} "
                          f"(allowed here: {format_cpulist(os.sched_getaffinity(0))})") from None
    from launcher.mempolicy import apply_mempolicy

    return apply_mempolicy(mem_policy, mem_nodes, mem_backend)


def main(argv: Sequence[str]) -> int:
    before, command = _split_command(argv)
    parser = build_parser()
    args = parser.parse_args(before)
    if args.command:
        parser.error(f"unexpected argument {args.command[0]!r}: put the command after --")
    if not command and not args.dry_run:
        parser.error("no command: use affrun exec [OPTIONS] -- CMD [ARGS...]")
    environ = os.environ
    from launcher.inherited_mask import read_collapse

    collapse = read_collapse(environ, lambda: _local_ranks(args, environ))
    if collapse is not None:
        print(f"affrun: warning: {collapse.message()}. Fix: {collapse.fix()}", file=sys.stderr)
    try:
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
                print("exec " + shlex.join(command))
            return 0
        mem = bind_process(rank.cpus, parent.mem_policy, rank.mem_nodes, parent.mem_backend)
        for warning in mem.warnings:
            print(f"affrun: warning: rank {rank.local_rank}: {warning}", file=sys.stderr)
        if verbose:
            print(rank_line(rank, len(parent.plan.ranks), mem_text(mem.policy, mem.nodes), host), file=sys.stderr)
            for note in renv.notes:
                print(f"affrun: note: rank {rank.local_rank}: {note}", file=sys.stderr)
        sys.stderr.flush()
        sys.stdout.flush()
        if mem.wrapper and shutil.which(command[0]) is None:
            # Through numactl a missing command would exit 1 with numactl's message; keep the shell's 127.
            print(f"affrun: error: {command[0]}: command not found", file=sys.stderr)
            return 127
        return exec_or_status([*mem.wrapper, *command], env)
    except AffrunError as exc:
        print(f"affrun: error: {exc}", file=sys.stderr)
        return exc.exit_code


def exec_or_status(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """``execvpe`` ``argv`` in place; when that fails, one ``affrun: error:`` line and the shell's status
    (127: not found, 126: not executable)."""
    try:
        os.execvpe(argv[0], list(argv), env)
    except FileNotFoundError:
        print(f"affrun: error: {argv[0]}: command not found", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"affrun: error: {argv[0]}: permission denied", file=sys.stderr)
        return 126
    except OSError as exc:
        print(f"affrun: error: {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 126
    return 0  # pragma: no cover - execvpe does not return
