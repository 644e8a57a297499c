"""Every thread of a rank has a home (docs/threads.md): unmodified scripts with real third-party pipelines (JPEGs
decoded by Pillow in an ImageFolder-shaped dataset, OpenCV decode and resize, numpy through OpenBLAS, numexpr, a
``tokenizers`` BPE tokenizer trained here and used in the workers' collate) run under ``affrun torchrun`` and
``affrun exec`` with fork, spawn and forkserver workers; inside each rank and each worker the probe records what
the runtimes themselves report (``threadpoolctl.threadpool_info()``, ``cv2.getNumThreads()``, each thread of
``/proc/self/task`` and its ``sched_getaffinity``), and that must agree with the thread plan derived from the
rank's own ``AFFRUN_*`` variables (never from this machine's CPU count). Then the bad inputs: a garbage variable,
a ``worker_init_fn`` that raises its pools again, a script that sets its own inter-op size, libraries missing or
failing, and ``AFFRUN_RANK_HOOKS=none``: at most one warning line per process, never a traceback, the run goes on.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.base.cpulist import parse_cpulist
from launcher.bind.rank_hooks import live_plan
from launcher.plan.threads import ThreadPlan
from tests.launch import PROGRAMS, TORCH_RUNTIMES, affrun_argv, clean_env, run, runtime_env

pytestmark = pytest.mark.torch

PROBE = str(PROGRAMS / "thread_homes_probe.py")
NCPU = len(os.sched_getaffinity(0))
WARNING = re.compile(r"^affrun: warning: .*$", re.M)


def probe(tmp_path: Path, *launch: str, args: tuple[str, ...] = (), before: tuple[str, ...] = (),
          env: dict[str, str] | None = None) -> tuple[list[dict[str, Any]], str]:
    """Run the probe under ``affrun LAUNCH`` (``before``: words between affrun's ``--`` and the interpreter, such
    as ``env NAME=VALUE``); return every record it wrote and its stderr."""
    out = tmp_path / "records"
    out.mkdir()
    if launch[0] == "torchrun":  # torchrun runs the script with its own interpreter
        argv = affrun_argv(*launch, PROBE, "--out", str(out), *args)
    else:
        argv = affrun_argv(*launch, "--", *before, sys.executable, PROBE, "--out", str(out), *args)
    proc = run(argv, env=clean_env(**(env or {})), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))], proc.stderr


def ranks_and_workers(records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each rank's record with its workers' (a worker carries its rank's AFFRUN_LOCAL_RANK)."""
    ranks = [r for r in records if r["kind"] == "rank"]
    rank_of = {r["affrun"]["AFFRUN_LOCAL_RANK"]: r for r in ranks}
    assert len(rank_of) == len(ranks)
    workers: dict[str, list[dict[str, Any]]] = {k: [] for k in rank_of}
    for w in records:
        if w["kind"] == "worker":
            workers[w["affrun"]["AFFRUN_LOCAL_RANK"]].append(w)
    return [(rank_of[k], sorted(workers[k], key=lambda w: w["worker"])) for k in sorted(rank_of)]


def main_thread(record: dict[str, Any]) -> dict[str, Any]:
    (main,) = [t for t in record["threads"] if t["tid"] == record["pid"]]
    return main


def check_rank(rank: dict[str, Any], plan: ThreadPlan) -> None:
    """The rank process: its main thread on its home, every thread within the rank's CPUs, torch's inter-op
    pool and the pin-memory thread as the plan says, and nothing of affrun left in ``sys.modules``."""
    everything = parse_cpulist(rank["affrun"]["AFFRUN_CPUS"])
    assert main_thread(rank)["cpus"] == list(plan.main.cpus), rank["threads"]
    assert all(set(t["cpus"]) <= everything for t in rank["threads"]), rank["threads"]
    assert rank["interop"] == plan.interop.threads and rank["interop_patched"]
    assert rank["pin_memory"] == list(plan.pin_memory.cpus)
    assert rank["worker_loop_patched"]


def check_worker(worker: dict[str, Any], plan: ThreadPlan, rank: dict[str, Any], *, user: tuple[str, ...] = ()) -> None:
    """A worker: every thread on its home (the main thread on exactly it), every pool within its CPUs as the
    runtimes report them, the pool variables set to them for libraries it loads later, and no more threads than
    its pools allow."""
    home = plan.workers[worker["worker"]]
    n = home.pools
    assert main_thread(worker)["cpus"] == list(home.cpus), (worker["threads"], home)
    assert all(set(t["cpus"]) <= set(home.cpus) for t in worker["threads"]), (worker["threads"], home)
    for name, value in worker["env"].items():
        if name == "OMP_PLACES":
            assert value is None  # the rank's places name the rank's CPUs
        elif name not in user:
            assert value == str(n), (name, value, n)
    info = worker["threadpool_info"]
    assert info and all(lib["num_threads"] <= n for lib in info), info
    assert worker["cv2"] <= n and worker["numexpr"] <= n and worker["torch"] <= n, worker
    # A pool lowered after its library loaded may keep idle threads up to the size it loaded with, the rank's
    # (OpenBLAS starts its pool again after fork at that size: driver/others/blas_server.c). Rayon's pool starts
    # in the worker, at its size. No thread beyond those, the main thread and multiprocessing's queue feeder.
    openblas = sum(max(lib["num_threads"] - 1, 0) for lib in rank["threadpool_info"] if lib["internal_api"] == "openblas")
    bound = 2 + openblas + max(rank["numexpr"], n) + max(rank["cv2"], n) - 1 + n
    assert len(worker["threads"]) <= bound, (worker["threads"], bound)


def check_run(records: list[dict[str, Any]], workers: int, **kwargs: Any) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    runs = ranks_and_workers(records)
    for rank, ws in runs:
        plan = live_plan(rank["affrun"], workers)
        check_rank(rank, plan)
        assert [w["worker"] for w in ws] == list(range(workers)), ws
        for w in ws:
            check_worker(w, plan, rank, **kwargs)
    return runs


def test_torchrun_ranks_with_forked_workers_fit_their_plan(tmp_path: Path) -> None:
    """Two ranks where the machine has two CPUs: each worker on its own home within its rank, never on another
    rank's CPUs; every pool of every process within its CPUs."""
    nproc = "2" if NCPU >= 2 else "1"
    records, stderr = probe(tmp_path, "torchrun", "--nproc-per-node", nproc, args=("--workers", "2"))
    runs = check_run(records, 2)
    assert len(runs) == int(nproc) and not WARNING.findall(stderr), stderr
    ranks = [set(live_plan(rank["affrun"], 0).main.cpus) for rank, _ in runs]
    assert not any(a & b for i, a in enumerate(ranks) for b in ranks[i + 1:])
    assert all(rank["affrun_modules"] == [] for rank, _ in runs)  # the hook takes affrun's package out again


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_spawned_and_forkserver_workers_fit_their_plan(tmp_path: Path, context: str) -> None:
    """spawn and forkserver pickle torch's worker loop by reference: the worker's own interpreter finds it wrapped
    by the same hook. Under forkserver the script also passes ``launcher.torch.worker_init_fn``: the same fit
    again, quietly."""
    extra = ("--init", "affrun") if context == "forkserver" else ()
    records, stderr = probe(tmp_path, "exec", args=("--workers", "2", "--context", context, *extra))
    check_run(records, 2)
    assert not WARNING.findall(stderr), stderr


def test_a_main_thread_of_its_own(tmp_path: Path) -> None:
    """``--main-thread compute`` (``AFFRUN_MAIN_CPUS``): the main thread on its core right after ``import torch``,
    the inter-op pool sized to it, the pin-memory thread and the spawned workers off it."""
    if NCPU < 2:
        pytest.skip("needs 2 CPUs: one for the main thread, one for the rest")
    records, stderr = probe(tmp_path, "exec", "--main-thread", "compute",
                            args=("--workers", "2", "--context", "spawn"))
    ((rank, _),) = check_run(records, 2)
    plan = live_plan(rank["affrun"], 2)
    assert plan.main.pinned and rank["main_thread"] == list(plan.main.cpus) and len(plan.main.cpus) == 1
    assert not set(plan.main.cpus) & set(plan.pin_memory.cpus)
    assert all(not set(plan.main.cpus) & set(w.cpus) for w in plan.workers)
    assert not WARNING.findall(stderr), stderr


def test_a_worker_init_fn_that_raises_its_pools_and_a_script_that_sizes_interop(tmp_path: Path) -> None:
    """``cv2.setNumThreads(64)``, ``numexpr.set_num_threads(8)`` and ``RAYON_NUM_THREADS=64`` in the script's
    ``worker_init_fn``: lowered again, one line from worker 0; ``torch.set_num_interop_threads(1)`` after the hook
    sized the pool: one line, and the script goes on."""
    records, stderr = probe(tmp_path, "exec", args=("--workers", "2", "--init", "raise", "--interop", "1"))
    check_run(records, 2)
    lines = WARNING.findall(stderr)
    assert len(lines) == 2, stderr
    interop, raised = sorted(lines, key=lambda line: "DataLoader" in line)
    assert "torch.set_num_interop_threads(1)" in interop
    assert raised.startswith("affrun: warning: DataLoader worker 0: worker_init_fn raised ")
    assert all(word in raised for word in ("cv2.getNumThreads()=64", "numexpr", "RAYON_NUM_THREADS=64")), raised


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_a_worker_init_fn_that_sets_torchs_count_to_64(tmp_path: Path, context: str) -> None:
    """``torch.set_num_threads(64)`` in the script's ``worker_init_fn``, ``OMP_NUM_THREADS=64`` exported: torch keeps
    the count it was given and applies it again at a thread's first parallel operation, so a worker's count is
    set through torch and read back. After a parallel operation each worker runs no more threads than its pools
    allow (its real tasks), torch reads the worker's count, and the one line from worker 0 names what the
    function asked and what was read back. The inter-op pool: sized to the worker in a spawned or forkserver
    worker; a forked one keeps the rank's (torch takes one size per process, and fork copies it)."""
    records, stderr = probe(tmp_path, "exec", args=("--workers", "2", "--context", context, "--init", "torch64"),
                            env={"OMP_NUM_THREADS": "64"})
    ((rank, workers),) = check_run(records, 2)
    plan = live_plan(rank["affrun"], 2)
    for w in workers:
        n = plan.workers[w["worker"]].pools
        assert w["torch"] <= n, w
        assert w["interop"] == (rank["interop"] if context == "fork" else min(n, rank["interop"])), w
    (line,) = WARNING.findall(stderr)
    assert line.startswith("affrun: warning: DataLoader worker 0: worker_init_fn raised torch.set_num_threads(64) "
                           "above the worker's "), line
    assert "lowered to" in line and "torch:" not in line, line


@pytest.mark.parametrize("runtime", TORCH_RUNTIMES)
def test_the_pin_memory_threads_count_and_the_main_threads(runtime: str) -> None:
    """torch's pin-memory thread starts with ``torch.set_num_threads(1)``. torch stores that one count for the
    process, and a thread that has not started its own count yet (no parallel operation, no count query) takes
    it at its first: a main thread that had run nothing parallel before the loader's pin-memory thread started
    then runs on one thread, whatever ``OMP_NUM_THREADS`` says; one that had keeps its own. Under affrun the
    rank's main thread starts its count at ``import torch`` and keeps the plan's. The thread runs torch's own
    ``_pin_memory_loop`` (there is no accelerator here, so a DataLoader starts none)."""
    if NCPU < 2:
        pytest.skip("needs 2 CPUs: a count of 2 to lose")
    env = clean_env(**runtime_env(runtime))
    plain = [run([sys.executable, "-c", PIN_FIRST, first], env={**env, "OMP_NUM_THREADS": "2"}, timeout=120)
             for first in ("nothing", "op")]
    bound = run(affrun_argv("exec", "--", sys.executable, "-c", PIN_FIRST, "nothing"), env=env, timeout=120)
    seen = []
    for proc in (*plain, bound):
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        seen.append(json.loads(proc.stdout.splitlines()[-1]))
    assert [s["threads"] for s in seen[:2]] == [1, 2], seen  # torch's own behaviour, as it is
    assert seen[2]["threads"] == seen[2]["planned"] == NCPU and seen[2]["ran"] >= NCPU, seen[2]


PIN_FIRST = """
import json, os, sys, threading, torch
from torch.utils.data._utils.pin_memory import _pin_memory_loop
if sys.argv[1] == "op":
    torch.ones(1 << 20).sin_()
done = threading.Event()
done.set()  # the loop sets its count, finds the loader done, and returns
thread = threading.Thread(target=_pin_memory_loop, args=(None, None, -1, done, "cpu"))
thread.start()
thread.join()
threads = torch.get_num_threads()
x = torch.ones(1 << 22)
for _ in range(8):
    x.sin_()
print(json.dumps({"threads": threads, "planned": int(os.environ["OMP_NUM_THREADS"]),
                  "ran": len(os.listdir("/proc/self/task"))}))
"""


def test_garbage_variables_and_the_users_values_under_keep(tmp_path: Path) -> None:
    """Reaching the rank after affrun set them: a garbage pool variable the user owns (replaced in the workers, as
    no thread count), a user's value under keep (left as it is), a name that is no pool variable: one line per
    process, from worker 0 only."""
    before = ("env", "RAYON_NUM_THREADS=lots", "BLIS_NUM_THREADS=7", "AFFRUN_ENV_POLICY=keep",
              "AFFRUN_USER_POOLS=RAYON_NUM_THREADS,BLIS_NUM_THREADS,NOT_A_POOL")
    records, stderr = probe(tmp_path, "exec", args=("--workers", "2"), before=before)
    ((rank, workers),) = check_run(records, 2, user=("RAYON_NUM_THREADS", "BLIS_NUM_THREADS"))
    plan = live_plan(rank["affrun"], 2)
    for w in workers:
        assert w["env"]["BLIS_NUM_THREADS"] == "7"  # kept, whatever the worker's CPUs
        assert w["env"]["RAYON_NUM_THREADS"] == str(plan.workers[w["worker"]].pools)
    (line,) = WARNING.findall(stderr)
    assert line.startswith("affrun: warning: DataLoader worker 0: ") and "'lots'" in line and "NOT_A_POOL" in line


def test_missing_and_failing_libraries(tmp_path: Path) -> None:
    """cv2 and tokenizers not installed, threadpoolctl failing: the workers are still pinned and their other pools
    sized; one line from worker 0 names threadpoolctl's failure."""
    broken = tmp_path / "site"
    broken.mkdir()
    (broken / "cv2.py").write_text("raise ImportError('cv2 is not installed here')\n")
    (broken / "tokenizers.py").write_text("raise ImportError('tokenizers is not installed here')\n")
    (broken / "threadpoolctl.py").write_text(
        "class ThreadpoolController:\n    def __init__(self):\n        raise OSError('dl_iterate_phdr failed')\n\n\n"
        "def threadpool_info():\n    return []\n")
    records, stderr = probe(tmp_path, "exec", args=("--workers", "2"), env={"PYTHONPATH": str(broken)})
    ((rank, workers),) = ranks_and_workers(records)
    plan = live_plan(rank["affrun"], 2)
    for w in workers:
        home = plan.workers[w["worker"]]
        assert main_thread(w)["cpus"] == list(home.cpus) and w["cv2"] is None
        assert w["numexpr"] <= home.pools and w["env"]["OPENCV_FOR_THREADS_NUM"] == str(home.pools)
    (line,) = WARNING.findall(stderr)
    assert "DataLoader worker 0: runtimes: OSError: dl_iterate_phdr failed" in line, stderr


def test_rank_hooks_none_patches_nothing(tmp_path: Path) -> None:
    """``--rank-hooks none`` (``AFFRUN_RANK_HOOKS=none``): torch's worker loop and inter-op setter are torch's own,
    the workers keep the rank's mask and its pool variables, and nothing of affrun is imported."""
    records, stderr = probe(tmp_path, "exec", "--rank-hooks", "none", args=("--workers", "2"))
    assert all(r["affrun"]["AFFRUN_RANK_HOOKS"] == "none" for r in records)
    ((rank, workers),) = ranks_and_workers(records)
    assert not rank["worker_loop_patched"] and not rank["interop_patched"] and rank["affrun_modules"] == []
    for w in workers:
        assert main_thread(w)["cpus"] == main_thread(rank)["cpus"] and w["env"] == rank["env"]
    assert not WARNING.findall(stderr), stderr


IMPORT_TORCH = ("import torch, torch.utils.data._utils.worker as w; "
                "print(hasattr(w._worker_loop, '__wrapped__'), hasattr(torch.set_num_interop_threads, '__wrapped__'))")


@pytest.mark.parametrize(("name", "value", "said"), [
    ("AFFRUN_MAIN_CPUS", "first", "the rank's thread hooks are off: AFFRUN_MAIN_CPUS='first' is not a cpu list"),
    ("AFFRUN_CPUS", "0-x", "the rank's thread hooks are off: AFFRUN_CPUS='0-x' is not a cpu list"),
    ("AFFRUN_RANK_HOOKS", "off", "AFFRUN_RANK_HOOKS='off' is not auto or none: the rank's thread hooks are off"),
])
def test_a_garbage_affrun_variable_is_one_line_and_nothing_patched(name: str, value: str, said: str) -> None:
    """A process that carries a rank's variables (``AFFRUN_LOCAL_RANK``), one of them malformed: one warning line,
    the script runs, torch is torch's own."""
    cpu = min(os.sched_getaffinity(0))
    env = clean_env(**{"AFFRUN_LOCAL_RANK": "0", "AFFRUN_CPUS": str(cpu), name: value})
    proc = run([sys.executable, "-c", IMPORT_TORCH], env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["False", "False"], proc.stderr
    assert proc.stderr.splitlines() == [f"affrun: warning: {said}"]


def test_a_count_with_spaces_reaches_no_pool_that_would_refuse_or_ignore_it() -> None:
    """OpenCV raises at its first parallel call on ``OPENCV_FOR_THREADS_NUM=' 1'`` and Rayon ignores ``'1\\n'`` (a
    thread per CPU): under safe the rank gets its plan's count instead, and cv2 works; the value is not the
    user's any more. BLIS reads `` 1`` as 1 (strtol): it stays the user's."""
    script = ("import cv2, json, numpy, os; cv2.resize(numpy.zeros((64, 64), 'uint8'), (32, 32)); "
              "print(json.dumps({k: os.environ.get(k) for k in ('OPENCV_FOR_THREADS_NUM', 'RAYON_NUM_THREADS', "
              "'BLIS_NUM_THREADS', 'AFFRUN_USER_POOLS', 'AFFRUN_THREADS')}))")
    env = clean_env(OPENCV_FOR_THREADS_NUM=" 1", RAYON_NUM_THREADS="1\n", BLIS_NUM_THREADS=" 1")
    done = run(affrun_argv("exec", "--", sys.executable, "-c", script), env=env)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["OPENCV_FOR_THREADS_NUM"] == seen["RAYON_NUM_THREADS"] == seen["AFFRUN_THREADS"]
    assert seen["BLIS_NUM_THREADS"] == " 1" and seen["AFFRUN_USER_POOLS"] == "BLIS_NUM_THREADS"


def test_a_worker_s_environment_is_the_rank_s_pool_sizes_aside() -> None:
    """Sizing a worker's runtimes (threadpoolctl) leaves its environment as the rank gave it, pool sizes aside:
    threadpoolctl's import set ``KMP_DUPLICATE_LIB_OK=True``, which hides libiomp5's abort on a second copy."""
    script = ("import os, torch; from torch.utils.data import DataLoader; "
              "print([os.environ.get('KMP_DUPLICATE_LIB_OK'), *DataLoader(range(1), num_workers=1, collate_fn="
              "lambda _: os.environ.get('KMP_DUPLICATE_LIB_OK'))])")
    done = run(affrun_argv("exec", "--", sys.executable, "-c", script), env=clean_env())
    assert done.returncode == 0 and done.stdout.split() == ["[None,", "None]"], done.stderr[-3000:]
