"""A training-like script: DataLoader workers report the CPUs they may run on, as one JSON line.

argv[1]: "init" to use launcher.torch.worker_init_fn, "plain" to use none. argv[2]: number of workers.
"""

import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import launcher.torch


class Report(Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.02)
        mask = sorted(os.sched_getaffinity(0))
        return torch.tensor([os.getpid(), *mask, -1] + [-1] * (64 - len(mask)))[:66]


torch.ones(1000).sum()  # the OpenMP runtime is loaded and (if asked to) has bound the main thread
workers = int(sys.argv[2])
init = launcher.torch.worker_init_fn if sys.argv[1] == "init" else None
masks: dict[int, list[int]] = {}
for t in DataLoader(Report(), num_workers=workers, batch_size=None, worker_init_fn=init):
    values = t.tolist()
    pid, rest = values[0], values[1:]
    masks[pid] = rest[: rest.index(-1)]
print(json.dumps({"main": sorted(os.sched_getaffinity(0)), "workers": list(masks.values()),
                  "rank_cpus": os.environ.get("AFFRUN_CPUS"), "loader_cpus": os.environ.get("AFFRUN_LOADER_CPUS")}))
