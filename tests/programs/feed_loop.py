"""A training loop whose data wait is known, measuring it itself, independently of affrun's meter.

Each item costs its loader ``--item-sleep`` seconds, each step ``--step-sleep`` seconds (sleeps: the fraction does
not depend on the machine's load). The loop times every ``next()`` itself (the one that ends an epoch excluded) and
prints one JSON line: its own batches, wait and span (first ``next()`` call to the latest batch), the DataLoaders'
worker counts, and whether torch's iterator is patched. ``--hang-after N``: after N batches, print the line and
sleep until killed. ``--abandon N``: leave the first epoch's iterator after N batches. ``--step-spin S``: each step
also computes S seconds of CPU time (a thread that needs a CPU). ``--seconds S``: epochs until the loop has run S
seconds (then the epoch in progress is left).
"""

import argparse
import json
import os
import sys
import time
from typing import Any

from torch.utils.data import DataLoader, Dataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

p = argparse.ArgumentParser()
p.add_argument("--items", type=int, default=24)
p.add_argument("--batch", type=int, default=2)
p.add_argument("--item-sleep", type=float, default=0.005)
p.add_argument("--step-sleep", type=float, default=0.01)
p.add_argument("--step-spin", type=float, default=0.0)
p.add_argument("--seconds", type=float, default=0.0)
p.add_argument("--workers", type=int, default=0)
p.add_argument("--context", default=None)
p.add_argument("--persistent", action="store_true")
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--loaders", type=int, default=1)
p.add_argument("--abandon", type=int, default=0)
p.add_argument("--hang-after", type=int, default=0)
p.add_argument("--ask", action="store_true", help="num_workers from launcher.torch.loader_workers()")


class Sleepy(Dataset):  # type: ignore[type-arg]
    def __init__(self, items: int, seconds: float) -> None:
        self.items, self.seconds = items, seconds

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, i: int) -> int:
        if self.seconds:
            time.sleep(self.seconds)
        return i


def main() -> None:
    args = p.parse_args()
    workers = args.workers
    if args.ask:
        import launcher.torch

        workers = launcher.torch.loader_workers()
    loaders = [DataLoader(Sleepy(args.items, args.item_sleep), batch_size=args.batch, num_workers=workers, multiprocessing_context=args.context,
                          persistent_workers=args.persistent) for _ in range(args.loaders)]
    own: dict[str, Any] = {"batches": 0, "wait": 0.0, "first": None, "last": 0.0}

    def report() -> None:
        seconds = own["last"] - own["first"] if own["first"] is not None else 0.0
        sys.stdout.flush()
        os.write(1, (json.dumps({
            "pid": os.getpid(), "rank": int(os.environ.get("RANK", "0")), "batches": own["batches"], "wait": own["wait"], "seconds": seconds,
            "fraction": own["wait"] / seconds if seconds else 0.0, "num_workers": [dl.num_workers for dl in loaders],
            "patched": _BaseDataLoaderIter.__next__.__module__ != "torch.utils.data.dataloader"
            or hasattr(_BaseDataLoaderIter.__next__, "__wrapped__"),
            "affrun_modules": sorted(m for m in sys.modules if m.startswith(("launcher", "_affrun_feed"))),
        }) + "\n").encode())  # one write: ranks share the pipe


    epochs = range(args.epochs) if not args.seconds else iter(int, 1)  # --seconds: until the time is up
    for epoch in epochs:
        if args.seconds and own["first"] is not None and own["last"] - own["first"] >= args.seconds:
            break
        for dl in loaders:
            it = iter(dl)
            n = 0
            while True:
                t0 = time.perf_counter()
                try:
                    next(it)
                except StopIteration:
                    break
                t1 = time.perf_counter()
                own["wait"] += t1 - t0
                own["batches"] += 1
                own["last"] = t1
                if own["first"] is None:
                    own["first"] = t0
                n += 1
                if args.hang_after and own["batches"] == args.hang_after:
                    report()
                    while True:
                        time.sleep(60)
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                if args.step_spin:
                    until = time.thread_time() + args.step_spin
                    while time.thread_time() < until:
                        pass
                if epoch == 0 and args.abandon and n == args.abandon:
                    break  # the iterator is left mid-epoch
                if args.seconds and t1 - own["first"] >= args.seconds:
                    break
            del it
    report()


if __name__ == "__main__":
    main()
