"""``affrun doctor --pid``: real jobs, real runtimes, and what the kernel itself says about their threads.

Each test starts a real process (torch with DataLoader workers, a C program linked against libiomp5, a real
torchrun or ``affrun torchrun`` job), waits until it is running, audits it with the real CLI, and checks the
report against the masks the test reads itself with ``os.sched_getaffinity``.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.doctor.collapse import collapse_findings
from launcher.doctor.gpu import GpuReport
from launcher.doctor.live import JobAudit, ProcessRecord, ThreadRecord, assign_roles
from tests.conftest import need
from tests.launch import STALLS, affrun_argv, clean_env, communicate, compile_omp, require_torch, run, torchrun_argv
from tests.machines import fake_pynvml, nvml_state

pytestmark = pytest.mark.slow
CPUS = frozenset(os.sched_getaffinity(0))

TORCH_JOB = r"""
import os, sys, time, torch
from torch.utils.data import DataLoader, Dataset

class Numbers(Dataset):
    def __len__(self):
        return 10**7
    def __getitem__(self, i):
        x = 0
        for k in range(2000):
            x += k
        return torch.tensor([x])

if __name__ == "__main__":
    loader = DataLoader(Numbers(), batch_size=4, num_workers=int(os.environ.get("WORKERS", "2")))
    batches = iter(loader)
    next(batches)
    a = torch.randn(64, 64)
    os.write(1, f"READY {os.getpid()}\n".encode())  # one write: ranks share the pipe, unbuffered
    end = time.time() + float(sys.argv[1])
    while time.time() < end:
        a @ a
        next(batches)
"""

SPIN_C = r"""
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double sink = 0;
    int announced = 0;
    for (;;) {
#pragma omp parallel reduction(+ : sink)
        {
            double x = 0;
            for (int i = 0; i < 200000; i++) x += i * 0.5;
            sink += x;
        }
        if (!announced) { printf("READY %d %d\n", (int)getpid(), omp_get_max_threads()); fflush(stdout); announced = 1; }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 > seconds) break;
    }
    return sink < 0;
}
"""


@contextmanager
def running(argv: list[str], env: dict[str, str], ready: int = 1, timeout: float = 90) -> Iterator[
        tuple[subprocess.Popen[bytes], list[str]]]:
    """Start ``argv`` in its own session; yield once ``ready`` READY lines were printed; kill it all afterwards.

    stdout is read with ``os.read`` on the descriptor, not through a buffered file object: one read can hold
    several lines (two ranks, or libiomp5's affinity report and READY), and lines kept in a file object's buffer
    would be invisible to the next ``select``.
    """
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None and proc.stderr is not None
        fd = proc.stdout.fileno()
        pending = b""
        deadline = STALLS.running_seconds() + timeout
        while sum(1 for x in lines if x.startswith("READY")) < ready:
            if STALLS.running_seconds() > deadline:
                pytest.fail(f"{argv} did not get ready in {timeout:.0f} s (still running): {lines}")
            if not select.select([fd], [], [], 1)[0]:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:  # end of file: the job ended before it was ready
                proc.wait(timeout=30)
                err = proc.stderr.read().decode(errors="replace")
                pytest.fail(f"{argv} ended before it was ready (rc={proc.returncode}): {lines}\n{err[-3000:]}")
            *complete, pending = (pending + chunk).split(b"\n")
            lines.extend(x.decode(errors="replace").strip() for x in complete)
        yield proc, lines
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def steal_seconds() -> float:
    """CPU time the hypervisor gave to others while this guest's CPUs had work (``steal``, /proc/stat's 8th figure)."""
    figures = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(figures[8]) / os.sysconf("SC_CLK_TCK") if len(figures) > 8 else 0.0


def audit(pid: int, duration: float = 1.0, timeout: float = 120,
          env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """``affrun doctor --pid PID --json`` (with ``env`` added to this process's environment); if it outlives
    ``timeout``, fail with the stacks it was in (faulthandler)."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})}
    steal = steal_seconds()
    doctor = subprocess.Popen([*affrun_argv("doctor", "--pid", str(pid), "--duration", str(duration), "--json")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = communicate(doctor, timeout)
    except subprocess.TimeoutExpired:
        kernel = Path(f"/proc/{doctor.pid}/wchan").read_text(errors="replace")  # blocked in the kernel, where?
        stat = Path(f"/proc/{doctor.pid}/stat").read_text().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        seen = (f"state {stat[0]}, {(int(stat[11]) + int(stat[12])) / tick:.2f} s of CPU, last on CPU {stat[36]}, "
                f"{steal_seconds() - steal:.1f} s of CPU time taken by the host since it started")  # fields 3, 14, 15, 39
        doctor.send_signal(signal.SIGABRT)  # faulthandler prints every thread's Python stack on SIGABRT
        try:
            out, err = doctor.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            doctor.kill()
            out, err = doctor.communicate()
        pytest.fail(f"affrun doctor --pid {pid} ran over {timeout:.0f} s (kernel wait: {kernel or 'none'}, {seen}); "
                    f"where it was:\n{err[-4000:]}")
    assert doctor.returncode in (0, 1), err
    return doctor.returncode, json.loads(out)


def findings(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["id"]: f for f in data["findings"]}


def processes(data: dict[str, Any], role: str) -> list[dict[str, Any]]:
    return [p for p in data["processes"] if p["role"] == role]


def kill_all(pids: list[int]) -> None:
    """SIGKILL each rank's process group (torchrun makes every rank a session leader), workers included."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kernel_mask(pid: int) -> frozenset[int]:
    return frozenset(os.sched_getaffinity(pid))


def job_env(**extra: str) -> dict[str, str]:
    """The test job's environment. OpenMP threads sleep between parallel regions (``OMP_WAIT_POLICY=passive``,
    which a caller may override): by default torch's libgomp thread spun at 100 % of a CPU between the matmuls,
    and on a KVM guest a vCPU that spins on PAUSE is descheduled by the host (pause-loop exiting). The doctor
    sharing that CPU then got 0.11 s of CPU in 120 s, runnable all along, twice in CI. What is audited (masks,
    variables, runtimes) does not depend on how idle threads wait."""
    return clean_env(**{"OMP_WAIT_POLICY": "passive", **extra})


# ----------------------------------------------------------------------------- the collapse
def test_collapse_of_dataloader_workers_is_reported(tmp_path: Path) -> None:
    require_torch()
    need(len(CPUS) >= 2, "the collapse needs at least 2 allowed CPUs")
    script = tmp_path / "job.py"
    script.write_text(TORCH_JOB)
    env = job_env(OMP_PLACES="cores", OMP_PROC_BIND="close")
    with running([sys.executable, str(script), "600"], env) as (_proc, lines):
        pid = int(lines[-1].split()[1])
        workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                  text=True).stdout.split()]
        masks = {w: kernel_mask(w) for w in workers}
        code, data = audit(pid)
    assert code == 1
    collapse = findings(data)["collapse"]
    assert collapse["severity"] == "error"
    # what the kernel said about the workers is what doctor reports, and it is the one CPU of the collapse
    assert len(workers) == 2 and len(set(masks.values())) == 1 and len(next(iter(masks.values()))) == 1
    (cpu,) = next(iter(masks.values()))
    assert f"confined to CPU {cpu}" in collapse["message"]
    children = processes(data, "child")
    assert sorted(c["pid"] for c in children) == sorted(workers)
    assert all(t["allowed"] == str(cpu) for c in children for t in c["threads"])
    (rank,) = processes(data, "rank")
    assert parse_cpulist(rank["owned_cpus"]) == CPUS  # what the test process gave it
    assert "collapse-risk" in findings(data)  # and the cause, from the rank's own environment


def test_no_collapse_without_binding_variables(tmp_path: Path) -> None:
    require_torch()
    need(len(CPUS) >= 2, "needs at least 2 allowed CPUs")
    script = tmp_path / "job.py"
    script.write_text(TORCH_JOB)
    with running([sys.executable, str(script), "600"], job_env()) as (_proc, lines):
        pid = int(lines[-1].split()[1])
        _code, data = audit(pid, 0.5)
    assert "collapse" not in findings(data) and "collapse-risk" not in findings(data), data["findings"]
    # nothing wrong with the job: its main thread may still wait for a CPU on a loaded machine (cpu-starved, a
    # judgement of the machine's load, not of the job's binding)
    assert not [f for f in data["findings"] if f["severity"] != "info" and f["id"] != "cpu-starved"], data["findings"]
    children = processes(data, "child")
    assert len(children) == 2
    assert all(parse_cpulist(t["allowed"]) == CPUS for c in children for t in c["threads"])
    for c in children:  # every sampled "last CPU" lies inside the allowed set
        for t in c["threads"]:
            assert {int(x) for x in t["cpus_seen"]} <= parse_cpulist(t["allowed"])
            assert 0 <= t["migrations"] < t["samples"]


# ----------------------------------------------------------------------------- libiomp5 and libgomp
def spin_binary(tmp_path: Path, runtime: str) -> Path:
    """Build SPIN_C against libgomp, or linked against libiomp5 or LLVM's libomp alone (no libgomp in the process)."""
    src = tmp_path / "spin.c"
    src.write_text(SPIN_C)
    return compile_omp(tmp_path, runtime, src)


@pytest.mark.parametrize(("build", "runtime"), [("iomp5", "libiomp5"), ("omp", "libomp")])
def test_kmp_affinity_disabled_under_intel_and_llvm_runtimes(tmp_path: Path, build: str, runtime: str) -> None:
    binary = spin_binary(tmp_path, build)
    # libomp 14 aborts on OMP_DISPLAY_AFFINITY with affinity disabled (assertion in kmp_affinity.cpp): only
    # libiomp5 is asked for its own report.
    display = {"OMP_DISPLAY_AFFINITY": "true"} if runtime == "libiomp5" else {}
    env = job_env(OMP_NUM_THREADS="2", KMP_AFFINITY="disabled", **display)
    with running([str(binary), "600"], env) as (_proc, lines):
        pid = int(lines[-1].split()[1])
        code, data = audit(pid)
        own_threads = {int(t): kernel_mask(int(t)) for t in os.listdir(f"/proc/{pid}/task")}
    if display:  # the runtime's own report: binding is disabled
        assert any("bound to OS proc set {disabled}" in line for line in lines), lines
    (rank,) = processes(data, "rank")
    assert [(r["name"], r["threads"], r["threads_from"]) for r in rank["runtimes"]] == [
        (runtime, 2, "OMP_NUM_THREADS")]  # one runtime in the process: no libgomp
    f = findings(data)["kmp-affinity-disabled"]
    assert f["severity"] == "error" and code == 1
    assert len(rank["threads"]) >= 2  # the main thread and the runtime's worker
    for t in rank["threads"]:
        assert parse_cpulist(t["allowed"]) == own_threads[t["tid"]] == CPUS  # unbound


def test_kmp_affinity_binds_libiomp5_but_libgomp_ignores_it(tmp_path: Path) -> None:
    """The same KMP_AFFINITY pins libiomp5's threads and does nothing to torch's libgomp threads."""
    require_torch()
    need(len(CPUS) >= 2, "needs at least 2 allowed CPUs")
    kmp = {"KMP_AFFINITY": "granularity=fine,compact", "OMP_NUM_THREADS": "2"}
    binary = spin_binary(tmp_path, "iomp5")
    with running([str(binary), "600"], job_env(**kmp)) as (_proc, lines):
        pid = int(lines[-1].split()[1])
        _, intel = audit(pid, 0.5)
    (rank,) = processes(intel, "rank")
    assert all(len(parse_cpulist(t["allowed"])) == 1 for t in rank["threads"])  # libiomp5 bound each thread
    assert "kmp-ignored-by-libgomp" not in findings(intel)

    script = tmp_path / "job.py"
    script.write_text(TORCH_JOB)
    with running([sys.executable, str(script), "600"], job_env(WORKERS="0", **kmp)) as (_proc, lines):
        pid = int(lines[-1].split()[1])
        time.sleep(0.5)  # let the matmul loop run parallel regions
        code, gnu = audit(pid, 0.5)
    (rank,) = processes(gnu, "rank")
    assert [r["name"] for r in rank["runtimes"] if r["user_api"] == "openmp"] == ["libgomp"]
    assert all(parse_cpulist(t["allowed"]) == CPUS for t in rank["threads"])  # nothing was bound
    f = findings(gnu)["kmp-ignored-by-libgomp"]
    assert code == 1 and f["severity"] == "warning" and "KMP_AFFINITY=granularity=fine,compact" in f["message"]
    assert not [x for x in findings(gnu) if x.startswith("kmp-affinity") or x == "collapse-risk"]


# ----------------------------------------------------------------------------- torchrun jobs
RANK_JOB = TORCH_JOB.replace('f"READY {os.getpid()}\\n"', 'f"READY {os.getpid()} {os.environ[\'LOCAL_RANK\']}\\n"')


def audit_two_rank_job(argv: list[str], env: dict[str, str]) -> tuple[
        int, dict[str, Any], list[int], dict[int, frozenset[int]]]:
    """Run a 2-rank torchrun job until both ranks are READY; return the audit, the rank PIDs and their masks."""
    with running(argv, env, ready=2) as (proc, lines):
        # the masks first: the audit can take long on 2 oversubscribed CPUs, and they do not change after READY
        rank_pids = sorted(int(x.split()[1]) for x in lines if x.startswith("READY"))
        kernel = {p: kernel_mask(p) for p in rank_pids}
        try:
            code, data = audit(proc.pid)
        finally:
            kill_all(rank_pids)  # torchrun starts ranks in sessions of their own: killing the job's session misses them
    return code, data, rank_pids, kernel


def test_plain_torchrun_ranks_overlap_and_oversubscribe(tmp_path: Path) -> None:
    require_torch()
    need(len(CPUS) >= 2, "needs at least 2 allowed CPUs")
    script = tmp_path / "job.py"
    script.write_text(RANK_JOB)
    argv = torchrun_argv("--nproc-per-node", "2", "--standalone", str(script), "60")
    code, data, rank_pids, kernel = audit_two_rank_job(argv, job_env(OMP_NUM_THREADS=str(len(CPUS)), WORKERS="0"))
    assert code == 1
    ranks = processes(data, "rank")
    assert sorted(r["pid"] for r in ranks) == rank_pids
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert kernel[rank_pids[0]] & kernel[rank_pids[1]]  # the kernel agrees: they overlap
    found = findings(data)
    assert found["rank-overlap"]["severity"] == "warning"
    over = found["omp-oversubscribed"]
    assert over["severity"] == "error" and f"× 2 ranks = {2 * len(CPUS)} threads" in over["message"]
    assert "rank 0" in over["subject"] and "rank 1" in over["subject"]  # one finding for both ranks
    assert processes(data, "launcher")  # torchrun's agent


def test_clean_affrun_torchrun_job_has_no_findings(tmp_path: Path) -> None:
    require_torch()
    need(len(CPUS) >= 2, "needs at least 2 allowed CPUs")
    script = tmp_path / "job.py"
    script.write_text(RANK_JOB)
    argv = affrun_argv("torchrun", "--nproc-per-node", "2", "--standalone", str(script), "60")
    code, data, rank_pids, kernel = audit_two_rank_job(argv, job_env())
    # a main thread that waited for its CPU (cpu-starved) depends on the machine's load and on its own workers,
    # which share its one CPU here: it is measured, never caused by a collapse
    waited = [f for f in data["findings"] if f["id"] == "cpu-starved"]
    assert [f for f in data["findings"] if f not in waited] == [] and all("(collapse: " not in f["message"] for f in waited)
    assert code == (1 if any(f["severity"] != "info" for f in waited) else 0)
    ranks = sorted(processes(data, "rank"), key=lambda r: r["pid"])
    assert [r["pid"] for r in ranks] == rank_pids
    owned = [parse_cpulist(r["owned_cpus"]) for r in ranks]
    assert owned == [kernel[p] for p in rank_pids]  # AFFRUN_CPUS is the mask the kernel holds
    assert not owned[0] & owned[1]
    for rank, cpus in zip(ranks, owned):
        assert all(parse_cpulist(t["allowed"]) <= cpus for t in rank["threads"])
        children = [c for c in processes(data, "child") if c["rank_pid"] == rank["pid"]]
        assert len(children) == 2 and all(c["comm"] == "pt_data_worker" for c in children)
        assert all(parse_cpulist(t["allowed"]) == cpus for c in children for t in c["threads"])
    assert data["gpus"]["available"] in (True, False) and data["gpus"]["reason"]


# ----------------------------------------------------------------------------- the analysis, on stated records
def record(pid: int, ppid: int, masks: list[set[int]], environ: dict[str, str] | None = None,
           comm: str = "python3") -> ProcessRecord:
    p = ProcessRecord(pid, ppid, comm, [comm], environ or {})
    for i, mask in enumerate(masks):
        tid = pid if i == 0 else pid * 100 + i
        p.threads[tid] = ThreadRecord(tid, comm, frozenset(mask), min(mask))
    return p


def test_planned_loader_cpus_are_not_a_collapse() -> None:
    env = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "AFFRUN_CPUS": "0-7", "AFFRUN_LOADER_CPUS": "7"}
    rank = record(10, 1, [set(range(7))], env)
    workers = [record(11 + i, 10, [{7}], env, "pt_data_worker") for i in range(2)]
    job = JobAudit(10, 1.0, 0.05, 20, [rank, *workers], GpuReport(False, "n/a"), frozenset(range(8)))
    assign_roles(job)
    assert collapse_findings(job, rank) == []
    for w in workers:
        w.threads = {w.pid: ThreadRecord(w.pid, "pt_data_worker", frozenset({0}), 0)}
    assert [f.id for f in collapse_findings(job, rank)] == ["collapse"]


def test_worker_init_fn_spread_is_not_a_collapse() -> None:
    rank = record(10, 1, [{0}, {1}, {2}, {3}])
    workers = [record(11 + i, 10, [{i}], comm="pt_data_worker") for i in range(4)]
    job = JobAudit(10, 1.0, 0.05, 20, [rank, *workers], GpuReport(False, "n/a"), frozenset(range(4)))
    assign_roles(job)
    assert rank.owned == frozenset(range(4)) and collapse_findings(job, rank) == []
    assert format_cpulist(rank.mask) == "0-3"


def test_gpu_utilisation_through_nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from launcher.doctor.gpu import GpuSampler, GpuUsage
    from launcher.doctor.job_checks import gpu_findings

    fake = fake_pynvml(monkeypatch, tmp_path, [("00000000:18:00.0", "GPU-a")])
    sampler = GpuSampler()
    for util in (5, 10, 0, 15, 10, 0):
        nvml_state(tmp_path, {"utilisation": [util], "processes": [[10, 999]]})
        sampler.sample({10, 11})
    report = sampler.report()
    assert report.available and report.reason == "NVIDIA driver 575.57.08" and fake.SHUTDOWNS == 1
    (gpu,) = report.gpus
    assert (gpu.pci, gpu.name, gpu.pids, gpu.memory_used_mib) == ("00000000:18:00.0", "NVIDIA H200", {10}, 3072)
    assert gpu.mean_utilisation == pytest.approx(40 / 6) and gpu.uuid == "GPU-a"
    job = JobAudit(10, 1.0, 0.05, 6, [], report, frozenset({0}))
    (f,) = gpu_findings(job)
    assert f.id == "gpu-low-utilisation" and "7% busy" in f.message
    job.gpus = GpuReport(True, "x", [GpuUsage(0, "p", "n", [90] * 6, 1, {10})])  # a busy GPU is fine
    assert gpu_findings(job) == []


def test_gpu_not_available_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.doctor.gpu import GpuSampler

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails, as without nvidia-ml-py
    report = GpuSampler().report()
    assert not report.available and report.reason.startswith("not available (nvidia-ml-py is not installed")
    if not os.path.exists("/dev/nvidiactl"):
        monkeypatch.delitem(sys.modules, "pynvml")
        try:
            import pynvml  # noqa: F401
        except ImportError:
            return
        real = GpuSampler().report()  # the real library, no driver on this machine
        assert not real.available and real.reason.startswith("not available")


# ----------------------------------------------------------------------------- runtime controllers
def test_ancestors_are_the_real_parent_chain() -> None:
    """procfs.ancestors walks a real chain: python child <- sh <- this test process, nearest first, no init."""
    from launcher.base.procfs import ancestors

    child = "import os, time; print(os.getpid(), flush=True); time.sleep(30)"
    shell = subprocess.Popen(["sh", "-c", '"$0" -c "$1"; :', sys.executable, child],
                             stdout=subprocess.PIPE, text=True)
    assert shell.stdout is not None
    pid = int(shell.stdout.readline())
    try:
        chain = ancestors(pid)
        assert chain[0][0] == shell.pid and chain[0][1].startswith("sh -c ")
        assert chain[1] == (os.getpid(), " ".join(Path(f"/proc/{os.getpid()}/cmdline").read_bytes().decode()
                                                  .split("\0")).strip())
        assert all(p > 1 for p, _ in chain)
        assert ancestors(pid, limit=1) == chain[:1]
    finally:
        os.kill(pid, signal.SIGKILL)
        shell.wait()


def test_runtimes_recognised_by_library_name() -> None:
    from launcher.context.runtimes import identify, runtimes_from_paths

    paths = ["/x/torch/lib/libgomp-a34b3233.so.1", "/usr/lib/libgomp.so.1", "/p/lib/libiomp5.so",
             "/p/lib/libiompstubs5.so", "/c/lib/libomp.so.5", "/c/lib/libomptarget.so",
             "/n/numpy.libs/libscipy_openblas64_-32a4b2a6.so", "/o/libopenblasp-r0-15028c96.3.21.so",
             "/m/libmkl_rt.so.2", "/m/libmkl_intel_thread.so.2", "/m/libmkl_core.so.2", "/lib/libc.so.6"]
    assert [(c.name, p.rsplit("/", 1)[1]) for c, p in identify(paths)] == [
        ("libgomp", "libgomp-a34b3233.so.1"), ("libgomp", "libgomp.so.1"), ("libiomp5", "libiomp5.so"),
        ("libomp", "libomp.so.5"), ("openblas", "libscipy_openblas64_-32a4b2a6.so"),
        ("openblas", "libopenblasp-r0-15028c96.3.21.so"), ("mkl", "libmkl_rt.so.2")]
    env = {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "2"}
    found = {r.name: r for r in runtimes_from_paths(paths, env, 8)}
    assert (found["mkl"].threads, found["mkl"].threads_from, found["mkl"].detail) == (
        2, "MKL_NUM_THREADS", "threading layer intel_thread")
    assert (found["openblas"].threads, found["openblas"].threads_from) == (3, "OMP_NUM_THREADS")
    assert runtimes_from_paths(paths[:1], {}, 8)[0].threads_from == "default (8 CPUs)"


def test_thread_counts_asked_from_the_loaded_libraries() -> None:
    """ensure_affinity's report: in-process counts come from the libraries themselves (numpy's OpenBLAS, torch's
    libgomp), in the order /proc/self/maps lists them."""
    require_torch()
    code = ("import json, numpy, torch; torch.set_num_threads(1); from launcher import ensure_affinity; "
            "from launcher.base.procfs import libraries; paths = libraries(); "
            "found = ensure_affinity(policy='keep', warn=False).runtimes; "
            "assert [r.path for r in found] == sorted((r.path for r in found), key=paths.index), found; "
            "print(json.dumps({r.name: [r.threads, r.threads_from] for r in found}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=clean_env(OPENBLAS_NUM_THREADS="1"))
    counts = json.loads(done.stdout)
    assert counts["libgomp"] == [1, "runtime"]  # torch.set_num_threads(1) went to libgomp
    assert counts["openblas"] == [1, "runtime"]


def test_another_process_is_read_from_its_maps_without_threadpoolctl() -> None:
    """doctor --pid names another process's runtimes from its /proc/PID/maps, with the count its environment
    configures: it imports no threadpoolctl, which can only ask the doctor's own process."""
    job = "import numpy, os, time; os.write(1, f'READY {os.getpid()}\\n'.encode()); time.sleep(600)"
    probe = ("import sys; from launcher.main import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
             "print('threadpoolctl' in sys.modules, file=sys.stderr)")
    with running([sys.executable, "-c", job], job_env(OPENBLAS_NUM_THREADS="1")) as (_proc, lines):
        argv = ["doctor", "--pid", lines[-1].split()[1], "--duration", "0.2", "--json"]
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)
    assert done.stderr.splitlines()[-1] == "False", done.stderr[-3000:]
    found = [(r["name"], r["threads"], r["threads_from"]) for p in json.loads(done.stdout)["processes"]
             for r in p["runtimes"]]
    assert found == [("openblas", 1, "OPENBLAS_NUM_THREADS")]


# ------------------------------------------------------------------ hostile --pid targets and durations
def _refused(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, no traceback, exactly one ``affrun: error:`` line holding ``needles``."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("affrun: error:")]
    assert proc.returncode == 2 and len(errors) == 1, (proc.returncode, proc.stderr[-3000:])
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


@contextmanager
def sleeper(seconds: float = 120) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"], env=clean_env())
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.parametrize(("option", "value"), [
    ("--duration", "nan"), ("--duration", "NaN"), ("--duration", "inf"), ("--duration", "-inf"),
    ("--duration", "1e400"), ("--duration", "-1"), ("--duration", "-0.5"), ("--duration", "1e300"),
    ("--duration", "1e9"), ("--duration", "1_0"), ("--duration", "٣"), ("--duration", ""), ("--duration", "two"),
    ("--interval", "nan"), ("--interval", "inf"), ("--interval", "0"), ("--interval", "-0.05"),
    ("--interval", "1e300"), ("--interval", "1e-9"),
])
def test_durations_out_of_range_are_one_error_line(option: str, value: str) -> None:
    with sleeper() as target:
        extra = [] if option == "--duration" else ["--duration", "0.2"]
        proc = run(affrun_argv("doctor", "--pid", str(target.pid), *extra, option, value), timeout=120)
    _refused(proc, option)


def test_a_job_that_ends_ends_the_sample() -> None:
    """--duration 300 on a job that lives about a second: doctor returns once it has ended, with what it saw."""
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"], env=clean_env())
    try:
        start = STALLS.running_seconds()
        proc = run(affrun_argv("doctor", "--pid", str(job.pid), "--duration", "300", "--json"), timeout=240)
        took = STALLS.running_seconds() - start
    finally:
        job.kill()
        job.wait(timeout=30)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["duration_s"] < 150 and took < 200, (data["duration_s"], took)
    assert [p["alive"] for p in data["processes"] if p["pid"] == job.pid] == [False]


def _wait_state(pid: int, state: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != state:
        assert time.monotonic() < deadline, f"pid {pid} never reached state {state}"
        time.sleep(0.05)


def test_a_zombie_is_reported_as_exited() -> None:
    """A child this test has not reaped yet is a zombie: it has exited, whatever /proc still lists. doctor --pid
    and show --pid say so alike (from the one reader of its state, its stat's Z), and neither says it ran on a
    CPU during the sample: its stat keeps the CPU it last ran on, before it exited."""
    zombie = subprocess.Popen(["true"])
    try:
        _wait_state(zombie.pid, "Z")
        as_json = run(affrun_argv("doctor", "--pid", str(zombie.pid), "--duration", "300", "--json"), timeout=240)
        as_text = run(affrun_argv("doctor", "--pid", str(zombie.pid), "--duration", "300"), timeout=240)
        shown = run(affrun_argv("show", "--pid", str(zombie.pid), "--duration", "300"), timeout=240)
    finally:
        zombie.wait(timeout=30)
    assert as_json.returncode in (0, 1), as_json.stderr[-3000:]
    data = json.loads(as_json.stdout)
    assert [p["alive"] for p in data["processes"]] == [False]
    assert [t["ran"] for p in data["processes"] for t in p["threads"]] in ([], [""]), data["processes"]
    assert data["duration_s"] < 150  # nothing to wait for: the job has already ended
    head = [line for line in as_text.stdout.splitlines() if f"pid {zombie.pid} " in line]
    assert head and "(exited)" in head[0], as_text.stdout
    assert "the job exited, which ended the sample" in as_text.stdout
    assert shown.returncode == 0, shown.stderr[-3000:]
    picture = " ".join(shown.stdout.split())  # the header wraps
    assert "the job exited, which ended the sample" in picture, shown.stdout
    assert f"(pid {zombie.pid}) (exited):" in picture, shown.stdout
    assert "no thread of the job ran here" in picture and " main thread " not in picture, shown.stdout


def _kernel_thread() -> int | None:
    """A process with the kernel's PF_KTHREAD flag (``stat`` field 9), where this pid namespace shows one."""
    for entry in sorted(Path("/proc").iterdir(), key=lambda p: (len(p.name), p.name)):
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[6]) & 0x00200000:
            return int(entry.name)
    return None


def test_a_kernel_thread_is_one_error() -> None:
    pid = _kernel_thread()
    need(pid is not None, "no kernel thread is visible in this pid namespace")
    _refused(run(affrun_argv("doctor", "--pid", str(pid), "--duration", "0.2"), timeout=120), "kernel thread")


def test_a_thread_id_is_one_error_naming_its_process() -> None:
    code = ("import os, threading; e = threading.Event(); t = threading.Thread(target=e.wait); t.start(); "
            "os.write(1, f'READY {t.native_id}\\n'.encode()); e.wait()")
    with running([sys.executable, "-c", code], clean_env()) as (proc, lines):
        tid = int(next(x for x in lines if x.startswith("READY")).split()[1])
        assert tid != proc.pid and Path(f"/proc/{tid}").exists()
        result = run(affrun_argv("doctor", "--pid", str(tid), "--duration", "0.2"), timeout=120)
    _refused(result, f"--pid {tid}", f"process {proc.pid}")


@pytest.mark.parametrize("command", ["doctor", "show"])
def test_an_audit_of_its_own_shell_leaves_itself_out(command: str) -> None:
    """``affrun doctor --pid $$`` (and ``show --pid $$``) from a shell: the shell is the job; the doctor, a child
    of it, is not one of the job's processes."""
    argv = " ".join(a if a == "$$" else shlex.quote(a)
                    for a in affrun_argv(command, "--pid", "$$", "--duration", "0.2", *(["--json"] if command == "doctor" else [])))
    proc = run(["sh", "-c", f"{argv}; echo shell=$$"], env=clean_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    shell = int(proc.stdout.rsplit("shell=", 1)[1])
    if command == "doctor":
        data = json.loads(proc.stdout.rsplit("shell=", 1)[0])
        assert [p["pid"] for p in data["processes"]] == [shell], data["processes"]
    else:
        assert f"affrun show --pid {shell} · 1 rank(s), 1 process(es) ·" in proc.stdout, proc.stdout


def test_a_big_job_is_sampled_less_often_so_the_sampler_costs_it_a_bounded_share() -> None:
    """A process of 400 threads costs the sampler milliseconds a sample; asked for a sample every 5 ms, the doctor
    samples less often (its CPU time within 5% of one CPU), and says so."""
    job = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                            "e = threading.Event()\n"
                            "[threading.Thread(target=e.wait, daemon=True).start() for _ in range(400)]\n"
                            "print('READY', flush=True); time.sleep(120)"],
                           stdout=subprocess.PIPE, text=True, env=clean_env())
    try:
        assert job.stdout is not None and job.stdout.readline().startswith("READY")
        doctor = run(affrun_argv("doctor", "--pid", str(job.pid), "--duration", "2", "--interval", "0.005",
                                 "--json"), timeout=120)
        assert doctor.returncode in (0, 1), doctor.stderr
        data = json.loads(doctor.stdout)
        assert data["slowed"] is True
        assert data["samples"] < 2 / 0.005 / 2  # far fewer than the 400 asked for
        text = run(affrun_argv("doctor", "--pid", str(job.pid), "--duration", "1", "--interval", "0.005"),
                   timeout=120)
        assert "less often to keep the sampler under 5% of a CPU" in text.stdout, text.stdout
    finally:
        job.kill()
        job.wait()
