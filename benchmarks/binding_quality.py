"""Binding quality: 2 ranks, each running an OpenMP-threaded torch matmul loop for a fixed time.

Configurations (all measured in the same run, on this machine):
  a) affrun torchrun                       (each rank on its own cores, OMP_NUM_THREADS = its cores)
  b) torchrun                              (torchrun's default: OMP_NUM_THREADS=1, no binding)
  c) torchrun, OMP_NUM_THREADS=<all cores> (the common "fix" for torchrun's warning: oversubscribed, unbound)
  d) torchrun, libiomp5 with KMP_AFFINITY=disabled (LD_PRELOAD of the intel-openmp wheel's libiomp5)

Reports the summed iterations per second of the ranks (median over --repeats runs) and the ratio to (a).

A second table: 1 rank on every CPU, a training-like loop whose batches come from 2 busy DataLoader workers
(bench_loader_rank.py: each item costs a worker --item-ms of CPU, each step runs --matmuls matmuls on the rank's
OpenMP threads), under the three ways of binding the threads:
  rank        --omp-bind rank: one place, every thread on the whole rank
  core (new)  --omp-bind core: the first place the whole rank (the main thread's), the others one core each
  core (old)  one place per core, OMP_PLACES={0},{1},... (affrun's former --omp-bind core, kept here with
              --env-policy keep): the main thread pinned to the first core, and the forked workers with it
and, with --loader-cores 1, the new places (the main thread's the whole rank) against the former ones (the
compute CPUs only, so forked workers never reached the loader core). Reports steps per second (median) and the CPUs the workers could use.
Usage: python benchmarks/binding_quality.py [--seconds S] [--repeats N] [--item-ms MS] [--matmuls K] [--loader-only]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from _common import AFFRUN, PY, byte_compile_affrun, clean_env

HERE = os.path.dirname(os.path.abspath(__file__))


Configs = dict[str, tuple[list[str], dict[str, str]]]


def run_reports(argv: list[str], env: dict[str, str]) -> list[dict[str, Any]]:
    """The JSON lines the ranks of one run printed."""
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def measure(configs: Configs, repeats: int,
            seen: Callable[[str, list[dict[str, Any]]], None] = lambda name, reports: None) -> dict[str, list[float]]:
    """Summed it/s of every configuration, ``repeats`` times, interleaved; ``seen`` gets each run's reports."""
    results: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(repeats):
        for name, (argv, env) in configs.items():
            reports = run_reports(argv, env)
            results[name].append(sum(r["it_per_s"] for r in reports))
            seen(name, reports)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--item-ms", type=float, default=2.0, help="CPU work per DataLoader item (ms)")
    parser.add_argument("--matmuls", type=int, default=10, help="matmuls per training step")
    parser.add_argument("--loader-only", action="store_true", help="measure only the DataLoader table")
    args = parser.parse_args()
    byte_compile_affrun()
    if args.loader_only:
        loader_table(args)
        return
    ncpu = len(os.sched_getaffinity(0))
    script = [os.path.join(HERE, "bench_rank.py"), str(args.seconds)]
    nproc = ["--nproc-per-node", str(args.nproc)]
    iomp = os.path.join(sys.prefix, "lib", "libiomp5.so")
    configs: Configs = {
        "a) affrun torchrun": ([*AFFRUN, "torchrun", *nproc, *script], clean_env()),
        "b) torchrun (OMP_NUM_THREADS=1 default)": ([PY, "-m", "torch.distributed.run", *nproc, *script], clean_env()),
        f"c) torchrun, OMP_NUM_THREADS={ncpu} unbound": (
            [PY, "-m", "torch.distributed.run", *nproc, *script], clean_env(OMP_NUM_THREADS=str(ncpu))),
    }
    if os.path.exists(iomp):
        configs["d) torchrun, libiomp5 KMP_AFFINITY=disabled"] = (
            [PY, "-m", "torch.distributed.run", *nproc, *script],
            clean_env(LD_PRELOAD=iomp, KMP_AFFINITY="disabled", OMP_NUM_THREADS=str(ncpu)),
        )
    print(f"{args.nproc} ranks x torch 256x256 matmul loop, {args.seconds:g} s each, {ncpu} CPUs, "
          f"median of {args.repeats}")
    print_table(measure(configs, args.repeats), "a) affrun torchrun", ("configuration", "it/s (sum)", "vs affrun"))
    loader_table(args)


def print_table(results: dict[str, list[float]], base_name: str, header: tuple[str, str, str],
                extra: dict[str, str] | None = None) -> None:
    """Median, ratio to ``base_name``'s median, an optional extra column, and every run."""
    base = statistics.median(results[base_name])
    width = max(len(name) for name in results) + 2
    print(f"{header[0]:<{width}} {header[1]:>10} {header[2]:>10}   " + ("workers on   " if extra else "") + "runs")
    for name, values in results.items():
        med = statistics.median(values)
        runs = ", ".join(f"{v:.1f}" for v in values)
        column = f"{extra[name]:<12} " if extra else ""
        print(f"{name:<{width}} {med:10.1f} {med / base:9.2f}x   {column}{runs}")


def old_core_places(compute_only: bool = False) -> str:
    """affrun's former values: ``--omp-bind core``'s one place per core of this process's CPUs, or
    (``compute_only``) ``--loader-cores 1``'s one place of the compute CPUs (every core but the last)."""
    sys.path.insert(0, os.path.dirname(HERE))
    from launcher.topology import load_topology

    cores = load_topology(gpus=False).allowed_cores()
    if compute_only:
        return "{" + ",".join(str(p) for core in cores[:-1] for p in core.pus) + "}"
    return ",".join("{" + ",".join(map(str, core.pus)) + "}" for core in cores)


def loader_table(args: argparse.Namespace) -> None:
    script = [os.path.join(HERE, "bench_loader_rank.py"), str(args.seconds), "2", str(args.item_ms),
              str(args.matmuls)]
    one = [*AFFRUN, "torchrun", "--nproc-per-node", "1"]
    configs: Configs = {
        "rank": ([*one, "--omp-bind", "rank", *script], clean_env()),
        "core (new: first place the whole rank)": ([*one, "--omp-bind", "core", *script], clean_env()),
        "core (old: one place per core)": ([*one, "--omp-bind", "core", "--env-policy", "keep", *script],
                                           clean_env(OMP_PLACES=old_core_places())),
        "rank --loader-cores 1 (new)": ([*one, "--loader-cores", "1", *script], clean_env()),
        "rank --loader-cores 1 (old: compute CPUs only)": (
            [*one, "--loader-cores", "1", "--env-policy", "keep", *script],
            clean_env(OMP_PLACES=old_core_places(compute_only=True))),
    }
    workers: dict[str, str] = {}

    def seen(name: str, reports: list[dict[str, Any]]) -> None:
        workers[name] = " ".join(",".join(map(str, w)) for r in reports for w in r["workers"])

    results = measure(configs, args.repeats, seen)
    print(f"\n1 rank, 2 DataLoader workers ({args.item_ms:g} ms of CPU per item) beside {args.matmuls} matmuls "
          f"per step, {args.seconds:g} s, median of {args.repeats}")
    print_table(results, "rank", ("binding", "steps/s", "vs rank"), workers)


if __name__ == "__main__":
    main()
