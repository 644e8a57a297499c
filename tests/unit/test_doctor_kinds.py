"""doctor --pid on a hybrid CPU (issue 20, part 4): the analysis of sampled records (as tests/system/test_doctor_live.py
states them) reports a rank whose busy OpenMP threads ran on two core kinds, and nothing on one kind."""

from __future__ import annotations

from dataclasses import replace

from launcher.doctor.gpu import GpuReport
from launcher.doctor.job_checks import kind_findings
from launcher.doctor.live import JobAudit, ProcessRecord, ThreadRecord, assign_roles
from launcher.topology.kinds import CoreKind, CoreKinds
from launcher.topology.model import Core, L3Group, NumaNode, Package, Topology

CPUS = frozenset(range(8))
HYBRID = Topology((Package(0, CPUS),), (NumaNode(0, CPUS),), (L3Group(CPUS),),
                  tuple(Core(i, (i,), 0, 0, 0) for i in range(8)), CPUS, frozenset(), CPUS,
                  core_kinds=CoreKinds((CoreKind(frozenset(range(4)), 1, "P-core", "test"),
                                        CoreKind(frozenset(range(4, 8)), 0, "E-core", "test"))))


def busy_rank(cpus_seen: list[int]) -> JobAudit:
    rank = ProcessRecord(10, 1, "python3", ["python3"], {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    for i, cpu in enumerate(cpus_seen):
        tid = 10 if i == 0 else 1000 + i
        t = ThreadRecord(tid, "python3", CPUS, cpu, seen={cpu: 20}, samples=20, first_ticks=0, last_ticks=100)
        rank.threads[tid] = t
    job = JobAudit(10, 1.0, 0.05, 20, [rank], GpuReport(False, "n/a"), CPUS)
    assign_roles(job)
    return job


def test_busy_threads_on_two_kinds_are_reported() -> None:
    job = busy_rank([0, 1, 2, 3, 4, 5])
    (found,) = kind_findings(job, job.processes[0], HYBRID)
    assert found.id == "core-kinds-mixed" and found.severity == "warning"
    assert "4 on P-core" in found.message and "2 on E-core" in found.message and "affrun" in found.fix


def test_one_kind_or_a_homogeneous_machine_is_fine() -> None:
    job = busy_rank([0, 1, 2, 3])
    assert kind_findings(job, job.processes[0], HYBRID) == []
    job = busy_rank([0, 1, 2, 3, 4, 5])
    assert kind_findings(job, job.processes[0], replace(HYBRID, core_kinds=CoreKinds())) == []
