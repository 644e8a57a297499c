"""A small DDP training loop fed by DataLoader workers, to run under ``affrun torchrun``.

    affrun torchrun --nproc-per-node 2 examples/train_ddp.py --steps 20

Each rank logs the binding affrun gave it (CPUs, GPU, OpenMP threads) and its workers' CPUs. Runs on CPU (gloo)
when there is no GPU, on the rank's GPU (nccl) when there is one.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import launcher.torch


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("AFFRUN_GPU") or local_rank)) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    print(f"rank {dist.get_rank()}: cpus {os.environ.get('AFFRUN_CPUS', '?')} loader {os.environ.get('AFFRUN_LOADER_CPUS') or '-'} "
          f"gpu {os.environ.get('AFFRUN_GPU') or '-'} omp {torch.get_num_threads()}", flush=True)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2)).to(device)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(Noise(), batch_size=64, num_workers=args.workers,
                        worker_init_fn=launcher.torch.worker_init_fn, persistent_workers=args.workers > 0)
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
    print(f"rank {dist.get_rank()}: {args.steps} steps, {rate:.1f} steps/s, loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
