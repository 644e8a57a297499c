"""``affrun doctor --pid``'s judgement of a rank's supply (issue 39), on stated records: the cgroup counters read
from a fake ``cpu.stat`` (v1 and v2), the cause of a main thread's wait, the whole job's collapse and its cause,
and the GPU a rank is matched to. The real jobs: tests/system/test_doctor_starvation.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.base import procfs
from launcher.context.runtimes import runtimes_from_paths
from launcher.doctor.collapse import job_collapse_findings
from launcher.doctor.contention import Neighbour, ThrottleWatch, Throttling
from launcher.doctor.gpu import GpuReport, GpuUsage
from launcher.doctor.live import JobAudit, ProcessRecord, ThreadRecord, assign_roles
from launcher.doctor.starvation import judge_ranks, rank_gpu, starvation_findings
from launcher.feed import verdict as v
from launcher.topology import load_topology
from launcher.topology.cgroup import cpu_cgroups
from tests.fakesys import uniform, write_tree


# ----------------------------------------------------------------------------- cpu.stat
def _stat(path: Path, periods: int, throttled: int, time: int, v2: bool) -> None:
    key = "throttled_usec" if v2 else "throttled_time"
    path.write_text(f"usage_usec 1\nnr_periods {periods}\nnr_throttled {throttled}\n{key} {time}\n")


@pytest.mark.parametrize("v2", [False, True])
def test_throttling_is_the_growth_of_the_cgroups_counters(tmp_path: Path, v2: bool) -> None:
    m = uniform(1, 2)
    if v2:
        m.cpu_max = "50000 100000"
    else:
        m.cfs_quota = ("50000", "100000")
    root = write_tree(tmp_path / "m", m)
    cgroup = (root / "proc/self/cgroup").read_text()
    (root / "proc/4242").mkdir(parents=True)
    (root / "proc/4242/cgroup").write_text(cgroup)
    group = root / ("sys/fs/cgroup/job" if v2 else "sys/fs/cgroup/cpu,cpuacct/kubepods/pod1")
    unit = 1000 if v2 else 1  # v2 counts microseconds, v1 nanoseconds
    _stat(group / "cpu.stat", 100, 10, 5 * 10**8 // unit, v2)
    assert cpu_cgroups(str(root), "4242")[0].directory == str(group)  # its own first, then up to the mount
    watch = ThrottleWatch(str(root / "proc"))
    watch.add(4242)
    _stat(group / "cpu.stat", 120, 25, 15 * 10**8 // unit, v2)  # 20 periods, 15 throttled, 1 s throttled
    (t,) = watch.finish()
    assert (t.periods, t.throttled_periods, t.pids) == (20, 15, [4242])
    assert t.throttled_s == pytest.approx(1.0) and t.fraction == pytest.approx(1.0)  # 1 s in a few ms: at most 1
    assert t.quota.startswith("0.5 CPUs") and t.cgroup.endswith(str(group.relative_to(root)))
    assert Throttling("c", [], 10.0, 20, 5, 1.0).fraction == 0.25  # the periods' share, above the time's 0.1


# ----------------------------------------------------------------------------- the cause of a wait
def _thread(tid: int, mask: set[int], ran: float, waited: float, comm: str = "python") -> ThreadRecord:
    t = ThreadRecord(tid, comm, frozenset(mask), min(mask))
    t.sched_first, t.sched_last = (0.0, 0, 0), (1.0, int(ran * 1e9), int(waited * 1e9))
    t.first_ticks, t.last_ticks, t.samples = 0, int(ran * procfs.CLOCK_TICKS), 20
    t.ran = {min(mask): 20}
    return t


def _process(pid: int, ppid: int, threads: list[ThreadRecord], environ: dict[str, str] | None = None,
             comm: str = "python") -> ProcessRecord:
    p = ProcessRecord(pid, ppid, comm, [comm], environ or {})
    p.threads = {t.tid: t for t in threads}
    return p


def _job(processes: list[ProcessRecord], reference: set[int], **kw: object) -> JobAudit:
    job = JobAudit(processes[0].pid, 1.0, 0.05, 20, processes, GpuReport(False, "n/a"), frozenset(reference),
                   online=frozenset(reference), reference=frozenset(reference), reference_source="stated",
                   parent=(1, "bash", frozenset(reference)), **kw)  # type: ignore[arg-type]
    assign_roles(job)
    job.starvation = judge_ranks(job)
    return job


def test_a_main_thread_crowded_by_its_own_workers_is_oversubscribed() -> None:
    rank = _process(10, 1, [_thread(10, {0}, 0.3, 0.6)], {"AFFRUN_CPUS": "0", "AFFRUN_PLAN_ID": "x"})
    worker = _process(11, 10, [_thread(11, {0}, 0.7, 0.3, "pt_data_worker")], comm="pt_data_worker")
    job = _job([rank, worker], {0, 1})
    (f,) = [f for f in starvation_findings(job, job.starvation) if f.id == "cpu-starved"]
    assert f.severity == "warning" and "(oversubscribed: " in f.message and "waited 60%" in f.message
    assert job.starvation[10].verdict is not None and job.starvation[10].verdict.likely == v.CPU


def test_a_main_thread_alone_on_its_cpu_waits_for_neighbours_and_names_them() -> None:
    rank = _process(10, 1, [_thread(10, {0}, 0.35, 0.65)], {"AFFRUN_CPUS": "0", "AFFRUN_PLAN_ID": "x"})
    near = Neighbour(77, "stress", 0.6, frozenset({0}))
    far = Neighbour(78, "other", 0.9, frozenset({1}))
    job = _job([rank], {0, 1}, neighbours=[far, near])
    assert job.starvation[10].neighbours == [near]
    (f,) = [f for f in starvation_findings(job, job.starvation) if f.id == "cpu-starved"]
    assert f.severity == "info" and "(neighbours: " in f.message and "pid 77 (stress" in f.message
    assert "pid 78" not in f.message


def test_a_throttled_cgroup_is_the_cause_and_its_own_finding() -> None:
    rank = _process(10, 1, [_thread(10, {0, 1}, 0.2, 0.7)])
    job = _job([rank], {0, 1}, throttling=[Throttling("cgroup /sys/fs/cgroup/cpu/pod", [10], 1.0, 10, 9, 0.8,
                                                      "0.1 CPUs (cgroup ...)")])
    found = {f.id: f for f in starvation_findings(job, job.starvation)}
    assert "(throttled: " in found["cpu-starved"].message and found["cpu-throttled"].severity == "warning"
    assert "9 of 10 periods" in found["cpu-throttled"].message and "0.1 CPUs" in found["cpu-throttled"].message
    verdict = job.starvation[10].verdict
    assert verdict is not None and verdict.cause == v.THROTTLED and "quota" in verdict.fix


def test_a_launcher_pinned_by_its_binding_variable_collapses_the_whole_job(tmp_path: Path) -> None:
    env = {"OMP_PLACES": "cores", "OMP_PROC_BIND": "close"}
    launcher = _process(9, 1, [_thread(9, {0}, 0.0, 0.0)], env, comm="pt_elastic")
    rank = _process(10, 9, [_thread(10, {0}, 0.3, 0.6)], {**env, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    workers = [_process(11 + i, 10, [_thread(11 + i, {0}, 0.3, 0.6)], env, "pt_data_worker") for i in range(2)]
    for p in (launcher, rank, *workers):
        p.runtimes = runtimes_from_paths(["/x/torch/lib/libgomp-a34b3233.so.1"], p.environ, 1)
    job = _job([launcher, rank, *workers], {0, 1})
    topology = load_topology(fsroot=str(write_tree(tmp_path / "m", uniform(1, 2))))
    (f,) = job_collapse_findings(job, topology, [(1, "bash")])
    assert f.severity == "error" and "the whole job runs on CPUs 0 while it could use CPUs 0-1" in f.message
    assert "OMP_PLACES=cores OMP_PROC_BIND=close in the launcher's environment: libgomp" in f.message
    assert f.env_fix == {"OMP_PLACES": None, "OMP_PROC_BIND": None} and "(pid 9)" in f.subject
    assert job.starvation[10].cause == v.COLLAPSE
    # the same job bound by affrun (each rank's AFFRUN_CPUS, the launcher wide) is not collapsed
    launcher.threads[9].allowed = frozenset({0, 1})
    assert job_collapse_findings(job, topology, []) == []


def test_a_rank_is_matched_to_its_gpu_by_nvml_pci_or_visible_devices() -> None:
    gpus = [GpuUsage(i, f"00000000:{0x18 + i:02x}:00.0", "H200", [50 * i], uuid=f"GPU-{i}") for i in range(2)]
    rank = _process(10, 1, [_thread(10, {0}, 0.5, 0.0)], {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "GPU-1"})
    job = _job([rank], {0, 1})
    job.gpus = GpuReport(True, "driver", gpus)
    assert rank_gpu(job, rank) == (gpus[1], "CUDA_VISIBLE_DEVICES (a UUID) and its local rank")
    rank.environ["AFFRUN_GPU_PCI"] = "0000:18:00.0"
    assert rank_gpu(job, rank) == (gpus[0], "AFFRUN_GPU_PCI")
    gpus[1].pids.add(10)
    assert rank_gpu(job, rank) == (gpus[1], "its process on the GPU (NVML)")
