"""One rank of the loader benchmark: a training-like loop whose batches come from busy DataLoader workers.

Each item costs its worker a fixed amount of pure-Python CPU work (decoding, augmentation); each step runs
torch 256x256 matmuls on the rank's OpenMP threads. Prints one JSON line: steps per second, threads, and the
CPUs of the main thread and of the workers. argv: seconds, workers, item work in ms, matmuls per step.
"""

import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Busy(Dataset):
    def __init__(self, work_ms: float) -> None:
        self.work_s = work_ms / 1000

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.thread_time() + self.work_s  # CPU time, not wall time: the work needs a CPU to get done
        x = 0
        while time.thread_time() < end:
            x += 1
        return torch.tensor([os.getpid(), *sorted(os.sched_getaffinity(0))])


if __name__ == "__main__":
    seconds, workers = float(sys.argv[1]), int(sys.argv[2])
    work_ms, matmuls = float(sys.argv[3]), int(sys.argv[4])
    a = torch.randn(256, 256)
    for _ in range(20):  # warm-up: the OpenMP team exists and is bound before the workers start
        torch.mm(a, a)
    loader = DataLoader(Busy(work_ms), num_workers=workers, batch_size=None, prefetch_factor=2)
    worker_cpus: dict[int, list[int]] = {}
    steps = 0
    t0 = time.perf_counter()
    for item in loader:
        values = item.tolist()
        worker_cpus[values[0]] = values[1:]
        for _ in range(matmuls):
            torch.mm(a, a)
        steps += 1
        if time.perf_counter() - t0 >= seconds:
            break
    elapsed = time.perf_counter() - t0
    sys.stdout.write(json.dumps({"rank": int(os.environ.get("LOCAL_RANK", "0")), "it_per_s": steps / elapsed,
                                 "threads": torch.get_num_threads(), "main": sorted(os.sched_getaffinity(0)),
                                 "workers": sorted(worker_cpus.values())}) + "\n")
    sys.stdout.flush()
