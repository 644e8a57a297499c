"""The rank's GPU's busy share, for the meter: a daemon thread samples it through NVML, per process where NVML
gives it, else per device; never an exception in the loop, never a wait at exit (docs/tune.md, "How it works").
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from launcher.base import nvml
from launcher.base.pci import pci_address

RATE = 4.0  # samples a second
PROCESS, DEVICE = "process", "device"
NO_GPU = ("none", "")  # the environment says this rank has no GPU
Choice = tuple[str, str]  # ("pci", address), ("index", NVML index), ("uuid", prefix), NO_GPU


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


def find(found: list[nvml.Gpu], choice: Choice) -> nvml.Gpu | None:
    """The GPU ``choice`` names. A visible index is CUDA's, which is NVML's order under
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; a UUID may be a prefix, as ``CUDA_VISIBLE_DEVICES`` takes it."""
    kind, value = choice
    key = pci_address(value.strip())
    for g in found:
        if ((kind == "index" and g.index == int(value)) or (kind == "uuid" and g.uuid.startswith(value))
                or (kind == "pci" and key is not None and pci_address(g.pci) == key)):
            return g
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
        lib, _ = nvml.start()
        try:
            gpu = None if lib is None else find(nvml.gpus(lib), choice)
        except Exception:  # none NVML can see
            gpu = None
        try:
            if gpu is None:
                if choice[0] != "index":  # a GPU named by its address or UUID, not a number that may mean none
                    raise LookupError(f"NVML cannot reach the GPU {choice[1]}")
                return
            self._sample(lib, gpu.handle)
        except Exception as exc:
            self._sums = None
            self._say(f"affrun: warning: --feed-report: no GPU busy share for this rank (NVML: "
                      f"{type(exc).__name__}: {str(exc)[:120]})")

    def _sample(self, lib: Any, handle: Any) -> None:
        """Per process once NVML lists this process on the GPU (a period with samples but none of it is 0; a poll
        with no new sample counts nothing, as in ``doctor --pid``); before, per device, unless NVML lists other
        processes of this PID namespace there (then nothing: this one is not on it yet)."""
        pid, per_process, known, seen = os.getpid(), True, False, nvml.now()
        total, count = 0.0, 0
        while True:
            value: float | None = None
            fresh = True
            if per_process:
                try:
                    listed = set() if known else nvml.processes(lib, handle)
                    known = known or pid in listed
                    if known:
                        samples, seen = nvml.process_samples(lib, handle, seen)
                        mine = [sm for p, sm in samples if p == pid]
                        value, fresh = (sum(mine) / len(mine) if mine else 0.0), bool(samples)
                    else:  # other processes of this PID namespace on it, not this one: no figure yet
                        fresh = not any(os.path.exists(f"/proc/{p}") for p in listed)
                except Exception:
                    per_process = False
            if value is None:
                value, self.source = float(nvml.busy(lib, handle)), DEVICE
            else:
                self.source = PROCESS
            if fresh:
                total, count = total + min(max(value, 0.0), 100.0), count + 1
                self._sums = (total, count)
            if self._stop.wait(1 / RATE):
                return
