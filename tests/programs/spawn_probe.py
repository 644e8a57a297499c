"""torch.multiprocessing.spawn with launcher.bind_rank: each rank records its threads' masks after a parallel
region run with 2 OpenMP threads (more threads than a rank's CPU on a small machine: they must stay inside).

argv[1]: "before" to run a parallel region before bind_rank too (threads that exist must be moved).
"""

import sys

import torch
import torch.multiprocessing as mp
from probe_record import record, thread_masks

import launcher


def work() -> None:
    x = torch.randn(256, 256)
    for _ in range(10):
        x = torch.tanh(x @ x)


def main(local_rank: int, nproc: int, before: bool) -> None:
    if before:
        torch.set_num_threads(2)
        work()
    report = launcher.bind_rank(local_rank, nproc, quiet=True)
    torch.set_num_threads(2)
    work()
    record("rank", local_rank=local_rank, plan_cpus=list(report.cpus), threads=thread_masks(),
           not_applied=list(report.not_applied))


if __name__ == "__main__":
    mp.spawn(main, args=(2, sys.argv[1:] == ["before"]), nprocs=2)
