"""GPU utilisation during a live audit, through NVML (``nvidia-ml-py``), when it and a GPU are present.

NVML numbers GPUs in PCI bus order (like ``nvidia-smi``), not in CUDA's visible order: the report names each GPU
by its PCI address. Each sample reads each GPU's busy share (``nvmlDeviceGetUtilizationRates``) and, where the
driver gives them, the per-process samples NVML took since the last read (``nvmlDeviceGetProcessUtilization``;
``NVML_ERROR_NOT_SUPPORTED`` in some VMs and under MIG: then only the device's share is known).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED


@dataclass
class GpuUsage:
    index: int  # NVML index (PCI bus order)
    pci: str
    name: str
    utilisation: list[int] = field(default_factory=list)  # percent, one value per sample
    memory_used_mib: int = 0
    pids: set[int] = field(default_factory=set)  # processes of the audited job using this GPU
    uuid: str = ""
    # the SM share of each process of the job in NVML's per-process samples (percent, one value per sample)
    processes: dict[int, list[int]] = field(default_factory=dict)
    per_process: str = ""  # why there are no per-process figures ("" while NVML gives them)

    @property
    def mean_utilisation(self) -> float | None:
        return sum(self.utilisation) / len(self.utilisation) if self.utilisation else None

    def process_mean(self, pid: int) -> float | None:
        """The mean SM share (percent) of process ``pid`` over NVML's samples of it, ``None`` without one."""
        values = self.processes.get(pid)
        return sum(values) / len(values) if values else None

    def to_json(self) -> dict[str, Any]:
        mean = self.mean_utilisation
        return {
            "index": self.index,
            "pci": self.pci,
            "name": self.name,
            "utilisation_mean": None if mean is None else round(mean, 1),
            "utilisation_samples": len(self.utilisation),
            "memory_used_mib": self.memory_used_mib,
            "job_pids": sorted(self.pids),
            "uuid": self.uuid or None,
            "process_utilisation": {str(pid): round(m, 1) for pid in sorted(self.processes)
                                    if (m := self.process_mean(pid)) is not None},
            "per_process": self.per_process or "available",
        }


@dataclass
class GpuReport:
    available: bool
    reason: str  # why it is not available, or the driver version
    gpus: list[GpuUsage] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"available": self.available, "reason": self.reason, "gpus": [g.to_json() for g in self.gpus]}


class GpuSampler:
    """Samples every GPU's utilisation; ``report()`` ends the sampling. Never raises: NVML problems become text."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._seen: list[int] = []  # per GPU: the newest per-process sample's timestamp (us), read since it
        self.report_data = GpuReport(False, "")
        try:
            import pynvml
        except ImportError:
            self.report_data.reason = "not available (nvidia-ml-py is not installed: pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # pynvml raises NVMLError subclasses (no driver, no library)
            self.report_data.reason = f"not available (NVML: {exc})"
            return
        self._nvml = pynvml
        try:
            count = pynvml.nvmlDeviceGetCount()
            version = pynvml.nvmlSystemGetDriverVersion()
            for i in range(count):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                pci = pynvml.nvmlDeviceGetPciInfo(handle).busId
                name = pynvml.nvmlDeviceGetName(handle)
                self._handles.append(handle)
                self._seen.append(int(time.time() * 1e6))  # NVML's sample timestamps are CPU time in us
                self.report_data.gpus.append(GpuUsage(i, _text(pci).lower(), _text(name), uuid=_uuid(pynvml, handle)))
        except Exception as exc:
            self.report_data.reason = f"not available (NVML: {exc})"
            self._close()
            return
        if not count:
            self.report_data.reason = "not available (NVML found no GPU)"
            self._close()
            return
        self.report_data.available = True
        self.report_data.reason = f"NVIDIA driver {_text(version)}"

    def sample(self, job_pids: set[int]) -> None:
        if self._nvml is None:
            return
        nvml = self._nvml
        for i, (handle, usage) in enumerate(zip(self._handles, self.report_data.gpus)):
            try:
                usage.utilisation.append(int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
                usage.memory_used_mib = int(nvml.nvmlDeviceGetMemoryInfo(handle).used) // (1 << 20)
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if p.pid in job_pids:
                        usage.pids.add(int(p.pid))
            except Exception:
                pass
            if not usage.per_process:
                self._process_samples(i, handle, usage, job_pids)

    def _process_samples(self, i: int, handle: Any, usage: GpuUsage, job_pids: set[int]) -> None:
        """The per-process samples NVML took since the newest one read; none new is ``NVML_ERROR_NOT_FOUND``."""
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(handle, self._seen[i])
        except AttributeError:
            usage.per_process = "not in this nvidia-ml-py"
            return
        except Exception as exc:
            if getattr(exc, "value", None) == NOT_SUPPORTED:
                usage.per_process = f"not supported by this GPU or driver (NVML: {exc})"
            return
        for sample in samples or ():
            stamp, pid = int(getattr(sample, "timeStamp", 0)), int(getattr(sample, "pid", 0))
            self._seen[i] = max(self._seen[i], stamp)
            if pid in job_pids:
                usage.processes.setdefault(pid, []).append(int(getattr(sample, "smUtil", 0)))

    def report(self) -> GpuReport:
        self._close()
        return self.report_data

    def _close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None


def _uuid(nvml: Any, handle: Any) -> str:
    try:
        return _text(nvml.nvmlDeviceGetUUID(handle))
    except Exception:
        return ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
