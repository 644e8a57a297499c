"""A stand-in of a training loop for ``affrun tune`` (benchmarks/tune_feed.py): loader-bound or compute-bound.

``--kind loader``: each item waits ``--io-ms`` (storage latency) and costs ``--cpu-ms`` of CPU (decoding); a step
is one small matmul. ``--kind compute``: items are free; a step is ``--matmuls`` 256x256 matmuls on the rank's
OpenMP threads. The DataLoader's workers are what affrun says (``launcher.torch.loader_workers()``) under affrun,
else ``--plain-workers`` (the number a script hard-codes; 2).
With ``--seconds T`` the loop stops after T seconds and prints its own count: one JSON line, batches per second
after its first second (the independent measurement beside the meter's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Items(Dataset[torch.Tensor]):
    def __init__(self, io_ms: float, cpu_ms: float) -> None:
        self.io_s, self.cpu_s = io_ms / 1000, cpu_ms / 1000

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.io_s:
            time.sleep(self.io_s)
        end = time.thread_time() + self.cpu_s
        x = 0
        while time.thread_time() < end:
            x += 1
        return torch.full((64,), float(i % 7))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", choices=("loader", "compute"), required=True)
    p.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: run until stopped)")
    p.add_argument("--io-ms", type=float, default=4.0)
    p.add_argument("--cpu-ms", type=float, default=0.5)
    p.add_argument("--matmuls", type=int, default=6)
    p.add_argument("--plain-workers", type=int, default=2)
    args = p.parse_args()
    loader_bound = args.kind == "loader"
    dataset = Items(args.io_ms, args.cpu_ms) if loader_bound else Items(0.0, 0.0)
    if "AFFRUN_PLAN" in os.environ:  # under affrun: ask it (each trial of affrun tune tries its own count)
        from launcher.torch import loader_workers

        workers = loader_workers()
    else:
        workers = args.plain_workers
    loader = DataLoader(dataset, batch_size=None, num_workers=workers)
    a = torch.randn(64 if loader_bound else 256, 64 if loader_bound else 256)
    steps = 0
    start = time.perf_counter()
    counted_from, counted = start + 1.0, 0
    for batch in loader:
        for _ in range(1 if loader_bound else args.matmuls):
            a = torch.tanh(torch.mm(a, a) * 1e-3 + batch[0])
        steps += 1
        now = time.perf_counter()
        if now >= counted_from:
            counted += 1
        if args.seconds and now - start >= args.seconds:
            break
    if args.seconds:
        span = time.perf_counter() - counted_from
        print(json.dumps({"batches_per_s": counted / span if span > 0 else 0.0, "workers": workers,
                          "threads": torch.get_num_threads()}), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
