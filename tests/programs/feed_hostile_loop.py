"""Training loops the feed meter meets in the wild, each measuring its own data wait (as tests/programs/feed_loop.py
does) and printing one JSON line on stdout: batches, wait, span, the exceptions it caught, whether torch's iterator is
patched.

``--dataset iterable``: an IterableDataset. ``--loader wrap``: a DataLoader subclass whose ``__iter__`` wraps torch's;
``--loader own``: one whose ``__iter__`` returns an iterator of its own (torch's is never made). ``--generator``: the
loop iterates a generator over the loader. ``--raise-at N``: item N raises ValueError; the loop catches it and goes
on. ``--interrupt-at N``: after N batches the process sends itself SIGINT (``--exit-at N``: ``sys.exit(3)``,
``--term-at N``: SIGTERM); the figures are printed in a ``finally`` and the exception goes on. ``--threads 2``: two
threads iterate the loader. ``--fresh``: a new DataLoader for every one of ``--epochs``.
``--meta-path drop|front``: before torch is imported, the script keeps only the standard library's finders, or puts
a finder of its own in front of them. ``--by-path``: the DataLoader comes from torch's dataloader.py loaded by file
path. ``--hostile KIND --at N --path P``: after N batches, something else changes P (the ``--feed-json`` file, or its
directory): ``vanish`` removes the directory, ``huge`` makes the file 1 GiB (sparse), ``fifo`` puts a FIFO in its
place, ``symlink`` a symbolic link to ``--target``.
"""

import argparse
import json
import os
import resource
import signal
import sys
import threading
import time
from typing import Any

p = argparse.ArgumentParser()
p.add_argument("--items", type=int, default=40)
p.add_argument("--item-sleep", type=float, default=0.005)
p.add_argument("--step-sleep", type=float, default=0.005)
p.add_argument("--workers", type=int, default=0)
p.add_argument("--dataset", choices=["map", "iterable"], default="map")
p.add_argument("--loader", choices=["torch", "wrap", "own"], default="torch")
p.add_argument("--generator", action="store_true")
p.add_argument("--raise-at", type=int, default=-1)
p.add_argument("--interrupt-at", type=int, default=0)
p.add_argument("--exit-at", type=int, default=0)
p.add_argument("--term-at", type=int, default=0)
p.add_argument("--fresh", action="store_true")
p.add_argument("--threads", type=int, default=1)
p.add_argument("--meta-path", choices=["keep", "drop", "front"], default="keep")
p.add_argument("--by-path", action="store_true")
p.add_argument("--hostile", choices=["vanish", "huge", "fifo", "symlink"], default=None)
p.add_argument("--at", type=int, default=5)
p.add_argument("--path", default="")
p.add_argument("--target", default="")
p.add_argument("--epochs", type=int, default=1)
args = p.parse_args()

if args.meta_path != "keep":
    import importlib.machinery

    standard = [f for f in sys.meta_path if getattr(f, "__module__", "").startswith(("importlib", "_frozen"))]
    if args.meta_path == "drop":  # the script keeps the finders it knows: affrun's import hook is gone
        sys.meta_path[:] = standard
    else:  # a finder of the script's own in front (as typeguard's or beartype's import hooks do)
        class Front:
            @staticmethod
            def find_spec(name: str, path: Any = None, target: Any = None) -> Any:
                return importlib.machinery.PathFinder.find_spec(name, path, target) if name.startswith("torch") \
                    else None

        sys.meta_path.insert(0, Front)  # type: ignore[arg-type]

import torch.utils.data as tud  # noqa: E402
from torch.utils.data.dataloader import _BaseDataLoaderIter  # noqa: E402

DataLoader: Any = tud.DataLoader
if args.by_path:
    import importlib.util

    where = os.path.join(os.path.dirname(tud.__file__), "dataloader.py")
    spec = importlib.util.spec_from_file_location("copied_dataloader", where)
    assert spec is not None and spec.loader is not None
    copied = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copied)
    DataLoader = copied.DataLoader


def item(i: int) -> int:
    if i == args.raise_at:
        raise ValueError(f"bad item {i}")
    if args.item_sleep:
        time.sleep(args.item_sleep)
    return i


class Mapped(tud.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return args.items

    def __getitem__(self, i: int) -> int:
        return item(i)


class Streamed(tud.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        info = tud.get_worker_info()
        start, step = (info.id, info.num_workers) if info else (0, 1)
        return (item(i) for i in range(start, args.items, step))


class Wrapping(DataLoader):  # type: ignore[misc,valid-type]
    def __iter__(self) -> Any:
        for batch in super().__iter__():
            yield batch * 2


class Own(DataLoader):  # type: ignore[misc,valid-type]
    def __iter__(self) -> Any:
        return iter([self.collate_fn([item(i)]) for i in range(args.items)])


dataset = Streamed() if args.dataset == "iterable" else Mapped()
kind = {"torch": DataLoader, "wrap": Wrapping, "own": Own}[args.loader]
loader = kind(dataset, batch_size=1, num_workers=args.workers)
lock = threading.Lock()
own: dict[str, Any] = {"batches": 0, "wait": 0.0, "first": None, "last": 0.0, "caught": [], "threads": []}


def hostile() -> None:
    path = args.path
    if args.hostile == "vanish":
        import shutil

        shutil.rmtree(os.path.dirname(path))
        return
    if args.hostile == "huge":
        with open(path, "ab") as fh:
            fh.truncate(1 << 30)
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    if args.hostile == "fifo":
        os.mkfifo(path)
    else:
        os.symlink(args.target, path)


def batches() -> Any:
    yield from loader


def fresh() -> Any:
    global loader
    if args.fresh:
        loader = kind(dataset, batch_size=1, num_workers=args.workers)
    return batches() if args.generator else iter(loader)


def loop(name: str) -> None:
    mine = {"name": name, "batches": 0, "wait": 0.0}
    for _ in range(args.epochs):
        it = fresh()
        while True:
            t0 = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                break
            except ValueError as exc:
                own["caught"].append([type(exc).__name__, str(exc).splitlines()[0]])
                continue
            t1 = time.perf_counter()
            with lock:
                own["wait"] += t1 - t0
                own["batches"] += 1
                own["last"] = max(own["last"], t1)
                own["first"] = t0 if own["first"] is None else min(own["first"], t0)
                n = own["batches"]
            mine["batches"] += 1
            mine["wait"] += t1 - t0
            if args.hostile and n == args.at:
                hostile()
            if n == args.interrupt_at:
                os.kill(os.getpid(), signal.SIGINT)
            if n == args.exit_at:
                sys.exit(3)
            if n == args.term_at:
                os.kill(os.getpid(), signal.SIGTERM)
            if args.step_sleep:
                time.sleep(args.step_sleep)
    own["threads"].append(mine)


def report() -> None:
    seconds = own["last"] - own["first"] if own["first"] is not None else 0.0
    sys.stdout.flush()
    os.write(1, (json.dumps({
        "pid": os.getpid(), "batches": own["batches"], "wait": own["wait"], "seconds": seconds,
        "fraction": own["wait"] / seconds if seconds else 0.0, "caught": own["caught"], "threads": own["threads"],
        "num_workers": [loader.num_workers],
        "patched": hasattr(_BaseDataLoaderIter.__next__, "__wrapped__"),
        "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }) + "\n").encode())  # one write: ranks share the pipe


try:
    if args.threads == 1:
        loop("main")
    else:
        threads = [threading.Thread(target=loop, args=(f"t{i}",)) for i in range(args.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
finally:
    report()
