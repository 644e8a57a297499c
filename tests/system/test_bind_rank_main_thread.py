"""``launcher.bind_rank(..., main_thread="compute")`` in real processes. The OpenMP runtime binds the main thread
to its core from ``OMP_PLACES`` when it starts; bind_rank does not pin it earlier, because libgomp drops the places
outside the mask of the thread that loads it (measured: "Number of places reduced from 2 to 1", the whole team on
the main core). So: without an OpenMP runtime loaded, the main thread keeps the rank's CPUs until ``import torch``,
which then puts it on its core and its team on the other places; with torch loaded before, it keeps the rank's CPUs
and the report says why; where the runtime had put it on its core already (``affrun run``), it is pinned there again.
Every mask is the kernel's (``/proc/self/task/TID/status``), every expected value the rank's own ``AFFRUN_*``."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

from launcher.base.cpulist import parse_cpulist
from tests.conftest import need
from tests.launch import affrun_argv, clean_env, run

pytestmark = pytest.mark.slow

PROBE = r"""
import json, os, sys, threading
if sys.argv[1] == "torch-before":
    import torch
import launcher

def mask(tid):
    with open(f"/proc/self/task/{tid}/status") as status:
        return next(line.split(":", 1)[1].strip() for line in status if line.startswith("Cpus_allowed_list"))

def tids_now():
    return {int(t) for t in os.listdir("/proc/self/task")}

started, stop, box = threading.Event(), threading.Event(), {}
def idle(key):
    box[key] = threading.get_native_id()
    started.set()
    stop.wait()

threading.Thread(target=idle, args=("before",), daemon=True).start()
started.wait()
report = launcher.bind_rank(0, 1, main_thread="compute", quiet=True)
started.clear()
threading.Thread(target=idle, args=("later",), daemon=True).start()
started.wait()
out = {"main": mask(os.getpid()), "before": mask(box["before"]), "later": mask(box["later"]),
       "cpus": os.environ["AFFRUN_CPUS"], "main_cpus": os.environ["AFFRUN_MAIN_CPUS"],
       "places": os.environ["OMP_PLACES"], "applied": list(report.applied), "not_applied": list(report.not_applied),
       "count": report.threads, "torch_count": sys.modules["torch"].get_num_threads() if "torch" in sys.modules else 0}
if sys.argv[1] == "torch-after":
    known = tids_now()
    import torch
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    x = torch.randn(512, 512)
    for _ in range(20):
        x = torch.tanh(x @ x)
    out["main_after_torch"] = mask(os.getpid())
    out["started"] = sorted(mask(t) for t in tids_now() - known)
    out["threads"] = int(os.environ["OMP_NUM_THREADS"])
print(json.dumps(out))
"""


def probe(when: str) -> dict[str, Any]:
    need(len(os.sched_getaffinity(0)) >= 2, "a core of its own for the main thread needs 2 allowed CPUs")
    proc = run([sys.executable, "-c", PROBE, when], env=clean_env(OMP_WAIT_POLICY="passive"), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_without_a_runtime_the_main_thread_waits_for_it_and_the_others_keep_the_rank() -> None:
    out = probe("plain")
    main, cpus = parse_cpulist(out["main_cpus"]), parse_cpulist(out["cpus"])
    assert main and main < cpus and out["places"].startswith("{" + out["main_cpus"] + "}")
    assert parse_cpulist(out["main"]) == cpus == parse_cpulist(out["before"]) == parse_cpulist(out["later"])
    assert any("until the OpenMP runtime starts" in n for n in out["not_applied"]), out["not_applied"]


@pytest.mark.torch
def test_torch_imported_after_puts_the_main_thread_on_its_core_and_its_team_off_it() -> None:
    out = probe("torch-after")
    main = parse_cpulist(out["main_cpus"])
    assert parse_cpulist(out["main_after_torch"]) == main  # libgomp bound it to the first place at load
    started = [parse_cpulist(m) for m in out["started"]]
    assert all(m <= parse_cpulist(out["cpus"]) for m in started)
    # the OpenMP team (OMP_NUM_THREADS - 1 threads besides the main one) on the places after the main core; other
    # threads torch starts from the main thread (its inter-op pool) inherit the main core, as the thread plan says
    off = [m for m in started if m.isdisjoint(main)]
    assert len(off) >= out["threads"] - 1 >= 1, (out["places"], out["started"])


@pytest.mark.torch
def test_torch_imported_before_keeps_the_main_thread_on_the_rank() -> None:
    """libgomp read no affrun places at load: pinning the main thread would put every OpenMP thread it starts
    later on its core. bind_rank says so instead."""
    out = probe("torch-before")
    cpus = parse_cpulist(out["cpus"])
    assert parse_cpulist(out["main"]) == cpus and parse_cpulist(out["later"]) == cpus
    assert any("libgomp was loaded before bind_rank" in n for n in out["not_applied"]), out["not_applied"]
    # the loaded runtimes' counts set, in the report's words, and the one torch's libgomp gives read back
    assert f"libgomp: omp_set_num_threads({out['count']})" in out["applied"] and out["torch_count"] == out["count"]


UNDER_RUN = r"""
import json, os
import torch  # the hook bound the process first: libgomp put the main thread on the first place
import launcher
report = launcher.bind_rank(0, 1, quiet=True)
with open(f"/proc/self/task/{os.getpid()}/status") as status:
    main = next(line.split(":", 1)[1].strip() for line in status if line.startswith("Cpus_allowed_list"))
print(json.dumps({"main": main, "main_cpus": os.environ["AFFRUN_MAIN_CPUS"], "applied": list(report.applied)}))
"""


@pytest.mark.torch
def test_under_affrun_run_the_main_thread_stays_on_the_core_the_runtime_gave_it() -> None:
    need(len(os.sched_getaffinity(0)) >= 2, "a core of its own for the main thread needs 2 allowed CPUs")
    proc = run(affrun_argv("run", "--main-thread", "compute", "--", sys.executable, "-c", UNDER_RUN),
               env=clean_env(OMP_WAIT_POLICY="passive"), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["main_cpus"] and parse_cpulist(out["main"]) == parse_cpulist(out["main_cpus"])
    assert any("where the OpenMP runtime had put it" in a for a in out["applied"]), out["applied"]
