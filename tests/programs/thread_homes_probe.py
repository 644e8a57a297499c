"""A training-like script with real third-party pipelines, recording where every thread runs and how large every
pool is, in the rank and in each DataLoader worker, as one JSON file per process in ``--out``.

The dataset is ImageFolder-shaped (``root/class_k/image_i.jpg``, JPEGs generated with Pillow); each item is
decoded with Pillow and with OpenCV (``cv2.imdecode`` and ``cv2.resize``), gets numpy features through OpenBLAS
(a matrix product) and numexpr, and the collate function encodes the items' captions with a ``tokenizers`` BPE
tokenizer trained here on generated text. After each item a worker records itself (the last record stays): its
threads (``/proc/self/task``), each thread's ``sched_getaffinity``, ``threadpoolctl.threadpool_info()``,
``cv2.getNumThreads()``, ``numexpr.get_num_threads()``, ``torch.get_num_threads()`` and its pool variables. The
rank records the same after its loop, and the inter-op pool's size. It imports nothing of affrun: what it records
is what the rank's hooks did to an unmodified script (``--init affrun`` passes ``launcher.torch.worker_init_fn``).
OpenCV, numexpr, tokenizers and threadpoolctl are optional: a stage whose library does not import is left out.
"""

import argparse
import io
import json
import os
import random
import sys
import tempfile
import threading
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

try:
    import cv2
except ImportError:
    cv2 = None
try:
    import numexpr
except ImportError:
    numexpr = None
try:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
except ImportError:
    Tokenizer = None
try:
    from threadpoolctl import threadpool_info
except ImportError:
    threadpool_info = None

POOL_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS",
                  "NUMEXPR_NUM_THREADS", "OPENCV_FOR_THREADS_NUM", "RAYON_NUM_THREADS", "OMP_PLACES")
WORDS = ("cat", "dog", "bird", "tree", "house", "river", "stone", "cloud", "light", "night", "green", "blue")


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


def make_images(root: str, classes: int, per_class: int) -> list[tuple[str, int]]:
    """An ImageFolder tree of generated JPEGs: (path, class index) per image, classes in sorted order."""
    rng = np.random.default_rng(0)
    items = []
    for k in range(classes):
        folder = os.path.join(root, f"class_{k}")
        os.makedirs(folder)
        for i in range(per_class):
            path = os.path.join(folder, f"image_{i}.jpg")
            Image.fromarray(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)).save(path, quality=90)
            items.append((path, k))
    return items


def make_tokenizer() -> Any:
    if Tokenizer is None:
        return None
    rng = random.Random(0)
    text = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(400)]
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(text, trainers.BpeTrainer(vocab_size=80, special_tokens=["[UNK]"],
                                                            show_progress=False))
    return tokenizer


class ImageFolderLike(Dataset):  # type: ignore[type-arg]
    def __init__(self, items: list[tuple[str, int]], out: str) -> None:
        self.items, self.out = items, out
        self.weights = np.random.default_rng(1).standard_normal((384, 384)).astype(np.float32)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, str]:
        path, label = self.items[i]
        with open(path, "rb") as fh:
            data = fh.read()
        pil = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32)
        if cv2 is not None:
            decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
            small = cv2.resize(cv2.GaussianBlur(decoded, (5, 5), 0), (64, 48), interpolation=cv2.INTER_AREA)
        else:
            small = pil[::2, ::2][:48, :64]
        features = np.tile(pil.reshape(-1)[:384], (384, 1)) @ self.weights  # OpenBLAS: threaded at this size
        scaled = numexpr.evaluate("features * 0.5 + 1") if numexpr is not None else features * 0.5 + 1
        info = torch.utils.data.get_worker_info()
        if info is not None:
            record(self.out, "worker", worker=info.id, workers=info.num_workers)
        caption = " ".join(WORDS[(label + j) % len(WORDS)] for j in range(6))
        return torch.from_numpy(small.astype(np.float32)), torch.from_numpy(scaled[:4, :4].copy()), caption


class Collate:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, batch: list[tuple[torch.Tensor, torch.Tensor, str]]) -> tuple[torch.Tensor, list[list[int]]]:
        captions = [caption for _, _, caption in batch]
        if self.tokenizer is None:
            return torch.stack([image for image, _, _ in batch]), [[len(c)] for c in captions]
        encodings = self.tokenizer.encode_batch(captions)  # Rayon, in the worker
        return torch.stack([image for image, _, _ in batch]), [e.ids for e in encodings]


def raise_opencv(worker_id: int) -> None:
    """A worker_init_fn that raises its pools again (what a script written for a big machine does)."""
    cv2.setNumThreads(64)
    numexpr.set_num_threads(8)
    os.environ["RAYON_NUM_THREADS"] = "64"


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
    p.add_argument("--init", choices=("none", "affrun", "raise"), default="none")
    p.add_argument("--interop", type=int, default=0, help="the script calls torch.set_num_interop_threads(N)")
    args = p.parse_args()
    if args.interop:
        torch.set_num_interop_threads(args.interop)
    init = {"none": None, "raise": raise_opencv}.get(args.init)
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
