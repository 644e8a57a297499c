"""GPU utilisation during a live audit, through NVML (``nvidia-ml-py``), when it and a GPU are present.

NVML numbers GPUs in PCI bus order (like ``nvidia-smi``), not in CUDA's visible order: the report names each GPU
by its PCI address.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class GpuUsage:
    index: int  # NVML index (PCI bus order)
    pci: str
    name: str
    utilisation: list[int] = field(default_factory=list)  # percent, one value per sample
    memory_used_mib: int = 0
    pids: set[int] = field(default_factory=set)  # processes of the audited job using this GPU

    @property
    def mean_utilisation(self) -> float | None:
        return sum(self.utilisation) / len(self.utilisation) if self.utilisation else None

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
                self.report_data.gpus.append(GpuUsage(i, _text(pci).lower(), _text(name)))
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
        for handle, usage in zip(self._handles, self.report_data.gpus):
            try:
                usage.utilisation.append(int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
                usage.memory_used_mib = int(nvml.nvmlDeviceGetMemoryInfo(handle).used) // (1 << 20)
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if p.pid in job_pids:
                        usage.pids.add(int(p.pid))
            except Exception:
                continue

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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
