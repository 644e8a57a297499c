"""Binding quality: 2 ranks, each running an OpenMP-threaded torch matmul loop for a fixed time.

Configurations (all measured in the same run, on this machine):
  a) affrun torchrun                       (each rank on its own cores, OMP_NUM_THREADS = its cores)
  b) torchrun                              (torchrun's default: OMP_NUM_THREADS=1, no binding)
  c) torchrun, OMP_NUM_THREADS=<all cores> (the common "fix" for torchrun's warning: oversubscribed, unbound)
  d) torchrun, libiomp5 with KMP_AFFINITY=disabled (LD_PRELOAD of the intel-openmp wheel's libiomp5)

Reports the summed iterations per second of the ranks (median over --repeats runs) and the ratio to (a).
Usage: python benchmarks/binding_quality.py [--seconds S] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from _common import AFFRUN, PY, byte_compile_affrun, clean_env

HERE = os.path.dirname(os.path.abspath(__file__))


def run_config(argv: list[str], env: dict[str, str]) -> float:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return sum(r["it_per_s"] for r in reports)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    byte_compile_affrun()
    ncpu = len(os.sched_getaffinity(0))
    script = [os.path.join(HERE, "bench_rank.py"), str(args.seconds)]
    nproc = ["--nproc-per-node", str(args.nproc)]
    iomp = os.path.join(sys.prefix, "lib", "libiomp5.so")
    configs: dict[str, tuple[list[str], dict[str, str]]] = {
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
    results: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(args.repeats):
        for name, (argv, env) in configs.items():
            results[name].append(run_config(argv, env))
    base = statistics.median(results["a) affrun torchrun"])
    print(f"{args.nproc} ranks x torch 256x256 matmul loop, {args.seconds:g} s each, {ncpu} CPUs, "
          f"median of {args.repeats}")
    print(f"{'configuration':<48} {'it/s (sum)':>12} {'vs affrun':>10}   runs")
    for name, values in results.items():
        med = statistics.median(values)
        runs = ", ".join(f"{v:.0f}" for v in values)
        print(f"{name:<48} {med:12.0f} {med / base:9.2f}x   {runs}")


if __name__ == "__main__":
    main()
