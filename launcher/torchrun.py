"""``affrun torchrun``: torchrun with every local rank started through ``affrun exec``.

torchrun's own parser reads the arguments (affrun's options are added to it), the plan is computed once,
and torchrun then runs in this process, unchanged, with each worker command rewritten to
``python -m launcher exec -- <the original worker command>``. The plan reaches the workers as JSON in
``AFFRUN_PLAN``. Exit status, signal forwarding and logs are torchrun's own.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from launcher.env import BIND_MODES, POLICIES, THREAD_VARIABLES, effective_mem_policy
from launcher.errors import AffrunError, ConfigError
from launcher.exec_cmd import MEM_BACKENDS, PLAN_VARIABLE, ParentPlan, rank_line
from launcher.options import MEM_POLICIES, PlanOptions
from launcher.plan import GPU_ORDERS, MODES

DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torchrun's own default for --signals-to-handle
# The variables whose user-set values the env policy must judge (torchrun overwrites OMP_NUM_THREADS).
USER_VARIABLES = (*THREAD_VARIABLES, "OMP_PLACES", "OMP_PROC_BIND", "KMP_AFFINITY", "GOMP_CPU_AFFINITY")


def add_affrun_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("affrun", "CPU binding options (see affrun plan --help)")
    group.add_argument("--fsroot", dest="affrun_fsroot", help="Read sys/ and proc/ under DIR.")
    group.add_argument("--topology", dest="affrun_topology", help="Saved topology (JSON snapshot or hwloc XML).")
    group.add_argument("--cpus", dest="affrun_cpus", help="Restrict the allowed CPUs (cpulist).")
    group.add_argument("--mode", dest="affrun_mode", choices=MODES, default="exclusive")
    group.add_argument("--smt", dest="affrun_smt", action="store_true")
    group.add_argument("--reserve", dest="affrun_reserve")
    group.add_argument("--loader-cores", dest="affrun_loader_cores", type=int, default=0)
    group.add_argument("--gpu-order", dest="affrun_gpu_order", choices=GPU_ORDERS, default="rank")
    group.add_argument("--map", dest="affrun_map")
    group.add_argument("--gpus", dest="affrun_gpus")
    group.add_argument("--no-gpu", dest="affrun_no_gpu", action="store_true")
    group.add_argument("--omp-bind", dest="affrun_omp_bind", choices=BIND_MODES, default="rank")
    group.add_argument("--env-policy", dest="affrun_env_policy", choices=POLICIES, default="safe")
    group.add_argument("--mem-policy", dest="affrun_mem_policy", choices=MEM_POLICIES, default="auto")
    group.add_argument("--mem-backend", dest="affrun_mem_backend", choices=MEM_BACKENDS, default="auto")
    group.add_argument("--affrun-verbose", dest="affrun_verbose", action="store_true",
                       help="Each rank also prints its line and env notes from inside the worker.")
    group.add_argument("--affrun-dry-run", dest="affrun_dry_run", action="store_true",
                       help="Print the plan and the rewritten worker command, start nothing.")


def parse(argv: Sequence[str]) -> argparse.Namespace:
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = "affrun torchrun"
    add_affrun_options(parser)
    return parser.parse_args(list(argv))


def worker_command(args: argparse.Namespace) -> list[str]:
    """The command torchrun would start for each worker (before affrun's rewrite)."""
    if args.no_python:
        if args.module:
            raise ConfigError("don't use both --no-python and --module (torchrun refuses it too)")
        return [args.training_script]
    cmd = [os.getenv("PYTHON_EXEC", sys.executable), "-u"]
    if args.module:
        cmd.append("-m")
    return [*cmd, args.training_script]


def rewrite_for_exec(args: argparse.Namespace) -> list[str]:
    """Make torchrun start ``python -m launcher exec -- <worker command> <script args>``; return that argv."""
    original = worker_command(args)
    args.no_python = True
    args.module = False
    args.training_script = sys.executable
    args.training_script_args = ["-m", "launcher", "exec", "--", *original, *args.training_script_args]
    return [args.training_script, *args.training_script_args]


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    if getattr(args, "numa_binding", None):
        raise ConfigError("--numa-binding is torchrun's own CPU binding and would fight affrun's: use one of them "
                          "(drop --numa-binding, or run plain torchrun)")
    if getattr(args, "run_path", False):
        raise ConfigError("--run-path runs the script inside torchrun's agent, where affrun cannot bind it: "
                          "drop --run-path")
    from torch.distributed.run import determine_local_world_size

    try:
        nproc = determine_local_world_size(args.nproc_per_node)
    except ValueError as exc:
        raise ConfigError(f"--nproc-per-node {args.nproc_per_node}: {exc}") from None
    from launcher.plan import make_plan
    from launcher.topology import load_topology

    opts = PlanOptions(mode=args.affrun_mode, smt=args.affrun_smt, reserve=args.affrun_reserve,
                       loader_cores=args.affrun_loader_cores, gpu_order=args.affrun_gpu_order,
                       cpu_map=args.affrun_map, gpus=args.affrun_gpus, no_gpu=args.affrun_no_gpu)
    topo = load_topology(fsroot=args.affrun_fsroot, topology_file=args.affrun_topology, cpus=args.affrun_cpus)
    plan = make_plan(topo, opts.request(nproc))
    nodes_with_cpus = sum(1 for n in topo.numa_nodes if n.cpus & topo.allowed)
    mem = effective_mem_policy(args.affrun_mem_policy, nodes_with_cpus)
    user_env = {k: os.environ[k] for k in USER_VARIABLES if k in os.environ}
    parent = ParentPlan(plan, args.affrun_omp_bind, args.affrun_env_policy, mem, args.affrun_mem_backend, user_env,
                        args.affrun_verbose)
    import socket

    host = socket.gethostname()
    for rank in plan.ranks:
        mem_text = f"{mem}:{','.join(map(str, rank.mem_nodes))}" if mem != "none" and rank.mem_nodes else "none"
        print(rank_line(rank, nproc, mem_text, host), file=sys.stderr)
    for warning in plan.warnings:
        print(f"affrun: warning: {warning}", file=sys.stderr)
    if args.signals_to_handle == DEFAULT_SIGNALS and "PET_SIGNALS_TO_HANDLE" not in os.environ:
        # Slurm warns jobs with SIGUSR1/SIGUSR2 before their time limit (sbatch --signal): forward those too.
        args.signals_to_handle = DEFAULT_SIGNALS + ",SIGUSR1,SIGUSR2"
    worker = rewrite_for_exec(args)
    if args.affrun_dry_run:
        print("worker: " + " ".join(worker))
        return 0
    os.environ[PLAN_VARIABLE] = parent.to_json()
    # torchrun would set OMP_NUM_THREADS=1 (and warn) when it is unset; each worker's affrun exec replaces it
    # with that rank's own value anyway, so give torchrun the first rank's value to keep its warning away.
    os.environ.setdefault("OMP_NUM_THREADS", str(plan.ranks[0].threads))
    sys.stderr.flush()
    from torch.distributed.elastic.multiprocessing.errors import record
    from torch.distributed.run import run

    record(run)(args)
    return 0


def run_cli(argv: Sequence[str]) -> Any:
    try:
        return main(argv)
    except AffrunError as exc:
        print(f"affrun: error: {exc}", file=sys.stderr)
        return exc.exit_code
