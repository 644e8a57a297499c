"""GPU utilisation during a live audit, through :mod:`launcher.base.nvml`: each GPU (by PCI address, NVML's
order) with its busy share at each sample and its processes' own where the driver gives them (docs/doctor.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from launcher.base import nvml


@dataclass
class GpuUsage:
    index: int  # NVML index (PCI bus order)
    pci: str
    name: str
    utilisation: list[int] = field(default_factory=list)  # percent, one value per sample
    memory_used_mib: int = 0
    pids: set[int] = field(default_factory=set)  # processes of the audited job using this GPU
    others: set[int] = field(default_factory=set)  # other processes on it that this PID namespace holds
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
        self._nvml, why = nvml.start()
        self._gpus: list[nvml.Gpu] = []
        self._seen: list[int] = []  # per GPU: the newest per-process sample's timestamp, read since it
        usages: list[GpuUsage] = []
        if self._nvml is not None:
            try:
                driver = nvml.driver(self._nvml)
                self._gpus = nvml.gpus(self._nvml)
                usages = [GpuUsage(g.index, g.pci, g.name, uuid=g.uuid) for g in self._gpus]
                why = f"NVIDIA driver {driver}" if usages else "NVML found no GPU"
            except Exception as exc:
                why, usages = f"NVML: {exc}", []
        self._seen = [nvml.now()] * len(usages)
        self.report_data = GpuReport(bool(usages), why if usages else f"not available ({why})", usages)
        if not usages:
            self._close()

    def sample(self, job_pids: set[int]) -> None:
        lib = self._nvml
        if lib is None:
            return
        for i, (gpu, usage) in enumerate(zip(self._gpus, self.report_data.gpus)):
            try:
                usage.utilisation.append(nvml.busy(lib, gpu.handle))
                usage.memory_used_mib = nvml.memory_used_mib(lib, gpu.handle)
                listed = nvml.processes(lib, gpu.handle)
                usage.pids |= listed & job_pids
                usage.others |= {p for p in listed - job_pids if os.path.exists(f"/proc/{p}")}
            except Exception:
                pass
            if usage.per_process:
                continue
            try:
                samples, self._seen[i] = nvml.process_samples(lib, gpu.handle, self._seen[i])
            except nvml.Unsupported as exc:
                usage.per_process = str(exc)
                continue
            except Exception:
                continue
            for pid, sm in samples:
                if pid in job_pids:
                    usage.processes.setdefault(pid, []).append(sm)

    def report(self) -> GpuReport:
        self._close()
        return self.report_data

    def _close(self) -> None:
        if self._nvml is not None:
            nvml.stop(self._nvml)
            self._nvml = None
