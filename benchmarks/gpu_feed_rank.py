"""One rank of the GPU-feed benchmark: a synthetic image pipeline feeding a small conv net through a DataLoader.

The pipeline's CPU cost per sample is that of a real one: a decode-like step on uint8 data (zlib inflate of a
stored "file", then JPEG's YCbCr -> RGB colour conversion in numpy), an antialiased bilinear resize, a random crop,
a random horizontal flip, normalisation to float32, and the DataLoader's collate. The DataLoader runs ``--workers``
worker processes with ``pin_memory`` (when there is a device to pin for).

The device step:
  * on CUDA: a real training step of the conv net (copy, forward, backward, SGD); CUDA events around each step
    give the time the GPU sat idle between steps, waiting for the next batch;
  * without a GPU: a simulated asynchronous device whose every step takes ``--step-ms`` (calibrated by the
    launcher); the host sleeps while it waits for the device, so it releases the CPU as it would waiting on a GPU.
    The device is idle whenever the next batch is late, which is where a starved feed shows.

After a warm-up the rank prints ``{"phase": "ready"}``; with ``--go-file`` it goes on training until that file
exists (the launcher creates it once every rank is ready, so that the ranks measure the same window), then it
measures for ``--seconds`` and prints one JSON line: samples per second, the fraction of the time the device
waited, and what it ran with.
``--calibrate`` instead times the pipeline alone on this process's CPU and prints the seconds one batch costs.
The ready line carries ``startup``: the seconds since the process started at which torch was imported, the device
step was built, the DataLoader's workers started, and the warm-up ended (where a launch's time goes).
``--ceiling`` runs the same device step with one batch already on the device and no DataLoader (the limit of the
GPU, or of the simulated device), then, with ``--calibrate N``, also times the pipeline and adds ``batch_s``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

SOURCE = (240, 320)  # stored image (H, W), as a mid-size photo
RESIZE = 160  # Resize(160): the shorter side, antialiased
CROP = 128  # RandomCrop(128)
FILES = 16  # distinct stored images; the dataset is virtually endless
GO_TIMEOUT = 300.0  # seconds to wait for the other ranks' warm-up
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def make_files(count: int = FILES) -> list[bytes]:
    """Compressed YCbCr planes: smooth gradients plus noise (which keeps them from compressing to almost nothing)."""
    rng = np.random.default_rng(0)
    h, w = SOURCE
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    files = []
    for i in range(count):
        planes = [(128 + 60 * np.sin(xx / (17 + i + c) + yy / (23 + c)) + rng.normal(0, 12, (h, w))) for c in range(3)]
        data = np.clip(np.stack(planes), 0, 255).astype(np.uint8)
        files.append(zlib.compress(data.tobytes(), 1))  # level 1: quick to make (inflating is about as fast at any level)
    return files


def decode(blob: bytes) -> np.ndarray:
    """Inflate, then convert YCbCr to RGB as a JPEG decoder does (ITU-R BT.601, full range)."""
    h, w = SOURCE
    ycc = np.frombuffer(zlib.decompress(blob), dtype=np.uint8).reshape(3, h, w).astype(np.float32)
    y, cb, cr = ycc[0], ycc[1] - 128.0, ycc[2] - 128.0
    rgb = np.stack((y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb))
    out: np.ndarray = np.clip(rgb, 0, 255).astype(np.uint8)  # (3, H, W) uint8, as a decoded image
    return out


class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, length: int = 10_000_000) -> None:
        self.files = make_files()
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        rng = np.random.default_rng(index)
        image = torch.from_numpy(decode(self.files[index % len(self.files)]))
        h, w = image.shape[1:]
        scale = RESIZE / min(h, w)
        size = (round(h * scale), round(w * scale))
        resized = F.interpolate(image.unsqueeze(0).float(), size=size, mode="bilinear", antialias=True,
                                align_corners=False)[0]
        top = int(rng.integers(0, size[0] - CROP + 1))
        left = int(rng.integers(0, size[1] - CROP + 1))
        crop = resized[:, top:top + CROP, left:left + CROP]
        if rng.random() < 0.5:
            crop = crop.flip(2)
        out = (crop.clamp(0, 255) / 255.0 - MEAN) / STD
        return out.contiguous(), index % 1000


def make_model() -> torch.nn.Module:
    """A small ResNet-like stem and four strided conv blocks, then a 1000-way classifier."""
    layers: list[torch.nn.Module] = []
    channels = [3, 32, 64, 128, 256]
    for cin, cout in itertools.pairwise(channels):
        layers += [torch.nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), torch.nn.BatchNorm2d(cout),
                   torch.nn.ReLU(inplace=True), torch.nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                   torch.nn.BatchNorm2d(cout), torch.nn.ReLU(inplace=True)]
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(channels[-1], 1000)]
    return torch.nn.Sequential(*layers)


def mixup(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MixUp of the batch with itself reversed, on the CPU in the rank's process: torch's intra-op (OpenMP) threads
    run it, as they run any host-side batch work. Labels stay hard (the loss does not need soft ones here)."""
    lam = 0.8
    flipped = images.flip(0)
    images.mul_(lam).add_(flipped, alpha=1.0 - lam)
    return images, labels


def calibrate(batch_size: int, batches: int) -> float:
    """Seconds of one CPU for the pipeline to produce one batch (collate included), the median of ``batches``.

    CPU time, not wall time: on a shared machine the wall time also counts other processes' turns on the CPU.
    """
    torch.set_num_threads(1)  # as in a DataLoader worker
    ds = SyntheticImages()
    from torch.utils.data import default_collate

    default_collate([ds[i] for i in range(batch_size)])  # warm-up
    times = []
    for b in range(batches):
        t0 = time.process_time()
        default_collate([ds[b * batch_size + i] for i in range(batch_size)])
        times.append(time.process_time() - t0)
    return sorted(times)[len(times) // 2]


class CpuDevice:
    """A simulated asynchronous device: each step occupies it for ``step_s``, and the host runs ahead by one step.

    Like a GPU's stream, the device starts a step as soon as it is free and the host has handed the batch over;
    the host then sleeps (releasing the CPU, as it would blocking on a CUDA stream) until that step starts, so it
    prepares the next batch while the device computes. The device is idle from the end of a step until the host
    hands over the next one: the gaps summed are the time it waited for data, as the CUDA events measure them.
    """

    name = "cpu"

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.start()

    def start(self) -> None:
        """Start the measured window (a step still running from the warm-up counts as busy)."""
        self.t0 = time.perf_counter()
        self.free_at = max(getattr(self, "free_at", 0.0), self.t0)
        self.idle = 0.0

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        now = time.perf_counter()
        self.idle += max(0.0, now - self.free_at)
        begins = max(now, self.free_at)
        self.free_at = begins + self.step_s
        time.sleep(max(0.0, begins - time.perf_counter()))

    def wait_fraction(self, elapsed: float) -> float:
        """Wait for the last step to end (as torch.cuda.synchronize does); the idle share of the whole time."""
        time.sleep(max(0.0, self.free_at - time.perf_counter()))
        total = self.free_at - self.t0
        return max(0.0, min(1.0, self.idle / total)) if total > 0 else 0.0


class CudaDevice:
    """A real training step on the GPU; CUDA events before the copy and after the optimizer step of each batch.

    The GPU is idle from one step's end event to the next step's start event: when the host is ahead, the next
    start is already queued and the gap is near zero; when the host waits for data, the gap is that wait.
    """

    def __init__(self, local_rank: int, model_steps: int = 1) -> None:
        index = local_rank % torch.cuda.device_count()
        self.device = torch.device("cuda", index)
        torch.cuda.set_device(self.device)
        torch.backends.cudnn.benchmark = True
        self.name = f"cuda ({torch.cuda.get_device_name(index)})"
        self.model = make_model().to(self.device)
        self.model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # documented, not in the stubs
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.model_steps = model_steps  # training steps per batch: a heavier model without a bigger net
        self.events: list[tuple[Any, Any]] = []

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if len(self.events) >= 2:
            self.events[-2][1].synchronize()  # the host runs at most one step ahead, as the simulated device does
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        x = images.to(self.device, non_blocking=True).to(memory_format=torch.channels_last)
        y = labels.to(self.device, non_blocking=True)
        for _ in range(self.model_steps):
            loss = F.cross_entropy(self.model(x), y)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            self.optimizer.step()
        end.record()
        self.events.append((start, end))

    def start(self) -> None:
        torch.cuda.synchronize()
        self.events = []

    def wait_fraction(self, elapsed: float) -> float:
        torch.cuda.synchronize()
        if len(self.events) < 2:
            return 0.0
        idle = sum(prev_end.elapsed_time(start) for (_, prev_end), (start, _) in itertools.pairwise(self.events))
        total = self.events[0][0].elapsed_time(self.events[-1][1])
        return max(0.0, min(1.0, idle / total)) if total > 0 else 0.0


def since_start() -> float | None:
    """Seconds since this process started (its start time in /proc/self/stat against /proc/uptime)."""
    try:
        with open("/proc/self/stat") as fh:
            start = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            up = float(fh.read().split()[0])
        return round(up - start / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError):
        return None


def emit(record: dict[str, Any]) -> None:
    # One write per line: ranks share the pipe, and print() under python -u writes the text and "\n" separately.
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def ceiling(args: argparse.Namespace) -> None:
    """The device's limit on this step: one collated batch, moved to the device once, stepped over and over for
    ``--seconds`` after the warm-up (no DataLoader, no MixUp: no host work between steps)."""
    from torch.utils.data import default_collate

    startup = {"imported_s": since_start()}
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device: CpuDevice | CudaDevice = CudaDevice(local_rank, args.model_steps) if cuda else CpuDevice(args.step_ms / 1000.0)
    startup["device_s"] = since_start()
    ds = SyntheticImages()
    images, labels = default_collate([ds[i] for i in range(args.batch_size)])
    if isinstance(device, CudaDevice):
        images = images.to(device.device).to(memory_format=torch.channels_last)
        labels = labels.to(device.device)
    t0 = time.perf_counter()
    warm = 0
    while warm < 2 or time.perf_counter() - t0 < args.warmup:
        device.step(images, labels)
        warm += 1
    emit({"phase": "ready", "rank": local_rank, "startup": {**startup, "ready_s": since_start()}})
    device.start()
    samples = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        device.step(images, labels)
        samples += args.batch_size
    fraction = device.wait_fraction(time.perf_counter() - t0)
    elapsed = time.perf_counter() - t0
    record: dict[str, Any] = {"rank": local_rank, "samples_per_s": samples / elapsed, "device_wait_fraction": fraction,
                              "device": device.name, "ceiling": True, "cuda": cuda, "batch_size": args.batch_size}
    if args.calibrate:
        record["batch_s"] = calibrate(args.batch_size, args.calibrate)
    emit(record)
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured time, after the warm-up")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up (at least 2 batches)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader num_workers")
    parser.add_argument("--step-ms", type=float, default=50.0, help="the device step without a GPU")
    parser.add_argument("--model-steps", type=int, default=1, help="on CUDA: training steps of the net per batch")
    parser.add_argument("--go-file", help="after the warm-up, train on until this file exists, then measure")
    parser.add_argument("--worker-init", action="store_true",
                        help="worker_init_fn=launcher.torch.worker_init_fn (each worker on CPUs of its own)")
    parser.add_argument("--calibrate", type=int, metavar="BATCHES", help="time the pipeline alone, print, exit")
    parser.add_argument("--ceiling", action="store_true",
                        help="the device step alone, one batch already on the device, no DataLoader")
    args = parser.parse_args()
    if args.ceiling:
        ceiling(args)
        return
    if args.calibrate:
        cuda = torch.cuda.is_available()
        emit({"batch_s": calibrate(args.batch_size, args.calibrate), "cuda": cuda,
              "device": f"cuda ({torch.cuda.get_device_name(0)})" if cuda else "cpu"})
        return
    startup = {"imported_s": since_start()}
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device: CpuDevice | CudaDevice = CudaDevice(local_rank, args.model_steps) if cuda else CpuDevice(args.step_ms / 1000.0)
    startup["device_s"] = since_start()
    init: Callable[[int], None] | None = None
    if args.worker_init:
        from launcher.torch import worker_init_fn

        init = worker_init_fn
    loader = DataLoader(SyntheticImages(), batch_size=args.batch_size, num_workers=args.workers, pin_memory=cuda,
                        drop_last=True, persistent_workers=args.workers > 0, worker_init_fn=init)
    batches = iter(loader)
    startup["loader_s"] = since_start()
    t0 = time.perf_counter()
    warm = 0
    while warm < 2 or time.perf_counter() - t0 < args.warmup:
        device.step(*mixup(*next(batches)))
        warm += 1
    emit({"phase": "ready", "rank": local_rank, "startup": {**startup, "ready_s": since_start()}})
    deadline = time.perf_counter() + GO_TIMEOUT
    while args.go_file and not os.path.exists(args.go_file) and time.perf_counter() < deadline:
        device.step(*mixup(*next(batches)))
    device.start()
    samples = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        device.step(*mixup(*next(batches)))
        samples += args.batch_size
    fraction = device.wait_fraction(time.perf_counter() - t0)  # synchronises a GPU first
    elapsed = time.perf_counter() - t0
    emit({"rank": local_rank, "samples_per_s": samples / elapsed, "device_wait_fraction": fraction,
          "device": device.name, "workers": args.workers, "threads": torch.get_num_threads(),
          "cpus": sorted(os.sched_getaffinity(0))})
    getattr(batches, "_shutdown_workers", lambda: None)()  # the workers end before the next launch starts
    os._exit(0)  # skip tearing torch down (about half a second of every launch, measuring nothing)


if __name__ == "__main__":
    main()
