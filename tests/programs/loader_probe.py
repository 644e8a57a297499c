"""A training-like script: DataLoader workers report the CPUs they may run on, as one JSON line.

argv[1]: "init" to use launcher.torch.worker_init_fn, "plain" to use none. argv[2]: number of workers.
argv[3] (optional): the workers' start method (fork, forkserver, spawn; default: the DataLoader's own).
Before the workers start, the main thread runs a parallel region, as a training step would: libiomp5 and LLVM
libomp bind only then, and libgomp has bound at ``import torch`` already.
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


def allowed_list() -> str:
    with open("/proc/self/status") as status:
        return next(line.split(":", 1)[1].strip() for line in status if line.startswith("Cpus_allowed_list"))


if __name__ == "__main__":  # spawn and forkserver workers import this module
    torch.ones(4_000_000).add_(1).sum()  # a parallel region: every runtime has bound the main thread by now
    workers = int(sys.argv[2])
    init = launcher.torch.worker_init_fn if sys.argv[1] == "init" else None
    context = sys.argv[3] if len(sys.argv) > 3 else None
    masks: dict[int, list[int]] = {}
    for t in DataLoader(Report(), num_workers=workers, batch_size=None, worker_init_fn=init,
                        multiprocessing_context=context):
        values = t.tolist()
        pid, rest = values[0], values[1:]
        masks[pid] = rest[: rest.index(-1)]
    # One write per line: ranks share the pipe, and print() under python -u writes the text and "\n" separately.
    sys.stdout.write(json.dumps({
        "local_rank": int(os.environ.get("LOCAL_RANK", "-1")), "pid": os.getpid(), "main": sorted(os.sched_getaffinity(0)),
        "cpus_allowed_list": allowed_list(), "workers": list(masks.values()),
        "rank_cpus": os.environ.get("AFFRUN_CPUS"), "loader_cpus": os.environ.get("AFFRUN_LOADER_CPUS"),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "KMP_", "GOMP_", "LD_PRELOAD"))},
    }) + "\n")
    sys.stdout.flush()
