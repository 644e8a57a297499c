"""NVML through nvidia-ml-py's ``pynvml``: the one reader for ``affrun topology --nvml``, ``doctor --pid`` and a
rank's meter. :func:`start` gives NVML or why not; :func:`stop` never raises; the other calls raise NVML's errors.
Standard library only."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

NOT_SUPPORTED, NOT_FOUND = 3, 6  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND (nvml.h)


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML's index: PCI bus order, never a CUDA visible index
    pci: str  # as NVML writes it, lower case (00000000:17:00.0): compare spellings with base.pci.pci_address
    uuid: str
    name: str = ""
    handle: Any = None  # NVML's, while it is initialised


class Unsupported(Exception):
    """NVML gives no per-process samples of this GPU; the text says why."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def start() -> tuple[Any, str]:
    """``pynvml`` initialised and ``""``, or ``None`` and why not (not installed, no driver, no library)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except ImportError:
        return None, "nvidia-ml-py is not installed: pip install nvidia-ml-py"
    except Exception as exc:  # pynvml's NVMLError subclasses
        return None, f"NVML: {exc}"
    return pynvml, ""


def stop(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:
        pass


def gpus(nvml: Any) -> list[Gpu]:
    """Every GPU NVML sees, in its order."""
    out = []
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        pci = _text(nvml.nvmlDeviceGetPciInfo(handle).busId).strip().lower()
        out.append(Gpu(i, pci, _text(nvml.nvmlDeviceGetUUID(handle)), _name(nvml, handle), handle))
    return out


def _name(nvml: Any, handle: Any) -> str:
    """The GPU's product name, ``""`` where NVML cannot say: it only labels the GPU in reports."""
    try:
        return _text(nvml.nvmlDeviceGetName(handle))
    except Exception:
        return ""


def driver(nvml: Any) -> str:
    return _text(nvml.nvmlSystemGetDriverVersion())


def busy(nvml: Any, handle: Any) -> int:
    """The share (percent) of NVML's last sample period in which a kernel of any process ran on the GPU."""
    return int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)


def memory_used_mib(nvml: Any, handle: Any) -> int:
    return int(nvml.nvmlDeviceGetMemoryInfo(handle).used) // (1 << 20)


def processes(nvml: Any, handle: Any) -> set[int]:
    """The pids NVML lists on the GPU (those with a compute context)."""
    return {int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}


def now() -> int:
    """The wall clock in microseconds: NVML's sample timestamps."""
    return int(time.time() * 1e6)


def process_samples(nvml: Any, handle: Any, since: int) -> tuple[list[tuple[int, int]], int]:
    """(pid, SM percent) of each per-process sample NVML took after ``since`` (:func:`now`'s unit), and the newest
    timestamp; none newer (``NOT_FOUND``) is none. :class:`Unsupported` where NVML cannot tell the GPU's
    processes apart (``NOT_SUPPORTED``: some VMs, MIG) or this nvidia-ml-py lacks the call."""
    try:
        samples = nvml.nvmlDeviceGetProcessUtilization(handle, since)
    except AttributeError:
        raise Unsupported("not in this nvidia-ml-py") from None
    except Exception as exc:
        code = getattr(exc, "value", None)
        if code == NOT_FOUND:
            return [], since
        if code == NOT_SUPPORTED:
            raise Unsupported(f"not supported by this GPU or driver (NVML: {exc})") from None
        raise
    out = []
    for s in samples or ():
        since = max(since, int(getattr(s, "timeStamp", 0)))
        out.append((int(getattr(s, "pid", 0)), int(getattr(s, "smUtil", 0))))
    return out, since
