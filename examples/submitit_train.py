"""Train a tiny model on every task of a submitit job, each task bound to its own cores by affrun.

    python examples/submitit_train.py                                    # Slurm if srun is there, else local
    python examples/submitit_train.py --cluster slurm --nodes 2 --tasks-per-node 2 --gpus-per-node 2
    python examples/submitit_train.py --cluster local --tasks-per-node 2 # no Slurm needed

Each task logs the binding it runs under (``launcher.submitit.current_binding()``) and returns one JSON-able
dict, which this script prints one per line: global rank, node, the kernel's CPU mask, the binding, the number
of threads torch really uses, and the final loss. Without torch, the script says so and each task trains a
plain-Python model instead. Logs go to ``--folder`` (default: ``~/.cache/affrun/submitit-example/JOB_ID``, out of
the working tree; on Slurm it must be on a filesystem the nodes share).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import time
from typing import Any

from launcher.submitit import AffinityExecutor, current_binding


def train(steps: int) -> dict[str, Any]:
    import submitit

    env = submitit.JobEnvironment()
    binding = current_binding()
    print(f"[rank {env.global_rank}] affrun binding: {binding}", flush=True)
    start = time.perf_counter()
    try:
        final_loss, threads = _train_torch(steps, seed=env.global_rank)
        trainer = "torch"
    except ImportError:
        print(f"[rank {env.global_rank}] torch is not installed: training a plain-Python model", flush=True)
        final_loss, threads = _train_plain(steps), None
        trainer = "plain python (no torch)"
    return {
        "rank": env.global_rank,
        "local_rank": env.local_rank,
        "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "mask": sorted(os.sched_getaffinity(0)),
        "binding": binding.as_dict() if binding else None,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "torch_threads": threads,
        "trainer": trainer,
        "loss": final_loss,
        "seconds": round(time.perf_counter() - start, 3),
    }


def _train_torch(steps: int, seed: int) -> tuple[float, int]:
    """A linear regression with torch; returns the final loss and the size of torch's intra-op thread pool."""
    import torch

    torch.manual_seed(seed)
    x = torch.randn(512, 64)
    y = x @ torch.randn(64, 1)
    model = torch.nn.Linear(64, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return float(loss), torch.get_num_threads()


def _train_plain(steps: int) -> float:
    """Without torch: least squares on y = 3x in plain Python."""
    w = 0.0
    for _ in range(steps):
        w -= 0.1 * sum(2 * (w * xi - 3 * xi) * xi for xi in (0.1, 0.5, 1.0)) / 3
    return (w - 3) ** 2


def _cache_dir() -> str:
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster", choices=("slurm", "local", "debug"), default=None, help="default: auto-detect")
    p.add_argument("--folder", default=os.path.join(_cache_dir(), "affrun", "submitit-example", "%j"),
                   help="submitit's log folder (default: %(default)s)")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--tasks-per-node", type=int, default=2)
    p.add_argument("--cpus-per-task", type=int, default=None)
    p.add_argument("--gpus-per-node", type=int, default=None)
    p.add_argument("--loader-cores", type=int, default=0, help="cores per task kept for DataLoader workers")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--timeout-min", type=int, default=5)
    args = p.parse_args()

    # AutoExecutor's arguments, plus affrun's options (here loader_cores and verbose).
    executor = AffinityExecutor(folder=args.folder, cluster=args.cluster, loader_cores=args.loader_cores, verbose=True)
    params: dict[str, Any] = {"nodes": args.nodes, "tasks_per_node": args.tasks_per_node,
                              "timeout_min": args.timeout_min, "name": "affrun-submitit-example"}
    if args.cpus_per_task is not None:
        params["cpus_per_task"] = args.cpus_per_task
    if args.gpus_per_node is not None:
        params["gpus_per_node"] = args.gpus_per_node
    executor.update_parameters(**params)
    if importlib.util.find_spec("torch") is None:
        print("torch is not installed: each task trains a plain-Python model instead (pip install torch)", flush=True)
    job = executor.submit(train, args.steps)
    print(f"submitted job {job.job_id} on {executor.cluster} ({args.nodes} node(s) x {args.tasks_per_node} task(s))",
          flush=True)
    print(f"logs: {job.paths.folder}", flush=True)
    for result in job.results():
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
