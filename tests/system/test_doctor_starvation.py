"""``affrun doctor --pid`` judges a live job against what it could use (issue 39): the whole job collapsed by
each binder, the main thread's wait for a CPU with its cause (busy neighbours, a CPU quota), the GPU's share
through NVML, and one verdict per rank.

Every job is real (plain ``torchrun``, ``affrun torchrun``, ``affrun exec``) and so is the cgroup of the quota.
What is asserted does not depend on the machine's load: the CPUs the kernel says the job holds, the cause named,
a wait that is a fraction, a neighbour pinned to the rank's one CPU, a quota of 1% of a CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from launcher.base.cpulist import format_cpulist
from launcher.feed import verdict as v
from tests.conftest import need
from tests.launch import PROGRAMS, affrun_argv, llvm_libomp, torchrun_argv
from tests.machines import FAKE_PYNVML
from tests.system.test_doctor_live import CPUS, audit, findings, job_env, kernel_mask, kill_all, processes, running

pytestmark = pytest.mark.slow
LOOP = str(PROGRAMS / "starve_loop.py")
SPIN = "import os, sys\nos.write(1, f'READY {os.getpid()}\\n'.encode())\nwhile True:\n    pass\n"


@pytest.fixture(autouse=True)
def _needs() -> None:
    need(len(CPUS) >= 2, "a collapse needs at least 2 allowed CPUs")
    need(os.path.exists(f"/proc/self/task/{os.getpid()}/schedstat"), "the kernel has no schedstat (CONFIG_SCHED_INFO)")


def the_rank(data: dict[str, Any]) -> dict[str, Any]:
    (rank,) = processes(data, "rank")
    return rank


def assert_judged(rank: dict[str, Any]) -> None:
    """Every rank has its main thread's line, a demand, and one verdict with its evidence."""
    main = rank["supply"]["main_thread"]
    main_line = next(t for t in rank["threads"] if t["tid"] == rank["pid"])
    assert main["tid"] == rank["pid"] and main_line["cpu_wait_fraction"] == main["cpu_wait_fraction"]
    if main_line["samples"] >= 2:  # a loaded machine may give the doctor one sample of a short audit
        assert 0 <= main["cpu_wait_fraction"] <= 1 and rank["supply"]["cpu_demand"] >= 0
    assert rank["supply"]["supply_cpus"]
    assert rank["verdict"]["verdict"] in v.KINDS and rank["verdict"]["evidence"]


# ----------------------------------------------------------------------------- the whole job, collapsed
def _binders() -> dict[str, tuple[dict[str, str], list[str], str]]:
    """name -> (the launcher's environment, a command around it, what the finding must name as the cause)."""
    first = str(min(CPUS))
    return {
        "OMP_PROC_BIND/OMP_PLACES": ({"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}, [],
                                     "OMP_PLACES=cores OMP_PROC_BIND=close in the launcher's environment: libgomp"),
        "GOMP_CPU_AFFINITY": ({"GOMP_CPU_AFFINITY": format_cpulist(CPUS)}, [],
                              f"GOMP_CPU_AFFINITY={format_cpulist(CPUS)} in the launcher's environment: libgomp"),
        "KMP_AFFINITY with LLVM libomp": ({"KMP_AFFINITY": "granularity=fine,compact"}, [],
                                          "KMP_AFFINITY=granularity=fine,compact in the launcher's environment: "
                                          "LLVM libomp"),
        "taskset": ({}, ["taskset", "-c", first], "no binding variable explains it: a taskset"),
        "numactl": ({}, ["numactl", f"--physcpubind={first}"], "no binding variable explains it: a taskset, "
                    "numactl --physcpubind"),
    }


@pytest.mark.torch
@pytest.mark.parametrize("binder", list(_binders()))
def test_plain_torchrun_collapsed_by_each_binder_is_named_with_its_cause(binder: str) -> None:
    """The launcher, the rank and its workers all on one place: `doctor --pid <launcher>` says so, whatever each
    process's own mask looks like (before, a launcher pinned to CPU 0 made every process "own" CPU 0: no findings)."""
    variables, around, cause = _binders()[binder]
    if around:
        need(shutil.which(around[0]), f"{around[0]} is not installed")
    if "KMP_AFFINITY" in variables:
        variables = {**variables, "LD_PRELOAD": str(llvm_libomp(14))}
    argv = [*around, *torchrun_argv("--nproc-per-node", "1", "--standalone", LOOP)]
    with running(argv, job_env(**variables)) as (proc, lines):
        rank_pid = int(lines[-1].split()[1])
        span = kernel_mask(proc.pid)  # torchrun's own pid: taskset and numactl exec it
        try:
            code, data = audit(proc.pid)
            held = kernel_mask(rank_pid)
        finally:
            kill_all([rank_pid])
    need(span < frozenset(parse(data["reference_cpus"])), f"{binder} left the job its whole machine here")
    assert held == span and data["job_cpus"] == format_cpulist(span)
    found = findings(data)["job-collapsed"]
    assert code == 1 and found["severity"] == "error"
    assert f"the whole job runs on CPUs {format_cpulist(span)} while it could use CPUs {data['reference_cpus']}" \
        in found["message"]
    assert cause in found["message"] and f"(pid {proc.pid})" in found["subject"]
    assert f"rank 0 (pid {rank_pid})" in found["message"]
    rank = the_rank(data)
    assert_judged(rank)
    starved = findings(data).get("cpu-starved")
    assert starved is None or "(collapse: " in starved["message"]  # when the main thread waited, it is the collapse


def parse(cpus: str) -> set[int]:
    from launcher.base.cpulist import parse_cpulist

    return set(parse_cpulist(cpus))


@pytest.mark.parametrize("local_world", ["2", "1"])
def test_one_rank_of_several_audited_alone_is_not_a_collapsed_job(local_world: str) -> None:
    """A rank its launcher narrowed (`taskset`, as torchrun --numa-binding, accelerate or DeepSpeed bind each rank)
    audited by its own pid: that is the launcher's plan, not the whole job on one CPU (it said "the whole job runs
    on CPUs 1", exit 1). A job of one process so narrowed is still found."""
    need(len(CPUS) > 1, "one CPU: nothing can be narrowed")
    env = job_env(LOCAL_RANK="0", RANK="0", LOCAL_WORLD_SIZE=local_world, WORLD_SIZE=local_world)
    with running(["taskset", "-c", str(max(CPUS)), sys.executable, "-c", SPIN], env) as (_proc, lines):
        _, data = audit(int(lines[-1].split()[1]))
    assert ("job-collapsed" in findings(data)) == (local_world == "1"), data["findings"]


@pytest.mark.torch
def test_the_same_job_under_affrun_torchrun_is_not_collapsed() -> None:
    """The binding variables exported as above, the job launched by `affrun torchrun`: nothing collapses, and a
    main thread that waits for a CPU waits for processes outside the job, never for its own threads."""
    argv = affrun_argv("torchrun", "--nproc-per-node", "1", "--standalone", LOOP)
    with running(argv, job_env(OMP_PROC_BIND="close", OMP_PLACES="cores")) as (proc, lines):
        rank_pid = int(lines[-1].split()[1])
        try:
            _, data = audit(proc.pid)
        finally:
            kill_all([rank_pid])
    found = findings(data)
    assert "job-collapsed" not in found and "collapse" not in found
    assert not [f for f in data["findings"] if f["severity"] == "error"], data["findings"]
    assert all(f["severity"] == "info" for f in data["findings"] if f["id"] == "cpu-starved")
    assert data["job_cpus"] == data["reference_cpus"]
    assert_judged(the_rank(data))


@pytest.mark.torch
def test_libiomp5s_forked_workers_keep_the_whole_mask_and_the_job_is_not_collapsed() -> None:
    """KMP_AFFINITY with libiomp5 preloaded pins the rank's main thread at its first parallel region, but hands
    fork()ed DataLoader workers their full mask back (KMP_INIT_AT_FORK): the job is not collapsed, and
    collapse-risk says what libiomp5 really does (before: that the workers inherit the one CPU)."""
    from tests.launch import intel_libiomp5

    env = job_env(KMP_AFFINITY="granularity=fine,compact", LD_PRELOAD=str(intel_libiomp5()))
    with running(torchrun_argv("--nproc-per-node", "1", "--standalone", LOOP), env) as (proc, lines):
        rank_pid = int(lines[-1].split()[1])
        workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(rank_pid)], capture_output=True,
                                                  text=True).stdout.split()]
        masks = {w: kernel_mask(w) for w in workers}
        try:
            _, data = audit(proc.pid)
        finally:
            kill_all([rank_pid])
    assert workers and all(m == CPUS for m in masks.values())  # the kernel: the workers kept the whole mask
    found = findings(data)
    assert "job-collapsed" not in found and "collapse" not in found
    risk = found["collapse-risk"]
    assert "at its first parallel region" in risk["message"]
    assert "libiomp5 gives a fork()ed child" in risk["why"] and "spawn or forkserver workers" in risk["why"]


# ----------------------------------------------------------------------------- the wait for a CPU, and its cause
@contextmanager
def spinners(cpu: int, count: int) -> Iterator[list[int]]:
    """``count`` processes that spin on CPU ``cpu`` (busy neighbours, not of the job)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
             for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_busy_neighbours_on_the_ranks_cpu_starve_its_main_thread() -> None:
    """A rank on one CPU of its own (`affrun exec --cpus`), with two processes outside the job spinning on that
    CPU: its main thread waits for the CPU most of the time, the neighbours are named, and the verdict is
    starved of CPU by neighbours, not by the job itself."""
    cpu = min(CPUS)
    argv = affrun_argv("exec", "--cpus", str(cpu), "--", sys.executable, "-c", SPIN)
    with spinners(cpu, 2) as neighbours, running(argv, job_env()) as (proc, _):
        _, data = audit(proc.pid)
    rank = the_rank(data)
    assert_judged(rank)
    supply = rank["supply"]
    assert supply["main_thread"]["allowed"] == str(cpu) and supply["main_thread"]["cpu_wait_fraction"] >= v.STARVED_WAIT
    assert set(neighbours) <= {n["pid"] for n in supply["neighbours"]}
    assert all(parse(n["allowed"]) & {cpu} for n in supply["neighbours"])
    starved = findings(data)["cpu-starved"]
    assert starved["severity"] == "info" and "(neighbours: " in starved["message"]
    assert rank["verdict"]["verdict"] == v.UNKNOWN and rank["verdict"]["likely"] == v.CPU  # no GPU here
    assert rank["verdict"]["cause"] == v.NEIGHBOURS and "job-collapsed" not in findings(data)


def _cpu_hierarchy() -> tuple[Path, bool] | None:
    """Where this process may make a cgroup with a CPU quota: the v1 cpu controller's mount, or a v2 mount whose
    root delegates ``cpu`` to its children; ``None`` where neither is writable."""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup" and "cpu" in fields[3].split(","):
            path = Path(fields[1])
            if os.access(path, os.W_OK):
                return path, False
        if fields[2] == "cgroup2":
            path = Path(fields[1])
            control = path / "cgroup.subtree_control"
            if os.access(control, os.W_OK) and "cpu" in control.read_text().split():
                return path, True
    return None


@contextmanager
def quota_cgroup(micros: int) -> Iterator[Path]:
    """A real cgroup of the cpu controller allowing ``micros`` us of CPU per 100 ms period."""
    found = _cpu_hierarchy()
    need(found, "no cgroup of the cpu controller can be made here (needs root and a writable cgroup mount)")
    assert found is not None
    mount, v2 = found
    group = mount / f"affrun-test-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as exc:
        need(False, f"cannot make a cgroup under {mount}: {exc}")
    try:
        if v2:
            (group / "cpu.max").write_text(f"{micros} 100000")
        else:
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text(str(micros))
        yield group
    finally:
        for _ in range(100):  # the job's processes leave it as they are reaped
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def test_a_cpu_quota_throttles_the_job_and_starves_its_main_thread() -> None:
    """A job in a real cgroup with a quota of 1% of a CPU: its cgroup's throttling is counted (cpu-throttled),
    and its main thread, which always wants a CPU, waits for one because of the quota."""
    with quota_cgroup(1000) as group, running([sys.executable, "-c", SPIN], job_env()) as (proc, _):
        (group / "cgroup.procs").write_text(str(proc.pid))  # the whole process, every thread of it
        code, data = audit(proc.pid, 1.5)
    rank = the_rank(data)
    assert_judged(rank)
    (throttling,) = [t for t in data["throttling"] if proc.pid in t["pids"]]
    assert throttling["throttled_periods"] > 0 and 0 < throttling["throttled_fraction"] <= 1
    assert throttling["quota"].startswith("0.01 CPUs") and group.name in throttling["cgroup"]
    assert rank["supply"]["throttling"] == throttling
    throttled = findings(data)["cpu-throttled"]
    assert throttled["severity"] == "warning" and group.name in throttled["message"] and "quota" in throttled["fix"]
    assert code == 1
    starved = findings(data)["cpu-starved"]
    assert "(throttled: " in starved["message"] and rank["verdict"]["cause"] == v.THROTTLED


# ----------------------------------------------------------------------------- the GPU, through NVML
def _nvml(tmp_path: Path, state: dict[str, Any], gpus: int = 1) -> dict[str, str]:
    """The doctor's environment with nvidia-ml-py's module stated (tests/machines.py) and what its GPUs do."""
    fake = tmp_path / "nvml"
    fake.mkdir(exist_ok=True)
    (fake / "pynvml.py").write_text(FAKE_PYNVML.format(
        gpus=[(f"00000000:{0x18 + i:02x}:00.0", f"GPU-{i}0000000-aaaa-bbbb-cccc-dddddddddddd") for i in range(gpus)]))
    (tmp_path / "state.json").write_text(json.dumps(state))
    return {"PYTHONPATH": f"{fake}:{os.environ.get('PYTHONPATH', '')}", "FAKE_NVML_STATE": str(tmp_path / "state.json")}


def test_a_gpu_busy_with_other_processes_is_not_the_rank_s_share(tmp_path: Path) -> None:
    """The rank's GPU (its local rank's) is 100% busy with another process of this PID namespace, which NVML lists,
    and none of the job's: the rank's share is 0, not the device's 100%, and it is not fed."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    env = job_env(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    try:
        with running([sys.executable, "-c", SPIN], env) as (_proc, lines):
            pid = int(lines[-1].split()[1])
            state = {"utilisation": [100], "processes": [[other.pid]], "process_util": [{str(other.pid): 100}]}
            _, data = audit(pid, env=_nvml(tmp_path, state))
    finally:
        other.kill()
        other.wait()
    gpu = the_rank(data)["supply"]["gpu"]
    assert (gpu["busy_fraction"], gpu["measured"]) == (0.0, "process"), gpu
    assert "NVML lists none of its processes there" in gpu["mapped_by"]
    assert the_rank(data)["verdict"]["verdict"] != v.FED


@pytest.mark.parametrize(("state", "extra", "busy", "measured", "index", "mapped_by"), [
    ({"utilisation": [40], "processes": [["RANK"]], "process_util": [{"RANK": 95}]}, {}, 0.95, "process", 0,
     "its process on the GPU"),
    ({"utilisation": [9], "processes": [["RANK"]], "process_util": ["not supported"]}, {}, 0.09, "device", 0,
     "its process on the GPU"),
    ({"utilisation": [0, 12]}, {"AFFRUN_GPU_PCI": "0000:19:00.0"}, 0.12, "device", 1, "AFFRUN_GPU_PCI"),
    ({"utilisation": [0, 12]}, {"CUDA_VISIBLE_DEVICES": "1"}, 0.12, "device", 1, "CUDA_VISIBLE_DEVICES"),
])
def test_each_rank_has_its_gpus_busy_share_and_a_verdict(tmp_path: Path, state: dict[str, Any],
                                                         extra: dict[str, str], busy: float, measured: str,
                                                         index: int, mapped_by: str) -> None:
    """NVML's figures beside the rank: per process where NVML gives them, else the device's; the rank matched to
    its GPU by NVML's process list, else AFFRUN_GPU_PCI, else CUDA_VISIBLE_DEVICES and its local rank. A GPU
    busy 95% is fed, whatever the CPU side says; an idle one is not."""
    env = job_env(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", **extra)
    with running([sys.executable, "-c", SPIN], env) as (_proc, lines):
        pid = int(lines[-1].split()[1])
        text = json.dumps(state).replace('{"RANK"', f'{{"{pid}"').replace('"RANK"', str(pid))  # keys stay text
        _, data = audit(pid, env=_nvml(tmp_path, json.loads(text), gpus=2 if index else 1))
    rank = the_rank(data)
    assert_judged(rank)
    gpu = rank["supply"]["gpu"]
    assert (gpu["index"], gpu["measured"]) == (index, measured) and gpu["busy_fraction"] == pytest.approx(busy)
    assert gpu["mapped_by"].startswith(mapped_by)
    verdict = rank["verdict"]
    assert f"the GPU was busy {100 * busy:.0f}%" in verdict["evidence"]
    assert (verdict["verdict"] == v.FED) == (busy >= v.FED_BUSY)
    if busy < v.FED_BUSY:  # starved of CPU when its main thread waited (the machine's load), else not known
        assert verdict["verdict"] in (v.CPU, v.UNKNOWN)
    reported = data["gpus"]["gpus"][index]
    if measured == "process":
        assert reported["per_process"] == "available" and reported["process_utilisation"] == {str(pid): 95.0}
    if state.get("process_util") == ["not supported"]:
        assert reported["per_process"].startswith("not supported") and reported["process_utilisation"] == {}
