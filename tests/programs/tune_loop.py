"""A training loop for ``affrun tune``'s tests, fed by a DataLoader whose items wait ``--io-ms`` (a loader-bound
loop: more workers feed it faster), with ``num_workers`` hard-coded as a script does (``--workers``).

``--workers ask``: ask affrun (``launcher.torch.loader_workers()``).
``--seconds T``: stop after T s and print the loop's own batches/s after its first second (one JSON line).
``--record DIR``: write this rank's argv (hex bytes) and the pids of the rank and its workers into DIR.
``--fail``: raise ValueError at once (``--fail-padding N``: its message N bytes longer); ``--fail-with-workers N``: exit 3 when affrun asks for N workers; ``--no-loader``:
run ``--seconds`` without any DataLoader.
"""

import argparse
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Waits(Dataset):
    def __init__(self, io_s: float, record: str | None) -> None:
        self.io_s, self.record, self.pid = io_s, record, 0

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.record and self.pid != os.getpid():  # once in each process that loads (every worker)
            self.pid = os.getpid()
            with open(os.path.join(self.record, f"pid-{os.getpid()}"), "w") as fh:
                fh.write("worker")
        time.sleep(self.io_s)
        return torch.full((8,), float(i % 5))


def main() -> None:
    p = argparse.ArgumentParser(add_help=False)  # the tests pass -h through to it
    p.add_argument("--io-ms", type=float, default=5.0)
    p.add_argument("--workers", default="0")
    p.add_argument("--seconds", type=float, default=0.0)
    p.add_argument("--record")
    p.add_argument("--fail", action="store_true")
    p.add_argument("--fail-padding", type=int, default=0)
    p.add_argument("--fail-with-workers")
    p.add_argument("--no-loader", action="store_true")
    args, _ = p.parse_known_args()
    if args.record:
        with open(os.path.join(args.record, f"pid-{os.getpid()}"), "w") as fh:
            fh.write("rank")
        with open(os.path.join(args.record, "argv"), "w") as fh:
            json.dump([os.fsencode(a).hex() for a in sys.argv[1:]], fh)
    if args.fail:
        # a script's own error: tune names it, not torchrun's summary nor its frames, however long the message
        raise ValueError("failing on purpose" + " padding" * (args.fail_padding // 8))
    if args.fail_with_workers is not None and os.environ.get("AFFRUN_LOADER_WORKERS") == args.fail_with_workers:
        print("feed_loop: RuntimeError: failing with these workers on purpose", file=sys.stderr)
        sys.exit(3)
    if args.no_loader:
        time.sleep(args.seconds or 3600)
        return
    if args.workers == "ask":
        from launcher.torch import loader_workers

        workers = loader_workers()
    else:
        workers = int(args.workers)
    loader = DataLoader(Waits(args.io_ms / 1000, args.record), batch_size=None, num_workers=workers)
    a = torch.ones(16, 16)
    start = time.perf_counter()
    counted_from, counted = start + 1.0, 0
    for batch in loader:
        a = torch.tanh(a @ a * 1e-3 + batch[0])
        now = time.perf_counter()
        counted += now >= counted_from
        if args.seconds and now - start >= args.seconds:
            break
    if args.seconds:
        line = json.dumps({"batches_per_s": counted / (time.perf_counter() - counted_from), "workers": workers})
        os.write(1, (line + "\n").encode())  # one write: ranks share the pipe


if __name__ == "__main__":
    main()
