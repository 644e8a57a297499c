"""A training-like script with real third-party pipelines, recording where every thread runs and how large every
pool is, in the rank and in each DataLoader worker, as one JSON file per process in ``--out``.

The dataset (tests/programs/data_pipelines.py, every stage) is ImageFolder-shaped (generated JPEGs); each item is
decoded with Pillow and with OpenCV (``cv2.imdecode`` and ``cv2.resize``), gets numpy features through OpenBLAS
(a matrix product) and numexpr, and the collate function encodes the items' captions with a ``tokenizers`` BPE
tokenizer trained here on generated text. After each item a worker records itself (the last record stays): its
threads (``/proc/self/task``), each thread's ``sched_getaffinity``, ``threadpoolctl.threadpool_info()``,
``cv2.getNumThreads()``, ``numexpr.get_num_threads()``, ``torch.get_num_threads()``, the inter-op pool's size and
its pool variables, after a parallel operation of torch's (its OpenMP team then exists at the size it runs). The
rank records the same after its loop. It imports nothing of affrun: what it records is what the rank's hooks did
to an unmodified script (``--init affrun`` passes ``launcher.torch.worker_init_fn``; ``--init torch64`` one that
calls ``torch.set_num_threads(64)``).
OpenCV, numexpr, tokenizers and threadpoolctl are optional: a stage whose library does not import is left out.
"""

import argparse
import json
import os
import sys
import tempfile
import threading

import data_pipelines
import torch
from data_pipelines import Collate, cv2, make_images, make_tokenizer, numexpr
from torch.utils.data import DataLoader

try:
    from threadpoolctl import threadpool_info
except ImportError:
    threadpool_info = None

POOL_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS",
                  "NUMEXPR_NUM_THREADS", "OPENCV_FOR_THREADS_NUM", "RAYON_NUM_THREADS", "OMP_PLACES")


def threads() -> list[dict[str, object]]:
    out = []
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                name = fh.read().strip()
            out.append({"tid": int(tid), "name": name, "cpus": sorted(os.sched_getaffinity(int(tid)))})
        except OSError:
            continue
    return out


def record(out: str, kind: str, **extra: object) -> None:
    data = {"kind": kind, "pid": os.getpid(), "threads": threads(),
            "threadpool_info": threadpool_info() if threadpool_info else None,
            "cv2": cv2.getNumThreads() if cv2 else None, "numexpr": numexpr.get_num_threads() if numexpr else None,
            "torch": torch.get_num_threads(),
            "env": {k: os.environ.get(k) for k in POOL_VARIABLES},
            "affrun": {k: v for k, v in os.environ.items() if k.startswith("AFFRUN_")}, **extra}
    tmp = os.path.join(out, f".{kind}-{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, os.path.join(out, f"{kind}-{os.getpid()}.json"))


class ImageFolderLike(data_pipelines.ImageFolderLike):
    """Every stage of tests/programs/data_pipelines.py; a worker records itself after each item."""

    def __init__(self, items: list[tuple[str, int]], out: str) -> None:
        super().__init__(items)
        self.out = out

    def __getitem__(self, i: int) -> data_pipelines.Item:
        item = super().__getitem__(i)
        info = torch.utils.data.get_worker_info()
        if info is not None:
            torch.ones(1 << 20).sin_()  # a parallel region: the worker's OpenMP team runs at its size
            record(self.out, "worker", worker=info.id, workers=info.num_workers,
                   interop=torch.get_num_interop_threads())
        return item


def raise_opencv(worker_id: int) -> None:
    """A worker_init_fn that raises its pools again (what a script written for a big machine does)."""
    cv2.setNumThreads(64)
    numexpr.set_num_threads(8)
    os.environ["RAYON_NUM_THREADS"] = "64"


def raise_torch(worker_id: int) -> None:
    """A worker_init_fn that sizes torch's own count for a big machine."""
    torch.set_num_threads(64)


def pin_memory_thread_cpus() -> list[int]:
    """Where torch's pin-memory thread runs once started (there is no accelerator here, so the DataLoader starts
    none): its loop, run in a thread as the DataLoader runs it, with an input queue that records its caller."""
    from torch.utils.data._utils.pin_memory import _pin_memory_loop

    done, seen = threading.Event(), []

    class Spy:
        def get(self, timeout: float) -> None:
            seen.append(sorted(os.sched_getaffinity(0)))
            done.set()
            raise __import__("queue").Empty

    thread = threading.Thread(target=_pin_memory_loop, args=(Spy(), None, -1, done, "cpu"), daemon=True)
    thread.start()
    thread.join(30)
    return seen[0] if seen else []


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--context", default="fork")
    p.add_argument("--init", choices=("none", "affrun", "raise", "torch64"), default="none")
    p.add_argument("--interop", type=int, default=0, help="the script calls torch.set_num_interop_threads(N)")
    args = p.parse_args()
    if args.interop:
        torch.set_num_interop_threads(args.interop)
    init = {"none": None, "raise": raise_opencv, "torch64": raise_torch}.get(args.init)
    if args.init == "affrun":
        import launcher.torch

        init = launcher.torch.worker_init_fn
    with tempfile.TemporaryDirectory() as root:
        items = make_images(root, classes=3, per_class=4)
        tokenizer = make_tokenizer()
        if tokenizer is not None:
            tokenizer.encode_batch(["cat dog"] * 64)  # the rank uses Rayon too, before its workers fork
        dataset = ImageFolderLike(items, args.out)
        for i in range(len(dataset)):  # the rank runs the same pipeline: its pools start
            dataset[i]
        torch.ones(1 << 17).add_(1).sum()  # a parallel region: the OpenMP team starts
        loader = DataLoader(dataset, batch_size=3, num_workers=args.workers, collate_fn=Collate(tokenizer),
                            worker_init_fn=init, multiprocessing_context=args.context if args.workers else None)
        batches = sum(1 for _ in loader)
    record(args.out, "rank", batches=batches, interop=torch.get_num_interop_threads(),
           interop_patched=hasattr(torch.set_num_interop_threads, "__wrapped__"),
           worker_loop_patched=hasattr(torch.utils.data._utils.worker._worker_loop, "__wrapped__"),
           pin_memory=pin_memory_thread_cpus(), main_thread=sorted(os.sched_getaffinity(os.getpid())),
           affrun_modules=sorted(m for m in sys.modules if m.startswith("launcher")))


if __name__ == "__main__":
    main()
