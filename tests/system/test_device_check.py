"""benchmarks/device_check.sh --rehearse end to end (issues 35, 41): the GPU validation's whole path on this machine.

The CUDA and NVML steps are skipped with their reason; every other step runs for real (affrun torchrun with real
ranks and DataLoader workers, the ceiling, an all-reduce over gloo standing in for NCCL under --comm-cores 1,
affrun doctor --pid, gpu_feed.py, affrun tune) on a fake tree of this machine's CPUs with one fake GPU. Asserted
is what a reader of the report checks: every step is there, the CPU steps are ok, the 4-rank step's real masks are
disjoint and inside the tree's allowed CPUs, the communication threads that worked ran on the comm core, both
reports exist, and the run kept its own time plan: no step ran past its planned seconds (its record says both),
and the steps up to tune fit the device run's limit. A step that fails is recorded with its reason, and the run
goes on to write its reports.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.base.cpulist import parse_cpulist
from tests.conftest import ROOT
from tests.launch import clean_env, run

SCRIPT = ROOT / "benchmarks" / "device_check.sh"
STEPS = ("environment", "install", "torch-info", "topology", "topology-nvml", "plan-8", "ceiling", "nccl-comm-cores",
         "doctor-feed-starved", "doctor-feed-fed", "gpu-feed-1", "tune", "gpu-feed-8", "bind-8", "bind-1", "bind-4",
         "torchrun-numa-binding")
CUDA_STEPS = ("topology-nvml", "torchrun-numa-binding")
KILL_SLACK = 10.0  # seconds a step may end after its planned time: killing its processes, reading their output


def rehearse(out: Path, *args: str) -> tuple[int, str, dict[str, Any], dict[str, dict[str, Any]]]:
    """The rehearsal under its own explicit budget (device_check.sh's default for --rehearse)."""
    proc = run(["bash", str(SCRIPT), "--rehearse", "--out", str(out), *args],
               env=clean_env(PYTHON=sys.executable), timeout=800)
    report = json.loads((out / "device_check.json").read_text())
    return proc.returncode, proc.stdout + proc.stderr, report, {s["step"]: s for s in report["steps"]}


def assert_the_plan_is_kept(report: dict[str, Any], steps: dict[str, dict[str, Any]]) -> None:
    """What the run's own record says of its time: each step ended within its planned seconds (the time it was
    given: its share x the scale, never past the run's deadline), the steps ran one after the other inside the
    limit, and the shares of the steps up to tune fit the device run's limit less the margin (tune included)."""
    plan = report["plan"]
    assert isinstance(plan, dict)
    deadline = float(report["limit_s"]) - plan["margin_s"]
    end = 0.0
    for name, step in steps.items():
        started, planned, used = (float(step[k]) for k in ("started_s", "planned_s", "seconds"))
        assert used <= planned + KILL_SLACK, (name, planned, used)
        assert started >= end - 0.2 and started + planned <= deadline + 0.2, (name, started, planned, deadline)
        end = started + used
        if step["status"] != "skipped":
            assert planned <= plan["shares"][name] * plan["scale"] + 0.1, (name, planned)
    assert float(report["wall_s"]) <= float(report["limit_s"])
    shares = list(plan["shares"].items())
    through_tune = shares[: [n for n, _ in shares].index("tune") + 1]
    assert sum(cap for _, cap in through_tune) <= plan["device_limit_s"] - plan["margin_s"], through_tune


@pytest.mark.slow
@pytest.mark.torch
def test_the_rehearsal_runs_every_step(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc, output, report, steps = rehearse(out)
    assert list(steps) == list(STEPS), output[-3000:]
    assert_the_plan_is_kept(report, steps)
    plan = report["plan"]
    assert isinstance(plan, dict) and report["limit_s"] == plan["device_limit_s"] * plan["scale"]  # its budget
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
    assert feed["of_ceiling"] is not None and "meter_verdict" in feed and "doctor_verdict" in feed
    # The communication threads: the ones that used CPU time over the all-reduce (gloo's) ran on the comm core.
    comm = steps["nccl-comm-cores"]["figures"]
    assert isinstance(comm, dict) and comm["backend"] == "gloo" and comm["busy_threads"]
    assert steps["nccl-comm-cores"]["checks"]["busy_comm_threads_on_the_comm_cores"] is True
    ceiling = steps["ceiling"]["figures"]
    assert isinstance(ceiling, dict) and ceiling["samples_per_s"] > 0 and ceiling["launch_s"] > 0
    tune = steps["tune"]["figures"]
    assert isinstance(tune, dict) and tune["tuned_vs_ceiling"] is not None and tune["goal"]
    markdown = (out / "device_check.md").read_text()
    assert markdown.startswith("# affrun GPU validation: rehearsal run")
    assert all(f"| {name} |" in markdown for name in STEPS)
    assert "device_check (rehearsal)" in output and "device_check.md" in output.splitlines()[-1]


@pytest.mark.slow
@pytest.mark.torch
def test_a_failing_step_is_recorded_and_the_run_goes_on(tmp_path: Path) -> None:
    """gpu_feed.py refuses --repeats 0: that step fails with its reason, the others are recorded, exit status 1."""
    out = tmp_path / "out"
    rc, output, report, steps = rehearse(out, "--only", "gpu-feed-1", "--gpu-feed-args=--repeats 0")
    assert rc == 1, output[-3000:]
    assert list(steps) == list(STEPS)
    assert_the_plan_is_kept(report, steps)
    assert steps["ceiling"]["status"] == "ok"  # what gpu-feed-1 is sized and judged by runs with it
    assert steps["gpu-feed-1"]["status"] == "failed" and steps["gpu-feed-1"]["reason"]
    assert "--repeats" in str(steps["gpu-feed-1"]["output_tail"])
    assert steps["install"]["status"] == "ok"
    assert steps["tune"]["status"] == "skipped" and "not selected" in str(steps["tune"]["reason"])
    assert "| gpu-feed-1 | **FAILED** |" in (out / "device_check.md").read_text()
