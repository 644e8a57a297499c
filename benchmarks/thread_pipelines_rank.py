"""One rank of benchmarks/thread_pipelines.py: for each of --pipelines in turn (tests/programs/data_pipelines.py),
a DataLoader with fresh workers, consumed as fast as it comes, as a GPU-bound loop consumes it. After a warm-up
every local rank waits for the others (a file barrier in --out), drains the batches its workers queued meanwhile,
then counts samples for --seconds: its own count, whoever launched it. Then each worker, told by a file, attaches
to its next batch what it runs with: its thread count (/proc/self/task), its CPUs, and its pools (OpenCV, numexpr,
threadpoolctl's BLAS and OpenMP runtimes, torch, RAYON_NUM_THREADS). Writes rank-LOCAL_RANK.json into --out.
Imports nothing of affrun, and runs no pipeline in the rank itself: each worker starts its pools.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "programs"))

import torch  # noqa: E402
from data_pipelines import Collate, ImageFolderLike, Item  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

# Each pipeline: the stages of an item, the caption's words, the batch size.
PIPELINES: dict[str, tuple[tuple[str, ...], int, int]] = {
    "image-pil": (("pil",), 6, 16),
    "image-opencv": (("opencv",), 6, 16),
    "tokenizer": ((), 256, 64),
    "numpy-blas": (("blas", "numexpr"), 6, 4),
}
# The pool variables as the rank got them from its launcher (a worker's own are what its pools report).
ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "OPENCV_FOR_THREADS_NUM", "RAYON_NUM_THREADS")


def cpulist(cpus: set[int]) -> str:
    out: list[str] = []
    for cpu in sorted(cpus):
        if out and out[-1].split("-")[-1] == str(cpu - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{cpu}"
        else:
            out.append(str(cpu))
    return ",".join(out)


def threads() -> dict[str, Any]:
    """This process's thread count (/proc), and its Python threads: the rest were started by native libraries."""
    python = [t.name for t in threading.enumerate()]
    return {"threads": len(os.listdir("/proc/self/task")), "python_threads": python}


def pools() -> dict[str, Any]:
    """The pools this process runs with, as the libraries it loaded report them (none loaded here)."""
    rayon = os.environ.get("RAYON_NUM_THREADS", "")
    out: dict[str, Any] = {"torch": torch.get_num_threads(), "RAYON_NUM_THREADS": rayon or None,
                           # the size Rayon builds its pool at: the variable, else the CPUs it may use
                           "rayon": int(rayon) if rayon.isdigit() and int(rayon) > 0 else len(os.sched_getaffinity(0))}
    if "cv2" in sys.modules:
        out["cv2"] = sys.modules["cv2"].getNumThreads()
    if "numexpr" in sys.modules:
        out["numexpr"] = sys.modules["numexpr"].get_num_threads()
    try:
        from threadpoolctl import threadpool_info

        for lib in threadpool_info():
            out[f"{lib['internal_api']}:{lib['prefix']}"] = lib["num_threads"]  # e.g. numpy's and OpenCV's OpenBLAS
    except Exception as exc:  # what it runs with is information: the benchmark goes on
        out["threadpoolctl"] = f"{type(exc).__name__}: {exc}"
    return out


class Cycled(Dataset):  # type: ignore[type-arg]
    def __init__(self, inner: ImageFolderLike, length: int) -> None:
        self.inner, self.length = inner, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Item:
        return self.inner[i % len(self.inner)]


class Reporting(Collate):
    """The pipeline's collate; once ``flag`` exists, the worker's report rides on each batch."""

    def __init__(self, tokenizer: Any, flag: str) -> None:
        super().__init__(tokenizer)
        self.flag = flag

    def __call__(self, batch: list[Item]) -> tuple[Any, ...]:  # type: ignore[override]
        images, ids = super().__call__(batch)
        info = torch.utils.data.get_worker_info()
        if info is None or not os.path.exists(self.flag):
            return images, ids, None
        report = {"worker": info.id, "pid": os.getpid(), "cpus": cpulist(os.sched_getaffinity(0)),
                  **threads(), "pools": pools()}
        return images, ids, json.dumps(report)


def barrier(prefix: str, rank: int, ranks: int, timeout: float = 120.0) -> None:
    """Wait until every local rank has written its ``PREFIX-RANK`` file."""
    open(f"{prefix}-{rank}", "w").close()
    deadline = time.monotonic() + timeout
    while sum(os.path.exists(f"{prefix}-{r}") for r in range(ranks)) < ranks:
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {rank}: the other ranks did not get ready within {timeout:g} s")
        time.sleep(0.005)


def measure(pipeline: str, items: list[tuple[str, int]], args: argparse.Namespace, rank: int, ranks: int) -> dict[str, Any]:
    """One pipeline's window in this rank: its samples per second, and what the rank and its workers ran with."""
    stages, words, batch_size = PIPELINES[pipeline]
    tokenizer = None
    if pipeline == "tokenizer":
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(args.tokenizer)  # loaded, not used: the workers start Rayon's pool
    flag = os.path.join(args.out, f"report-{pipeline}-{rank}")
    dataset = Cycled(ImageFolderLike(items, stages, size=(160, 120), caption_words=words), 1 << 30)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=args.workers,
                        collate_fn=Reporting(tokenizer, flag), prefetch_factor=2)
    batches = iter(loader)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < args.warmup:
        next(batches)
    barrier(os.path.join(args.out, f"ready-{pipeline}"), rank, ranks)
    for _ in range(2 * args.workers):  # what the workers queued while this rank waited
        next(batches)
    samples, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < args.seconds:
        samples += len(next(batches)[1])
    open(flag, "w").close()
    workers: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + 60
    while len(workers) < args.workers and time.monotonic() < deadline:
        report = next(batches)[2]
        if report is not None:
            worker = json.loads(report)
            workers[worker["worker"]] = worker
    result = {"samples": samples, "seconds": elapsed, "samples_per_s": samples / elapsed,
              "cpus": cpulist(os.sched_getaffinity(0)), **threads(),
              "pools": {**pools(), "interop": torch.get_num_interop_threads()},
              "env": {name: os.environ.get(name) for name in ENV}, "workers": [workers[k] for k in sorted(workers)]}
    del batches  # its workers exit before the next pipeline's start
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pipelines", required=True, help=f"comma-separated, of {', '.join(PIPELINES)}")
    p.add_argument("--images", required=True, help="the ImageFolder tree (class_k/image_i.jpg)")
    p.add_argument("--tokenizer", default="", help="a saved tokenizers JSON file (the tokenizer pipeline)")
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    rank, ranks = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    items = [(os.path.join(args.images, k, name), int(k.split("_")[1]))
             for k in sorted(os.listdir(args.images)) for name in sorted(os.listdir(os.path.join(args.images, k)))]
    result = {"rank": rank, "pid": os.getpid(),
              "pipelines": {name: measure(name, items, args, rank, ranks) for name in args.pipelines.split(",")}}
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main()
