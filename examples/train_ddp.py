"""A small DDP training loop fed by DataLoader workers, to run under ``affrun torchrun``.

    affrun torchrun --nproc-per-node 2 examples/train_ddp.py --steps 20

Each rank logs the binding affrun gave it (CPUs, GPU, OpenMP threads), and each DataLoader worker the CPUs it
runs on. The number of workers comes from the plan: one per loader CPU when the rank has some
(``AFFRUN_LOADER_CPUS``, ``--loader-cores``), none on a rank of one CPU (a worker there would only compete with
the training thread, and torch warns about it), else one per CPU beyond the first, at most 2. ``--workers N``
overrides it. Runs on CPU (gloo) when there is no GPU, on the rank's GPU (nccl) when there is one.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.nn  # before init_process_group: see the end of main()
from torch.utils.data import DataLoader, Dataset

import launcher.torch
from launcher.base.cpulist import format_cpulist


class Noise(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Synthetic samples with a little CPU work per item (like decoding), so the workers matter."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(64, generator=g)
        for _ in range(20):
            x = torch.tanh(x * 1.01)
        return x, (x.sum() > 0).long()


def say(text: str, flush: bool = True) -> None:
    """One line in one write: the ranks share stdout, and print() writes the text and its newline apart, so two
    ranks' lines could interleave ("workers 0rank 1: ...")."""
    sys.stdout.write(text + "\n")
    if flush:
        sys.stdout.flush()


def cpu_count(cpulist: str) -> int:
    """How many CPUs a cpulist names (``0-3,8`` is 5), as affrun writes them in ``AFFRUN_*_CPUS``."""
    count = 0
    for part in filter(None, cpulist.split(",")):
        first, _, last = part.partition("-")
        count += int(last or first) - int(first) + 1
    return count


def planned_workers() -> int:
    """DataLoader workers for this rank, from affrun's plan (or the CPUs this process may use, outside affrun)."""
    loader = cpu_count(os.environ.get("AFFRUN_LOADER_CPUS", ""))
    if loader:
        return loader
    cpus = cpu_count(os.environ.get("AFFRUN_CPUS", "")) or len(os.sched_getaffinity(0))
    return min(2, cpus - 1)


def report_worker(rank: int, worker_id: int) -> None:
    """Each worker says where it runs (after launcher.torch.worker_init_fn has placed it)."""
    say(f"rank {rank} worker {worker_id}: cpus {format_cpulist(os.sched_getaffinity(0))}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: from the plan)")
    args = parser.parse_args()
    workers = planned_workers() if args.workers is None else args.workers
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("AFFRUN_GPU") or local_rank)) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    # the real mask and thread count, whoever launched it: compare `torchrun` with `affrun torchrun`
    mask = format_cpulist(os.sched_getaffinity(0))
    say(f"rank {dist.get_rank()}: cpus {mask} OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')} "
          f"torch threads {torch.get_num_threads()} loader {os.environ.get('AFFRUN_LOADER_CPUS') or '-'} "
          f"gpu {os.environ.get('AFFRUN_GPU') or '-'} workers {workers}", flush=True)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2)).to(device)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    init = launcher.torch.chain_worker_init_fn(functools.partial(report_worker, dist.get_rank()))
    loader = DataLoader(Noise(), batch_size=64, num_workers=workers, worker_init_fn=init,
                        persistent_workers=workers > 0)
    t0 = time.perf_counter()
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step >= args.steps:
                break
    rate = args.steps / (time.perf_counter() - t0)
    say(f"rank {dist.get_rank()}: {args.steps} steps, {rate:.1f} steps/s, loss {loss.item():.3f}", flush=True)
    # Free the process group here, while Python runs, so that its gloo threads finish before the interpreter
    # exits: one still holding the last backward's allreduce would be killed there, and the rank aborts
    # ("terminate called without an active exception"; docs/design.md, torchrun). The DDP model holds the group,
    # and so would torch.distributed.nn's defaults had it been imported after init_process_group (DDP imports it).
    del model
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
