"""The rank's GPU's busy share, for the meter: with NVML (``pynvml``, the ``nvml`` extra) a daemon thread samples
the rank's GPU :data:`RATE` times a second, per process where NVML gives it, else per device. The loop's thread
only starts it (at a write of the figures, once the rank's GPU is known) and reads one tuple. No NVML, no GPU: no
figure, quietly; a failure of NVML: no figure and one warning, never an exception in the loop, never a wait at
exit. Standard library only (``pynvml`` is imported in the thread). docs/tune.md ("How it works") has the rules.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

RATE = 4.0  # samples a second
PROCESS, DEVICE = "process", "device"
NO_GPU = ("none", "")  # the environment says this rank has no GPU
NOT_SUPPORTED, NOT_FOUND = 3, 6  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND (nvml.h)
Choice = tuple[str, str]  # ("pci", address), ("index", NVML index), ("uuid", prefix), NO_GPU


def pci_key(text: str) -> tuple[int, int, int, int] | None:
    """``0000:17:00.0`` (sysfs) and ``00000000:17:00.0`` (NVML) as one key: domain, bus, device, function."""
    parts = text.strip().lower().split(":")
    try:
        if len(parts) == 2:
            parts.insert(0, "0")
        device, function = parts[2].split(".")
        return int(parts[0], 16), int(parts[1], 16), int(device, 16), int(function, 16)
    except (ValueError, IndexError):
        return None


def environment_choice(environ: Mapping[str, str]) -> Choice | None:
    """The rank's GPU as its environment names it: ``AFFRUN_GPU_PCI``, else the visible GPU (``CUDA_VISIBLE_DEVICES``)
    its ``LOCAL_RANK`` (else 0) numbers; :data:`NO_GPU` where it is hidden (``""``, ``-1``), ``None`` where the
    environment does not say (then torch's current device, :func:`torch_choice`, once CUDA is initialised)."""
    pci = environ.get("AFFRUN_GPU_PCI", "").strip()
    if pci:
        return ("pci", pci)
    visible, local = environ.get("CUDA_VISIBLE_DEVICES"), environ.get("LOCAL_RANK", "").strip()
    if visible is None and not local:
        return None
    index = int(local) if local.isascii() and local.isdigit() else 0
    if visible is None:
        return ("index", str(index))
    entries = [e.strip() for e in visible.split(",")]
    if index >= len(entries):
        return None
    entry = entries[index]
    if entry.isascii() and entry.isdigit():
        return ("index", entry)
    return ("uuid", entry) if entry.startswith("GPU-") else NO_GPU  # "", -1, a MIG instance: no device figure


def torch_choice() -> Choice | None:
    """torch's current CUDA device by its PCI address, when the script has initialised CUDA (never initialises it,
    never imports torch). In the loop's thread: the current device is a thread's own."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return None
        p = cuda.get_device_properties(cuda.current_device())
        return ("pci", f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0")
    except Exception:  # an older torch without the PCI fields, a CUDA error: no figure
        return None


def _importable(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def find_handle(nvml: Any, choice: Choice) -> Any:
    """The NVML handle of ``choice`` (``None`` where NVML has no such GPU). NVML numbers GPUs in PCI order; a
    visible index is CUDA's, which is the same order under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``."""
    kind, value = choice
    count = nvml.nvmlDeviceGetCount()
    if kind == "index":
        return nvml.nvmlDeviceGetHandleByIndex(int(value)) if int(value) < count else None
    for i in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        if kind == "pci" and pci_key(_text(nvml.nvmlDeviceGetPciInfo(handle).busId)) == pci_key(value):
            return handle
        if kind == "uuid" and _text(nvml.nvmlDeviceGetUUID(handle)).startswith(value):
            return handle
    return None


class GpuBusy:
    """The sampler of one rank's GPU. :meth:`poll` (the loop's thread, at each write) starts it once the GPU is
    known; :meth:`figure` is the mean busy share so far and how it was measured, ``None`` before a sample or after
    a failure."""

    __slots__ = ("_choice", "_environ", "_say", "_stop", "_sums", "_thread", "source")

    def __init__(self, environ: Mapping[str, str], say: Callable[[str], None]) -> None:
        self._environ = environ
        self._say = say
        self._choice: Choice | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._sums: tuple[float, int] | None = None  # percent summed, samples
        self.source = ""  # PROCESS or DEVICE, of the latest sample

    def poll(self) -> None:
        if self._thread is not None or self._choice == NO_GPU:
            return
        choice = environment_choice(self._environ)
        if choice is None:
            choice = torch_choice()
            if choice is None:
                return  # asked again at the next write: the script may initialise CUDA later
        self._choice = choice
        if choice == NO_GPU or not _importable("pynvml"):  # no nvml extra: no thread (the verdict says so)
            self._choice = NO_GPU
            return
        self._thread = threading.Thread(target=self._run, args=(choice,), name="affrun-feed-gpu", daemon=True)
        self._thread.start()

    def figure(self) -> tuple[float, str] | None:
        sums = self._sums
        return None if not sums or not sums[1] else (min(sums[0] / sums[1] / 100, 1.0), self.source)

    def stop(self) -> None:
        self._stop.set()

    def _run(self, choice: Choice) -> None:
        try:
            import pynvml
        except Exception:  # no nvml extra: the verdict says "no GPU signal"
            return
        try:
            pynvml.nvmlInit()
            handle = find_handle(pynvml, choice)
        except Exception:  # no driver: no GPU here, or none NVML can see
            handle = None
        named = choice[0] != "index"  # a GPU named by its address or UUID, not a number that may mean none
        try:
            if handle is None:
                if named:
                    raise LookupError(f"NVML cannot reach the GPU {choice[1]}")
                return
            self._sample(pynvml, handle)
        except Exception as exc:
            self._sums = None
            self._say(f"affrun: warning: --feed-report: no GPU busy share for this rank (NVML: "
                      f"{type(exc).__name__}: {str(exc)[:120]})")

    def _sample(self, nvml: Any, handle: Any) -> None:
        """Per process: the share of each NVML sample period in which this process ran a kernel, once NVML lists
        this process on the GPU (a container whose PID namespace NVML does not share never is); a call that
        finds no sample of it is 0. Per device (NVML cannot tell processes apart: ``NOT_SUPPORTED``, MIG, some
        VMs): the share of the last period in which any kernel ran."""
        pid = os.getpid()
        per_process, known = True, False
        seen = int(time.time() * 1e6)  # NVML's timestamps: microseconds of the wall clock
        total, count = 0.0, 0
        while True:
            value: float | None = None
            if per_process and not known:
                try:
                    known = any(p.pid == pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle))
                except Exception:
                    per_process = False
            if per_process and known:
                try:
                    mine = []
                    for s in nvml.nvmlDeviceGetProcessUtilization(handle, seen):
                        seen = max(seen, int(s.timeStamp))
                        if s.pid == pid:
                            mine.append(float(s.smUtil))
                    value = sum(mine) / len(mine) if mine else 0.0
                except Exception as exc:
                    if getattr(exc, "value", None) == NOT_FOUND:
                        value = 0.0
                    else:
                        per_process = False
            if value is None:
                value = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                self.source = DEVICE
            else:
                self.source = PROCESS
            total, count = total + min(max(value, 0.0), 100.0), count + 1
            self._sums = (total, count)
            if self._stop.wait(1 / RATE):
                return
