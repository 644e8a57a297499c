"""One rank of benchmarks/device_check.py: report what this rank really runs with, as one JSON line on stdout.

Under any launcher (``affrun torchrun``, plain ``torchrun --numa-binding``): the rank's mask, affrun's variables
(``AFFRUN_CPUS``, ``AFFRUN_GPU``, ``AFFRUN_GPU_PCI``...), the CUDA device it uses and that device's PCI address as
torch and NVML give it, the main thread's OpenMP place (``omp_capture_affinity``; the team's lines come from
``OMP_DISPLAY_AFFINITY`` on stderr), the masks of ``--workers`` DataLoader workers built with ``pin_memory=True``,
and every thread of the rank (name, allowed CPUs, CPUs seen). ``--nccl S``: first run all-reduces for S seconds in
one process group of the launcher's ranks (NCCL, made eagerly on the rank's GPU; ``--backend gloo`` on the CPU),
sampling where each thread ran meanwhile, and report each thread's CPU time over the loop and when it was born:
``before`` the group, in its ``init``, or during the ``loop``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset


def allowed_list(task: str = "self") -> str:
    with open(f"/proc/{task}/status") as fh:
        return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("Cpus_allowed_list")), "")


def last_cpu(tid: str) -> int | None:
    """Field 39 of /proc/self/task/TID/stat: the CPU the thread last ran on."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None


def cpu_ns(tid: str) -> int | None:
    """The thread's CPU time so far, in ns: the first field of /proc/self/task/TID/schedstat, else (a kernel
    without CONFIG_SCHED_INFO) utime + stime of its stat, in clock ticks."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/self/task/{tid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def threads(samples: dict[str, set[int]] | None = None) -> list[dict[str, Any]]:
    """Every thread of this process: name, allowed CPUs, and the CPUs it was seen on (``samples``, else now)."""
    out = []
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                name = fh.read().strip()
            allowed = allowed_list(f"self/task/{tid}")
        except OSError:
            continue  # it ended meanwhile
        seen = set((samples or {}).get(tid, set()))
        cpu = last_cpu(tid)
        if cpu is not None:
            seen.add(cpu)
        out.append({"tid": int(tid), "name": name, "allowed": allowed, "cpus_seen": sorted(seen)})
    return out


def sample_threads(samples: dict[str, set[int]]) -> None:
    for tid in os.listdir("/proc/self/task"):
        cpu = last_cpu(tid)
        if cpu is not None:
            samples.setdefault(tid, set()).add(cpu)


def omp_main_affinity() -> str | None:
    """The main thread's OpenMP place as libgomp reports it (None where torch's libgomp is not loaded)."""
    with open("/proc/self/maps") as fh:
        gomp = sorted({line.split()[-1] for line in fh if "libgomp" in line and ".so" in line.split()[-1]})
    if not gomp:
        return None
    buf = ctypes.create_string_buffer(256)
    ctypes.CDLL(gomp[0]).omp_capture_affinity(buf, 256, b"%A")
    return buf.value.decode()


def cuda_device() -> dict[str, Any]:
    """The device torch uses here (the rank's AFFRUN_GPU when affrun gave one) and its PCI address from torch and
    from NVML (by the device's UUID, which no visible-index mapping can confuse)."""
    if not torch.cuda.is_available():
        return {"cuda": False}
    gpu = os.environ.get("AFFRUN_GPU", "")
    if gpu.isdigit() and int(gpu) < torch.cuda.device_count():
        torch.cuda.set_device(int(gpu))
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    out: dict[str, Any] = {"cuda": True, "device": index, "name": props.name, "uuid": str(getattr(props, "uuid", ""))}
    parts = [getattr(props, f"pci_{p}_id", None) for p in ("domain", "bus", "device")]
    if all(isinstance(p, int) for p in parts):
        out["torch_pci"] = f"{parts[0]:04x}:{parts[1]:02x}:{parts[2]:02x}.0"
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            uuid = out["uuid"] if out["uuid"].startswith("GPU-") else f"GPU-{out['uuid']}"
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
            out["nvml_pci"] = bus.decode() if isinstance(bus, bytes) else str(bus)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # no nvidia-ml-py, no driver, an unknown UUID: say which
        out["nvml_error"] = f"{type(exc).__name__}: {exc}"
    return out


class Masks(Dataset[torch.Tensor]):
    """Each item: the worker's pid and mask, padded (a worker reports where it may run)."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.01)
        mask = sorted(os.sched_getaffinity(0))[:1022]
        return torch.tensor([os.getpid(), *mask, -1, *([-1] * (1022 - len(mask)))])


def worker_masks(workers: int, pin: bool) -> list[dict[str, Any]]:
    if workers <= 0:
        return []
    seen: dict[int, list[int]] = {}
    for batch in DataLoader(Masks(), num_workers=workers, batch_size=None, pin_memory=pin):
        values = batch.tolist()
        seen[values[0]] = values[1: values.index(-1, 1)]
    return [{"pid": pid, "mask": mask} for pid, mask in seen.items()]


def nccl_traffic(seconds: float, samples: dict[str, set[int]], backend: str = "nccl") -> dict[str, Any]:
    """All-reduce for ``seconds`` in the launcher's process group, sampling the threads every few rounds; each
    thread's CPU time over the loop (``cpu_ms``) and when it was born (``born``)."""
    import torch.distributed as dist

    before = set(os.listdir("/proc/self/task"))
    if backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=device)
        data = torch.ones(1 << 22, device=device)
    else:
        dist.init_process_group(backend)
        data = torch.ones(1 << 20)
    born_in_init = set(os.listdir("/proc/self/task")) - before
    start = {tid: cpu_ns(tid) for tid in os.listdir("/proc/self/task")}
    end = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < end:
        dist.all_reduce(data)
        if backend == "nccl":
            torch.cuda.synchronize()
        rounds += 1
        if rounds % 5 == 0:
            sample_threads(samples)
    sample_threads(samples)
    rows = threads(samples)  # before the group ends: NCCL's threads end with it
    for row in rows:
        tid = str(row["tid"])
        now, then = cpu_ns(tid), start.get(tid)
        row["cpu_ms"] = round(((now or 0) - (then or 0)) / 1e6, 2) if now is not None else None
        row["born"] = "before" if tid in before else "init" if tid in born_in_init else "loop"
    version = ""
    if backend == "nccl":
        found = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
        version = ".".join(map(str, found)) if isinstance(found, tuple) else str(found)
    out = {"rounds": rounds, "backend": backend, "seconds": seconds, "nccl_version": version, "threads": rows,
           "main_mask_after": sorted(os.sched_getaffinity(0))}
    dist.destroy_process_group()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (pin_memory=True)")
    parser.add_argument("--nccl", type=float, default=0.0, metavar="S", help="all-reduce over NCCL for S seconds")
    parser.add_argument("--backend", default="nccl", choices=("nccl", "gloo"), help="--nccl's backend")
    args = parser.parse_args()
    torch.ones(4_000_000).add_(1).sum()  # a parallel region: the OpenMP team starts and reports its places
    record: dict[str, Any] = {
        "local_rank": int(os.environ.get("LOCAL_RANK", "-1")),
        "pid": os.getpid(),
        "mask": sorted(os.sched_getaffinity(0)),
        "cpus_allowed_list": allowed_list(),
        "torch_threads": torch.get_num_threads(),
        "omp_main": omp_main_affinity(),
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("OMP_", "KMP_", "AFFRUN_", "NCCL_", "CUDA_VISIBLE")) and k != "AFFRUN_PLAN"},
    }
    record.update(cuda_device())
    if args.nccl > 0:
        record["nccl"] = nccl_traffic(args.nccl, {}, args.backend)
    record["workers"] = worker_masks(args.workers, pin=True)
    record["threads"] = threads()
    # One write per line: ranks share the pipe, and print() under python -u writes the text and "\n" separately.
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
