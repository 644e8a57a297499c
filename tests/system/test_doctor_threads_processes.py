"""``affrun doctor --pid`` and ``affrun show --pid`` on every thread of a rank (issue 33, part 4), with real
processes: a Python rank that carries the ``AFFRUN_*`` variables a plan gives it and applies its mask at start
(as ``affrun exec`` does), real threads named with ``prctl(PR_SET_NAME)`` as torch and NCCL name theirs, each
pinned with ``os.sched_setaffinity``, a forked child named ``pt_data_worker`` as a DataLoader worker, and libgomp's
own team bound to ``OMP_PLACES``. Busy threads hash a MiB at a time, which releases the GIL: they really run at
once. Every mask and CPU asserted is one of the CPUs this test may use.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from launcher.base.cpulist import format_cpulist, parse_cpulist
from tests.conftest import need
from tests.launch import affrun_argv, clean_env, compile_omp, run
from tests.system.test_doctor_live import SPIN_C, _kernel_thread, _refused, audit, findings, job_env, running
from tests.system.test_untrusted_text import assert_clean, escaped

pytestmark = pytest.mark.slow
CPUS = sorted(os.sched_getaffinity(0))

JOB = r"""
import ctypes, hashlib, json, multiprocessing, os, queue, sys, threading, time
spec = json.loads(sys.argv[1])
libc = ctypes.CDLL(None)
for library in spec.get("libraries", []):
    ctypes.CDLL(library)  # mapped, as a framework's library would be

def named(name):
    libc.prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME, as torch and NCCL name their threads

def work(busy):
    data = b"x" * (1 << 20)
    while busy:
        hashlib.sha256(data).digest()  # releases the GIL
    time.sleep(3600)

def thread(i, t, up):
    named(t["name"])
    if t.get("cpus") is not None:
        os.sched_setaffinity(0, t["cpus"])
    up.put((i, threading.get_native_id()))
    work(t.get("busy", False))

def start(threads):
    up = queue.Queue()
    for i, t in enumerate(threads):
        threading.Thread(target=thread, args=(i, t, up), daemon=True).start()
    return [tid for _, tid in sorted(up.get() for _ in threads)]  # in the order of the spec

def worker(w, done):
    named("pt_data_worker")
    os.sched_setaffinity(0, w["cpus"])
    done.put((os.getpid(), start(w.get("threads", []))))
    work(False)

if __name__ == "__main__":
    os.sched_setaffinity(0, spec["mask"])  # what affrun applied at start
    context = multiprocessing.get_context("fork")
    done = context.Queue()
    for w in spec.get("workers", []):
        context.Process(target=worker, args=(w, done), daemon=True).start()
    workers = dict(done.get() for _ in spec.get("workers", []))
    if spec.get("later") is not None:
        os.sched_setaffinity(0, spec["later"])  # after start: another binder's call in the main thread
    tids = start(spec.get("threads", []))
    os.write(1, f"READY {os.getpid()} {json.dumps({'threads': tids, 'workers': workers})}\n".encode())
    work(spec.get("busy_main", False))
"""


def two_cpus() -> tuple[int, int]:
    need(len(CPUS) >= 2, "needs 2 allowed CPUs")
    return CPUS[0], CPUS[1]


def rank_env(cpus: list[int], compute: list[int] | None = None, loader: list[int] | None = None,
             main: list[int] | None = None, threads: int = 1, **extra: str) -> dict[str, str]:
    """The variables a plan gives local rank 0 (launcher.env.variables), written here by hand."""
    env = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "AFFRUN_LOCAL_RANK": "0", "AFFRUN_LOCAL_WORLD_SIZE": "1",
           "AFFRUN_CPUS": format_cpulist(cpus), "AFFRUN_COMPUTE_CPUS": format_cpulist(compute or cpus),
           "AFFRUN_LOADER_CPUS": format_cpulist(loader or []), "AFFRUN_THREADS": str(threads), **extra}
    if main:
        env["AFFRUN_MAIN_CPUS"] = format_cpulist(main)
    return job_env(**env)


def audit_job(tmp_path: Path, spec: dict[str, Any], env: dict[str, str], duration: float = 1.5,
              argv: list[str] | None = None) -> tuple[int, dict[str, Any], int, dict[str, Any]]:
    """Run the job until READY, audit it: (exit status, the JSON report, the rank's pid, what it printed)."""
    script = tmp_path / "job.py"
    script.write_text(JOB)
    with running(argv or [sys.executable, str(script), json.dumps(spec)], env) as (_proc, lines):
        ready = next(x for x in lines if x.startswith("READY")).split(" ", 2)
        code, data = audit(int(ready[1]), duration)
    return code, data, int(ready[1]), json.loads(ready[2])


def _shared_object(path: Path) -> Path:
    """A real shared object at ``path`` (a library a framework would map)."""
    need(shutil.which("gcc"), "gcc is not installed")
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_suffix(".c")
    src.write_text("int affrun_test_symbol(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(src)], check=True)
    return path


def process(data: dict[str, Any], pid: int) -> dict[str, Any]:
    return next(p for p in data["processes"] if p["pid"] == pid)


def thread(data: dict[str, Any], pid: int, tid: int) -> dict[str, Any]:
    return next(t for t in process(data, pid)["threads"] if t["tid"] == tid)


def test_a_job_whose_threads_are_all_home(tmp_path: Path) -> None:
    a, b = two_cpus()
    spec = {"mask": [a, b],
            "threads": [{"name": "pt_data_pin", "cpus": [b]}, {"name": "NCCL Progress 0"}, {"name": "helper"},
                        {"name": "PTThreadPool"}],
            "workers": [{"cpus": [b], "threads": [{"name": "cv-pool-0", "busy": True}]}]}
    _, data, pid, ready = audit_job(tmp_path, spec, rank_env([a, b], compute=[a], loader=[b]))
    pin, nccl, helper, interop = ready["threads"]
    (worker_pid, _), = ready["workers"].items()
    rank = process(data, pid)
    assert rank["plan_source"] == "its AFFRUN_* variables" and rank["thread_plan"]["workers_seen"] == 1
    assert rank["thread_plan"]["pin_memory"]["cpus"] == str(b)
    roles = {t["tid"]: (t["role"], t["identified_by"], t["home"], t["verdict"]) for t in rank["threads"]}
    assert roles[pid] == ("main", "tid", format_cpulist([a, b]), "home")
    assert roles[pin] == ("pin_memory", "name", str(b), "home")
    assert roles[nccl][:2] == ("nccl_proxy", "name") and roles[interop][:2] == ("interop", "name")
    assert roles[helper][:3] == ("unknown", "none", format_cpulist([a, b]))  # the union of the pool homes
    worker = process(data, int(worker_pid))
    assert worker["worker"] == {"index": 0, "cpus": str(b), "pools": 1, "of": 1, "matched_by": "mask"}
    assert all(t["role"] == "worker" and t["home"] == str(b) for t in worker["threads"])
    every = [t for p in (rank, worker) for t in p["threads"]]
    assert {t["verdict"] for t in every} == {"home"}
    assert all(parse_cpulist(t["ran"]) <= parse_cpulist(t["home"]) for t in every)
    assert rank["thread_summary"]["verdicts"] == {"home": len(rank["threads"])}
    ids = findings(data)
    assert not {"thread-strayed", "mask-changed-after-start", "pool-oversubscribed", "main-off-priority"} & set(ids)


def test_openmp_team_threads_are_told_by_their_place(tmp_path: Path) -> None:
    """libgomp binds team thread 1 to the second place of OMP_PLACES: doctor tells it by that mask."""
    a, b = two_cpus()
    binary = compile_omp(tmp_path, "gomp", _spin_source(tmp_path))
    env = rank_env([a, b], threads=2, OMP_NUM_THREADS="2", OMP_PROC_BIND="close",
                   OMP_PLACES=f"{{{a},{b}}},{{{b}}}")
    with running([str(binary), "600"], env) as (_proc, lines):
        pid = int(lines[-1].split()[1])
        _, data = audit(pid, 1.0)
        masks = {int(t): frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{pid}/task")}
    team = [tid for tid, mask in masks.items() if tid != pid and mask == {b}]
    assert team, masks  # the runtime itself bound a team thread to the second place
    for tid in team:
        t = thread(data, pid, tid)
        assert (t["role"], t["identified_by"], t["verdict"]) == ("omp", "place", "home")


def _spin_source(tmp_path: Path) -> Path:
    src = tmp_path / "spin.c"
    src.write_text(SPIN_C)
    return src


def test_a_thread_that_strays(tmp_path: Path) -> None:
    a, b = two_cpus()
    spec = {"mask": [a, b], "threads": [{"name": "pt_data_pin", "cpus": [a], "busy": True}]}
    code, data, pid, ready = audit_job(tmp_path, spec, rank_env([a, b], compute=[a], loader=[b]))
    (pin,) = ready["threads"]
    t = thread(data, pid, pin)
    assert (t["role"], t["home"], t["verdict"], t["ran"], t["strayed_to"]) == (
        "pin_memory", str(b), "strayed", str(a), str(a))
    stray = findings(data)["thread-strayed"]
    assert code == 1 and stray["severity"] == "warning"  # inside the rank's CPUs
    assert f"tid {pin} (pt_data_pin, pin_memory) ran on CPUs {a}, outside its home {b}" in stray["message"]
    assert "--rank-hooks auto" in stray["fix"] and stray["subject"].startswith("rank 0")


def test_a_mask_changed_after_start_names_tensorrt_llm(tmp_path: Path) -> None:
    """TensorRT-LLM's configure_cpu_affinity() widens a mask it did not set (NVIDIA/srt-slurm #326): the rank was
    given one CPU, a library named like TensorRT-LLM's is mapped, and the main thread's mask becomes every CPU."""
    a, _ = two_cpus()
    library = _shared_object(tmp_path / "tensorrt_llm" / "libs" / "libtensorrt_llm.so")
    spec = {"mask": [a], "later": CPUS, "libraries": [str(library)], "threads": [{"name": "executor"}]}
    code, data, pid, ready = audit_job(tmp_path, spec, rank_env([a]))
    changed = findings(data)["mask-changed-after-start"]
    main = thread(data, pid, pid)
    assert code == 1 and changed["severity"] == "error"  # the mask reaches CPUs the rank was not given
    assert f"tid {pid} ({main['comm']}, main) may run on CPUs {format_cpulist(CPUS)}" in changed["message"]
    assert f"tid {ready['threads'][0]} (executor, unknown)" in changed["message"]  # it inherited the mask
    assert f"TensorRT-LLM is loaded ({os.path.realpath(library)})" in changed["message"]
    assert "TLLM_NUMA_AWARE_WORKER_AFFINITY is unset" in changed["message"]
    assert changed["env_fix"] == {"TLLM_NUMA_AWARE_WORKER_AFFINITY": "0"}


def test_a_mask_set_by_a_taskset_ancestor_is_named(tmp_path: Path) -> None:
    a, b = two_cpus()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    spec = json.dumps({"mask": [b]})  # the job keeps what taskset gave it: CPU b, where the plan says a
    argv = ["sh", "-c", 'taskset -c "$1" "$2" "$3" "$4"; :', "sh", str(b), sys.executable, str(script), spec]
    need(shutil.which("taskset"), "taskset is not installed")
    _, data, _, _ = audit_job(tmp_path, {}, rank_env([a]), argv=argv)
    changed = findings(data)["mask-changed-after-start"]
    assert changed["severity"] == "error" and "taskset in the parent process" in changed["message"]
    assert "drop taskset" in changed["fix"]


def test_no_binder_named_without_evidence(tmp_path: Path) -> None:
    a, b = two_cpus()
    spec = {"mask": [a, b], "threads": [{"name": "mine", "cpus": [b]}]}  # one CPU of the rank's: no home's mask
    _, data, _, ready = audit_job(tmp_path, spec, rank_env([a, b], compute=[a, b], threads=2))
    changed = findings(data)["mask-changed-after-start"]
    assert changed["severity"] == "info"  # inside its home: the union of the rank's pool homes
    assert f"tid {ready['threads'][0]} (mine, unknown) may run on CPUs {b}" in changed["message"]
    assert "no binder was identified" in changed["message"]


def test_a_worker_whose_pool_is_larger_than_its_cpus(tmp_path: Path) -> None:
    """4 busy pool threads on the worker's 1 CPU: more than the CPU and multiprocessing's 2 helper threads."""
    a, b = two_cpus()
    pool = [{"name": f"cv-pool-{i}", "busy": True} for i in range(4)]
    spec = {"mask": [a, b], "workers": [{"cpus": [b], "threads": pool}]}
    env = rank_env([a, b], compute=[a], loader=[b], OPENCV_FOR_THREADS_NUM="4",
                   AFFRUN_USER_POOLS="OPENCV_FOR_THREADS_NUM", AFFRUN_ENV_POLICY="keep")
    code, data, pid, ready = audit_job(tmp_path, spec, env, duration=2.0)
    (worker_pid, tids), = ready["workers"].items()
    over = [f for f in data["findings"] if f["id"] == "pool-oversubscribed"]
    busy = next(f for f in over if f["message"].startswith("a pool ran more busy threads"))
    assert code == 1 and busy["severity"] == "warning" and busy["subject"] == f"rank 0 (pid {pid})"
    assert f"DataLoader worker 0 of 1 (pid {worker_pid}): 4 busy threads besides its main one" in busy["message"]
    assert f"on 1 CPU(s) ({b}): tids " in busy["message"]
    assert all(f"{tid} cv-pool-" in busy["message"] for tid in tids)
    assert "your OPENCV_FOR_THREADS_NUM=4" in busy["message"] and "cv2.setNumThreads" in busy["fix"]
    variable = next(f for f in over if f["message"].startswith("OPENCV_FOR_THREADS_NUM=4"))
    assert "your value (AFFRUN_USER_POOLS), kept under --env-policy keep" in variable["message"]
    assert variable["env_fix"] == {"OPENCV_FOR_THREADS_NUM": "1"} and "drop --env-policy keep" in variable["fix"]
    assert int(worker_pid) in {p["pid"] for p in data["processes"] if p["worker"]}


@pytest.mark.parametrize("pinned", [True, False])
def test_a_main_thread_off_its_own_core(tmp_path: Path, pinned: bool) -> None:
    """AFFRUN_MAIN_CPUS gives the main thread CPU a; it runs pinned to b, or is left on the rank's whole set."""
    a, b = two_cpus()
    spec = {"mask": [a, b], "later": [b] if pinned else None, "busy_main": pinned}
    code, data, pid, _ = audit_job(tmp_path, spec, rank_env([a, b], main=[a], threads=1))
    off = findings(data)["main-off-priority"]
    assert code == 1 and off["severity"] == "warning" and off["subject"].startswith("rank 0")
    assert f"the main thread (tid {pid}) has CPUs {a} of its own (AFFRUN_MAIN_CPUS)" in off["message"]
    if pinned:
        assert f"but ran on CPUs {b}" in off["message"]
    else:
        assert f"may run on CPUs {b}" in off["message"] or f"ran on CPUs {b}" in off["message"]
    assert process(data, pid)["thread_plan"]["main"] == {
        "role": "main", "cpus": str(a), "threads": 1, "pinned": True, "why": "a core of its own"}


EVIL = "ev\x1b[31m\nil\u202e"  # 13 bytes: the kernel keeps 15


def test_escaped_thread_names(tmp_path: Path) -> None:
    a, b = two_cpus()
    spec = {"mask": [a], "threads": [{"name": EVIL, "cpus": [b], "busy": True}]}
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = rank_env([a])
    with running([sys.executable, str(script), json.dumps(spec)], env) as (_proc, lines):
        ready = next(x for x in lines if x.startswith("READY")).split(" ", 2)
        pid, tid = int(ready[1]), json.loads(ready[2])["threads"][0]
        text = run(affrun_argv("doctor", "--pid", str(pid), "--duration", "1"), timeout=120)
        _, data = audit(pid, 1.0)
    assert text.returncode == 1, text.stderr[-3000:]
    assert_clean(text.stdout)
    assert f"{tid} unknown    {escaped(EVIL)}" in text.stdout  # its line in the thread table
    assert thread(data, pid, tid)["comm"] == EVIL  # JSON keeps the exact name
    stray = findings(data)["thread-strayed"]
    assert f"({EVIL}, unknown)" in stray["message"] and stray["severity"] == "error"
    line = next(x for x in text.stdout.splitlines() if x.startswith("error   thread-strayed"))
    assert f"({escaped(EVIL)}, unknown)" in line


def test_thousands_of_threads_are_summarised(tmp_path: Path) -> None:
    a, b = two_cpus()
    spec = {"mask": [a, b], "threads": [{"name": f"t{i}"} for i in range(300)]}
    script = tmp_path / "job.py"
    script.write_text(JOB)
    with running([sys.executable, str(script), json.dumps(spec)], rank_env([a, b])) as (_proc, lines):
        pid = int(next(x for x in lines if x.startswith("READY")).split()[1])
        text = run(affrun_argv("doctor", "--pid", str(pid), "--duration", "0.3"), timeout=120)
    rows = [x for x in text.stdout.splitlines() if re.match(rf"\s*{pid}\s", x)]
    assert len(rows) == 25, rows  # 24 threads, then one line that counts the rest
    assert re.search(r"\.\.\. 277 more thread\(s\): 277 unknown home", rows[-1]), rows[-1]


# ----------------------------------------------------------------------------- affrun show --pid
def test_show_pid_draws_where_threads_ran_with_strays(tmp_path: Path) -> None:
    a, b = two_cpus()
    spec = {"mask": [a, b], "threads": [{"name": "pt_data_pin", "cpus": [a], "busy": True}]}
    script = tmp_path / "job.py"
    script.write_text(JOB)
    picture = tmp_path / "live.svg"
    with running([sys.executable, str(script), json.dumps(spec)], rank_env([a, b], compute=[a], loader=[b])) as (
            _proc, lines):
        pid = int(next(x for x in lines if x.startswith("READY")).split()[1])
        text = run(affrun_argv("show", "--pid", str(pid), "--duration", "1", "--no-color", "--svg", str(picture)),
                   timeout=120)
    assert text.returncode == 0, text.stderr[-3000:]
    assert f"affrun show --pid {pid} · 1 rank(s)" in text.stdout
    assert re.search(r"\[\s*\d+ 0[a-z?]!\s*\]", text.stdout), text.stdout  # rank 0's core, a stray marked
    assert "! a thread strayed here from its home" in text.stdout and "p pin-memory thread" in text.stdout
    assert f"rank 0 (pid {pid}): CPUs {format_cpulist([a, b])}" in text.stdout
    assert f"wrote {picture}" in text.stdout
    root = ET.parse(picture).getroot()
    cores = [e for e in root.iter("{http://www.w3.org/2000/svg}rect") if "core" in e.get("class", "").split()]
    strays = [e for e in cores if "stray" in e.get("class", "").split()]
    assert any(a in parse_cpulist(e.get("data-pus", "")) for e in strays)
    assert all(e.get("data-ranks") == "0" for e in strays)


def test_show_pid_on_a_job_without_a_plan(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    with running([sys.executable, str(script), json.dumps({"mask": CPUS})], job_env()) as (_proc, lines):
        pid = int(next(x for x in lines if x.startswith("READY")).split()[1])
        text = run(affrun_argv("show", "--pid", str(pid), "--duration", "0.3"), timeout=120)
    assert text.returncode == 0, text.stderr[-3000:]
    assert "no thread plan" in text.stdout and "!" not in text.stdout.split("Legend")[0]


def test_show_pid_refuses_a_dead_pid_a_thread_and_a_kernel_thread() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)  # reaped: the pid is free
    _refused(run(affrun_argv("show", "--pid", str(gone.pid)), timeout=120), f"--pid {gone.pid}", "no such process")
    _refused(run(affrun_argv("show", "--pid", "two"), timeout=120), "--pid")
    _refused(run(affrun_argv("show", "--pid", "0"), timeout=120), "--pid")
    _refused(run(affrun_argv("show", "--duration", "1"), timeout=120), "--duration")
    _refused(run(affrun_argv("show", "--pid", str(os.getpid()), "--mode", "numa"), timeout=120), "--mode")
    code = ("import os, threading; e = threading.Event(); t = threading.Thread(target=e.wait); t.start(); "
            "os.write(1, f'READY {t.native_id}\\n'.encode()); e.wait()")
    with running([sys.executable, "-c", code], clean_env()) as (proc, lines):
        tid = int(next(x for x in lines if x.startswith("READY")).split()[1])
        _refused(run(affrun_argv("show", "--pid", str(tid)), timeout=120), f"process {proc.pid}")
    kernel = _kernel_thread()
    if kernel is not None:
        _refused(run(affrun_argv("show", "--pid", str(kernel)), timeout=120), "kernel thread")


def test_a_rank_under_affrun_run_is_judged_by_the_plan_it_carries() -> None:
    """affrun run's hook binds in-process: /proc/PID/environ has AFFRUN_PLAN but no AFFRUN_CPUS. The plan's entry
    for the rank is its thread plan."""
    a, _ = two_cpus()
    job = "import os, time; os.write(1, f'READY {os.getpid()}\\n'.encode()); time.sleep(600)"
    with running(affrun_argv("run", "--map", str(a), "--", sys.executable, "-c", job), clean_env()) as (_proc, lines):
        pid = int(lines[-1].split()[1])
        _, data = audit(pid, 0.3)
    rank = process(data, pid)
    assert rank["plan_source"] == "affrun run's plan (AFFRUN_PLAN)" and rank["thread_plan"]["main"]["cpus"] == str(a)
    main = thread(data, pid, pid)
    assert (main["role"], main["home"], main["verdict"], main["allowed"]) == ("main", str(a), "home", str(a))
