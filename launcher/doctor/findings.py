"""The :class:`Finding` record, severities, and the catalogue of stable finding ids (docs/doctor.md, "Finding ids")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Severity = Literal["info", "warning", "error"]
SEVERITIES: tuple[Severity, ...] = get_args(Severity)  # in increasing order


def severity_rank(severity: Severity) -> int:
    return SEVERITIES.index(severity)


def severity_named(value: str) -> Severity:
    """A severity given as text (an option, an ini file) as a :data:`Severity`; ``ValueError`` for any other word."""
    for severity in SEVERITIES:
        if severity == value:
            return severity
    raise ValueError(f"unknown severity {value!r}; choose one of {', '.join(SEVERITIES)}")


@dataclass(frozen=True)
class Finding:
    """One problem: what is wrong, why it matters, the exact fix, where it was seen (``subject``), and the fix as
    variables to set where it is one (``env_fix``, ``None`` unsets: what ``ensure_affinity`` applies)."""

    id: str
    severity: Severity
    message: str
    why: str
    fix: str
    subject: str = ""
    env_fix: Mapping[str, str | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")
        if self.id not in CATALOGUE:
            raise ValueError(f"finding id {self.id!r} is not in the catalogue")

    def at_least(self, severity: Severity) -> bool:
        return severity_rank(self.severity) >= severity_rank(severity)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "severity": self.severity,
            "message": self.message,
            "why": self.why,
            "fix": self.fix,
        }
        if self.subject:
            out["subject"] = self.subject
        if self.env_fix:
            out["env_fix"] = dict(self.env_fix)
        return out


def worst_first(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: -severity_rank(f.severity))


def merge_subjects(findings: Iterable[Finding]) -> list[Finding]:
    """Findings that differ only by subject (the same problem in every rank) become one, listing the subjects."""
    merged: dict[tuple[str, str, str], list[Finding]] = {}
    for f in findings:
        merged.setdefault((f.id, f.severity, f.message), []).append(f)
    out: list[Finding] = []
    for group in merged.values():
        first = group[0]
        subjects = [g.subject for g in group if g.subject]
        if len(group) > 1 and subjects:
            first = Finding(first.id, first.severity, first.message, first.why, first.fix, "; ".join(subjects),
                            first.env_fix)
        out.append(first)
    return out


# id -> what it means (``affrun doctor --ids``). Every id a check can emit is here (a test checks it).
CATALOGUE: dict[str, str] = {
    "kmp-affinity-disabled": "KMP_AFFINITY=disabled: libiomp5/libomp threads are not bound and migrate; "
                             "intel-openmp >= 2025 also aborts forked DataLoader workers",
    "kmp-affinity-empty": "KMP_AFFINITY is set but empty",
    "kmp-affinity-malformed": "KMP_AFFINITY has a token libiomp5 does not accept, or more than one type",
    "kmp-proclist-outside": "KMP_AFFINITY's proclist names CPUs outside the allowed CPUs",
    "places-outside-mask": "OMP_PLACES or GOMP_CPU_AFFINITY names CPUs outside the allowed CPUs",
    "omp-binding-malformed": "OMP_PLACES or OMP_PROC_BIND is not a valid value",
    "omp-threads-invalid": "OMP_NUM_THREADS (or MKL_/OPENBLAS_NUM_THREADS, or a pool count: OpenCV's, Rayon's, "
                           "numexpr's, BLIS's) is not a positive integer",
    "omp-oversubscribed": "threads per rank × ranks sharing the CPUs exceed the CPUs (error) or the cores (warning)",
    "omp-threads-unset": "OMP_NUM_THREADS is unset while several ranks share the CPUs: each starts one thread per CPU",
    "core-kinds-mixed": "on a hybrid CPU (P/E cores, big.LITTLE) the rank's OpenMP team spans core kinds: the "
                        "slower cores gate every parallel region",
    "omp-threads-one": "OMP_NUM_THREADS=1 (torchrun's or a container's default) on a rank that owns several cores",
    "collapse-risk": "an OpenMP binding variable pins the main thread to one place of a wider mask: DataLoader "
                     "workers (and, without a per-rank mask, every rank) inherit that one place",
    "inherited-mask-collapsed": "this process starts on one CPU of a wider cgroup cpuset with several local ranks: "
                                "a parent (a launcher that imported torch with a binding variable set) was "
                                "pinned, and every rank inherits its CPU",
    "kmp-ignored-by-libgomp": "KMP_* variables are set but the OpenMP runtime is GNU libgomp, which ignores them",
    "openmp-runtimes-mixed": "two OpenMP runtimes in one process (libgomp with libiomp5 or libomp)",
    "double-binding": "torchrun --numa-binding (or PET_NUMA_BINDING), accelerate's --enable_cpu_affinity "
                      "(ACCELERATE_CPU_AFFINITY) or DeepSpeed's --bind_cores_to_rank together with affrun: two "
                      "binders fight",
    "srun-cpus-per-task": "SLURM_CPUS_PER_TASK without SRUN_CPUS_PER_TASK on Slurm 22.05.0-23.02.4: "
                          "srun gives each task one CPU",
    "numactl-missing": "numactl is not installed",
    "membind-blocked": "the memory policy (set_mempolicy/numactl --membind) is refused here (EPERM in containers)",
    "gpu-numa-unknown": "a GPU's PCI numa_node is -1: its local CPUs are unknown to the kernel",
    "cpu-quota": "a CFS CPU quota (cgroup cpu.max, cpu.cfs_quota_us) below the allowed CPUs: the affinity mask "
                 "does not show it, and threads above it are throttled",
    "cuda-device-order": "CUDA_DEVICE_ORDER is not PCI_BUS_ID on a machine with GPUs of different models",
    "collapse": "live: a rank's DataLoader workers are all confined to one CPU while the rank owns several",
    "rank-overlap": "live: the CPU masks of two ranks overlap",
    "job-collapsed": "live: the whole job, its launcher included, runs on fewer CPUs than it could use (its cgroup "
                     "cpuset, the online CPUs), with the cause: a binding variable its launcher's OpenMP runtime "
                     "read at `import torch`, or a taskset / numactl --physcpubind around it",
    "cpu-starved": "live: a rank's main thread waited for a CPU at least 20% of the sample (schedstat), with the "
                   "cause: a collapse, throttling, its own threads oversubscribing its CPUs, or processes outside "
                   "the job",
    "cpu-throttled": "live: a cgroup of the job ran out of its CPU quota during the sample (cpu.stat)",
    "run-unbound": "live: a process under affrun run that its plan makes a rank runs outside that rank's CPUs: "
                   "its interpreter did not load affrun's startup hook",
    "thread-migrations": "live: busy threads of a rank move between CPUs (unbound threads)",
    "gpu-low-utilisation": "live: a GPU used by the job was mostly idle during the sample",
    "feed-starved": "live (--feed-report): a rank's training loop waited for its DataLoader more than 20% of its "
                    "wall time; affrun tune finds the loader cores and workers that feed it",
    "nccl-ib-hca-prefix": "NCCL_IB_HCA or NCCL_SOCKET_IFNAME names a device that, as NCCL's prefix match, also "
                          "selects others (mlx5_1 selects mlx5_10-19): the '=' form selects only those named",
    "nic-far": "the NIC a rank was told to use (UCX_NET_DEVICES, AFFRUN_NIC) is farther from its GPU than the nearest",
    "rank-off-gpu-node": "a rank's CPUs hold no CPU of its GPU's NUMA node: NCCL's own pinning finds an empty "
                         "intersection",
    "nccl-threads": "live: where NCCL's threads (named NCCL...) ran, apart from the OpenMP team and the loaders",
    "nccl-threads-shared": "live: NCCL's threads ran on a core of the rank's OpenMP team or its DataLoader workers",
    "nccl-loaded": "live: the NCCL version a rank has loaded",
    "nccl-mask-leak": "live: NCCL 2.29.2 to 2.29.7 is loaded, which leaks the GPU-local mask into the thread that "
                      "creates a communicator (NVIDIA/nccl #2033, fixed in 2.30)",
    "thread-strayed": "live: a thread of a rank or of its DataLoader worker ran outside its home in the thread plan",
    "mask-changed-after-start": "live: a thread's CPU mask is neither what affrun applied nor what the rank's OpenMP "
                                "places explain: another binder changed it after start (named when the evidence "
                                "names one)",
    "pool-oversubscribed": "a pool variable (OpenCV's, Rayon's, numexpr's, BLIS's; OpenBLAS's with a main core) "
                           "sizes its pool above what the rank's thread plan gives it; live: a process ran more busy "
                           "threads of one pool than its home has CPUs",
    "main-off-priority": "live: a rank given a core of its own for its main thread (AFFRUN_MAIN_CPUS) whose main "
                         "thread ran, or may run, elsewhere",
}
