"""A training loop whose main thread is the one that wants a CPU: each step computes for ``STEP_MS`` ms (a
Python loop), then takes a batch from a DataLoader of ``WORKERS`` workers whose items cost next to nothing.

Prints ``READY <pid> <LOCAL_RANK>`` once its first batch arrived and a parallel region ran (one write: ranks
share the pipe), then loops for ``argv[1]`` seconds (default 600: the test kills it). ``CONTEXT``: the
DataLoader's multiprocessing start method.
"""

import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Cheap(Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, i: int) -> int:
        return i


def step(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


if __name__ == "__main__":
    a = torch.randn(128, 128)
    (a @ a).sum()  # a parallel region: libiomp5 and libomp bind the main thread here
    loader = DataLoader(Cheap(), batch_size=4, num_workers=int(os.environ.get("WORKERS", "2")),
                        multiprocessing_context=os.environ.get("CONTEXT") or None)
    batches = iter(loader)
    next(batches)
    os.write(1, f"READY {os.getpid()} {os.environ.get('LOCAL_RANK', '-')}\n".encode())
    ms = float(os.environ.get("STEP_MS", "5"))
    end = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 600)
    while time.monotonic() < end:
        step(ms)
        next(batches)
