"""The communication threads' home through real torchrun (issue 41, part 1): a rank of ``affrun torchrun`` with
``--comm-cores 1`` (or ``--main-thread compute``, whose comm home is the rank's CPUs off the main core) makes a
gloo process group and a subgroup, then all-reduces. Every thread born in those calls (gloo's run loops, which do
the all-reduce's work on the CPU, gloo's device loop, the store's) runs on the comm home from its birth, and
used CPU time there; the main thread is back on its own CPUs after each call. On this machine's own CPUs, a fake
tree of them with a fake GPU on their node (only the GPU is fake)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launcher.base.cpulist import parse_cpulist
from tests.conftest import need
from tests.fakesys import this_machine_with_gpus, write_tree
from tests.launch import affrun_argv, clean_env, json_lines, run

RANK = r"""
import json, os, sys, time
import torch
import torch.distributed as dist

def threads():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = open(f"/proc/self/task/{tid}/comm").read().strip()
            status = open(f"/proc/self/task/{tid}/status").read()
            ns = int(open(f"/proc/self/task/{tid}/schedstat").read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        allowed = status.split("Cpus_allowed_list:")[1].split()[0]
        out[tid] = {"name": name, "allowed": allowed, "cpu_ns": ns}
    return out

torch.ones(1 << 20).add_(1).sum()  # the OpenMP team starts before any group: no communication thread
before = threads()
mask = sorted(os.sched_getaffinity(0))
dist.init_process_group("gloo")
after_init = sorted(os.sched_getaffinity(0))
sub = dist.new_group([0], backend="gloo")
after_new = sorted(os.sched_getaffinity(0))
start = threads()
data = torch.ones(1 << 20)
end = time.monotonic() + 1.0
while time.monotonic() < end:
    dist.all_reduce(data)
    dist.all_reduce(data, group=sub)
stop = threads()
new = {tid: {**t, "used_ns": t["cpu_ns"] - start.get(tid, {"cpu_ns": 0})["cpu_ns"]}
       for tid, t in stop.items() if tid not in before}
sys.stdout.write(json.dumps({"mask": mask, "after_init": after_init, "after_new": after_new, "new": new,
                             "comm": os.environ.get("AFFRUN_COMM_CPUS"), "main": os.environ.get("AFFRUN_MAIN_CPUS"),
                             "main_now": sorted(os.sched_getaffinity(0))}) + "\n")
dist.destroy_process_group()
"""


@pytest.mark.torch
@pytest.mark.parametrize("option", [("--comm-cores", "1"), ("--main-thread", "compute")], ids=["comm", "main"])
def test_threads_born_in_group_creation_start_on_the_comm_home(tmp_path: Path, option: tuple[str, str]) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    need(len(cpus) >= 2, "needs 2 CPUs")
    root = write_tree(tmp_path / "root", this_machine_with_gpus(1))
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    proc = run(affrun_argv("torchrun", *option, "--nproc-per-node", "1", str(script)),
               env=clean_env(AFFRUN_FSROOT=str(root)), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = json_lines(proc.stdout)
    main = set(record["mask"])  # the main thread's: OpenMP's first place, or its core of its own
    if option[0] == "--comm-cores":
        home = set(parse_cpulist(record["comm"]))
        assert home == {cpus[-1]}  # the rank's last core, as NCCL_PROXY_CPUSET names it
    else:
        assert main == parse_cpulist(record["main"])
        home = set(cpus) - main  # no comm cores: NCCL_PROXY_CPUSET is the rank's CPUs off the main core
    # The thread that made the groups is back on its own CPUs after each call.
    assert set(record["after_init"]) == set(record["after_new"]) == set(record["main_now"]) == main
    new = record["new"]
    names = {t["name"] for t in new.values()}
    assert "pt_gloo_runloop" in names, json.dumps(new)
    for tid, t in new.items():  # every thread born in the calls: on the comm home from its birth
        assert parse_cpulist(t["allowed"]) == home, (tid, t)
    busy = [t for t in new.values() if t["name"] == "pt_gloo_runloop"]
    assert sum(t["used_ns"] for t in busy) > 0  # gloo's run loops did the all-reduces' work, on the comm home
