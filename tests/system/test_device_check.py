"""benchmarks/device_check.sh --rehearse end to end (issue 35): the GPU validation's whole path on this machine.

The CUDA, NCCL and NVML steps are skipped with their reason; every other step runs for real (affrun torchrun with
real ranks and DataLoader workers, affrun doctor --pid, gpu_feed.py, affrun tune) on a fake tree of this machine's
CPUs with one fake GPU. Asserted is what a reader of the report checks: every step is there, the CPU steps are ok,
the 4-rank step's real masks are disjoint and inside the tree's allowed CPUs, and both reports exist. A step that
fails is recorded with its reason, and the run goes on to write its reports.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from launcher.base.cpulist import parse_cpulist
from tests.conftest import ROOT
from tests.launch import clean_env, require_torch, run

SCRIPT = ROOT / "benchmarks" / "device_check.sh"
STEPS = ("environment", "install", "torch-info", "topology", "topology-nvml", "plan-8", "bind-1", "bind-4",
         "bind-8", "nccl-comm-cores", "torchrun-numa-binding", "doctor-feed-starved", "doctor-feed-fed",
         "gpu-feed-1", "gpu-feed-8", "tune")
CUDA_STEPS = ("topology-nvml", "nccl-comm-cores", "torchrun-numa-binding")


def rehearse(out: Path, *args: str) -> tuple[int, str, dict[str, dict[str, object]]]:
    proc = run(["bash", str(SCRIPT), "--rehearse", "--out", str(out), *args],
               env=clean_env(PYTHON=sys.executable, DEVICE_CHECK_LIMIT="900"), timeout=960)
    report = json.loads((out / "device_check.json").read_text())
    return proc.returncode, proc.stdout + proc.stderr, {s["step"]: s for s in report["steps"]}


@pytest.mark.slow
@pytest.mark.torch
def test_the_rehearsal_runs_every_step(tmp_path: Path) -> None:
    require_torch()
    out = tmp_path / "out"
    rc, output, steps = rehearse(out)
    assert list(steps) == list(STEPS), output[-3000:]
    for name in CUDA_STEPS:
        assert steps[name]["status"] == "skipped" and "rehearsal: needs" in str(steps[name]["reason"]), steps[name]
    for name in set(STEPS) - set(CUDA_STEPS):
        step = steps[name]
        assert step["status"] == "ok", (name, step["reason"], step["checks"], step["output_tail"])
    assert rc == 0, output[-3000:]
    # 4 ranks (as many as this machine has whole cores, when fewer): real masks, disjoint, inside the allowed CPUs
    topology = steps["topology"]["figures"]
    assert isinstance(topology, dict)
    allowed = parse_cpulist(topology["allowed_cpus"])
    assert allowed == frozenset(os.sched_getaffinity(0))  # the tree holds this machine's CPUs: only the GPU is fake
    bind = steps["bind-4"]["figures"]
    assert isinstance(bind, dict)
    assert bind["ranks_requested"] == 4 and bind["ranks"] == min(4, topology["whole_cores"])
    ranks = bind["ranks_seen"]
    assert [r["rank"] for r in ranks] == list(range(bind["ranks"]))
    masks = [parse_cpulist(r["mask"]) for r in ranks]
    assert all(masks) and sum(map(len, masks)) == len(frozenset().union(*masks)), masks
    assert frozenset().union(*masks) <= allowed
    for r, mask in zip(ranks, masks):
        assert parse_cpulist(r["affrun_cpus"]) == mask  # the mask the plan gave is the mask the rank has
        assert r["workers"] and all(parse_cpulist(w) <= mask for w in r["workers"])
    assert [r["gpu"] for r in ranks][:1] == ["0"]  # visible GPU 0 goes to rank 0; the others have none
    feed = steps["doctor-feed-starved"]["figures"]
    assert isinstance(feed, dict) and isinstance(feed["doctor"], dict) and feed["meter_data_wait"] is not None
    markdown = (out / "device_check.md").read_text()
    assert markdown.startswith("# affrun GPU validation: rehearsal run")
    assert all(f"| {name} |" in markdown for name in STEPS)
    assert "device_check (rehearsal)" in output and "device_check.md" in output.splitlines()[-1]


@pytest.mark.slow
@pytest.mark.torch
def test_a_failing_step_is_recorded_and_the_run_goes_on(tmp_path: Path) -> None:
    """gpu_feed.py refuses --repeats 0: that step fails with its reason, the others are recorded, exit status 1."""
    require_torch()
    out = tmp_path / "out"
    rc, output, steps = rehearse(out, "--only", "gpu-feed-1", "--gpu-feed-args=--repeats 0")
    assert rc == 1, output[-3000:]
    assert list(steps) == list(STEPS)
    assert steps["gpu-feed-1"]["status"] == "failed" and steps["gpu-feed-1"]["reason"]
    assert "--repeats" in str(steps["gpu-feed-1"]["output_tail"])
    assert steps["install"]["status"] == "ok"
    assert steps["tune"]["status"] == "skipped" and "not selected" in str(steps["tune"]["reason"])
    assert "| gpu-feed-1 | **FAILED** |" in (out / "device_check.md").read_text()
