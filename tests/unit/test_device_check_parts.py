"""benchmarks/device_check.py's parts that decide what the GPU run reports (issue 41), away from a GPU: doctor's
JSON read as docs/doctor.md documents it (a finding's ``subject`` is optional: the first device run failed with
``KeyError: 'subject'``), the verdicts of issue 39 read whether they have landed or not, what bounds tune against
the ceiling, the time plan (tune inside the device run's limit), and gpu_feed.py starting no launch its budget
cannot hold (real processes, launched and timed)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.machines import fake_pynvml, nvml_state

sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import their siblings by name, as when run as scripts

import device_check
import gpu_feed
from device_check_feed import cpu_bound, doctor_figures, tune_judgement, verdict_of


def test_a_finding_without_a_subject_is_read() -> None:
    doctor = {
        "findings": [{"id": "gpu-low-utilisation", "severity": "warning", "message": "GPU 0 was 27% busy",
                      "why": "...", "fix": "..."},
                     {"id": "feed-starved", "severity": "warning", "message": "...", "why": "", "fix": "",
                      "subject": "rank 0 (pid 12)"}],
        "processes": [{"pid": 12, "role": "rank", "feed": {"data_wait_fraction": 0.04}},
                      {"pid": 13, "role": "child", "feed": None}],
        "gpus": {"available": True, "reason": "NVIDIA driver 580", "gpus": [{"index": 0, "utilisation_mean": 27.0}]},
    }
    figures = doctor_figures(doctor)
    assert figures["findings"] == ["warning gpu-low-utilisation", "warning feed-starved: rank 0 (pid 12)"]
    assert figures["meter_data_wait"] == 0.04 and figures["nvml_utilisation"] == [27.0]
    assert figures["doctor_verdict"] is None  # before issue 39's verdicts land: reported absent
    # Anything else doctor may print (an error object, no processes, odd types) is read without a traceback.
    odd: object
    for odd in (None, [], "text", {"findings": "x", "processes": None, "gpus": []}, {"processes": [1, "a"]}):
        assert doctor_figures(odd)["findings"] == []


def test_verdicts_are_read_however_they_are_spelled_and_absent_is_none() -> None:
    assert verdict_of({"verdict": "fed"}) == {"verdict": "fed"}
    assert verdict_of({"verdict": {"verdict": "starved-of-cpu", "evidence": "e", "fix": "f", "cause": "collapse",
                                   "likely": None}}) == {"verdict": "starved-of-cpu", "evidence": "e", "fix": "f",
                                                         "cause": "collapse"}
    assert verdict_of({"role": "rank", "feed": {"verdict": {"kind": "underused"}}}) == {"verdict": "underused"}
    assert verdict_of({"batches": 3, "data_wait_fraction": 0.9}) is None
    assert verdict_of({"verdict": 3}) is None and verdict_of(None) is None
    # Elsewhere in doctor's JSON: the object naming the rank's pid, never a thread's home/strayed verdict.
    doctor = {"processes": [{"pid": 7, "role": "rank", "threads": [{"tid": 7, "verdict": "strayed"}]}],
              "ranks": [{"pid": 9, "verdict": {"verdict": "fed"}}, {"pid": 7, "verdict": {"kind": "starved-by-data"}}]}
    assert doctor_figures(doctor)["doctor_verdict"] == {"verdict": "starved-by-data"}
    only_threads = {"processes": [{"pid": 7, "role": "rank", "threads": [{"tid": 8, "verdict": "home"}]}]}
    assert doctor_figures(only_threads)["doctor_verdict"] is None


def test_tune_is_judged_against_the_ceiling_or_what_the_cpus_can_decode() -> None:
    # 80 ms of CPU per batch of 32 at a ceiling of 3,200 samples/s (100 batches/s) needs 8 CPUs: 16 can.
    bound = cpu_bound(0.08, 16, 3200.0)
    assert bound is not None and not bound["cpu_bound"] and bound["cpus_needed"] == 8.0
    assert tune_judgement(3000.0, 3200.0, bound).startswith("goal met: tuned 94% of the ceiling")
    assert tune_judgement(2000.0, 3200.0, bound).startswith("goal missed: tuned 62%")
    # On 4 CPUs they cannot: the bound is 4 / 0.08 = 50 batches/s, 1,600 samples/s.
    bound = cpu_bound(0.08, 4, 3200.0)
    assert bound is not None and bound["cpu_bound"] and bound["bound_samples_per_s"] == 1600.0
    said = tune_judgement(1500.0, 3200.0, bound)
    assert said.startswith("bounded by the CPUs (80 ms of CPU per batch x 100.0 batches/s at the ceiling = 8.0 CPUs")
    assert "94% of the 1600 samples/s they can decode" in said
    assert tune_judgement(None, 3200.0, bound).startswith("not judged") and cpu_bound(None, 4, 1.0) is None


def test_the_time_plan_holds_tune_inside_the_device_limit() -> None:
    args = argparse.Namespace(gpu_feed_args="", carry=".carry", rehearse=False, scale=0.0, only="",
                              limit=device_check.DEVICE_LIMIT)
    plan = device_check.steps(args)
    names = [s.name for s in plan]
    assert names.index("ceiling") < names.index("nccl-comm-cores") < names.index("tune") < names.index("gpu-feed-8")
    through_tune = plan[: names.index("tune") + 1]
    assert sum(s.cap for s in through_tune) <= device_check.DEVICE_LIMIT - device_check.MARGIN
    assert device_check.plan_scale(args, plan, set(names)) == 1.0
    # A rerun of a few steps under its own limit shares that limit among them.
    args.only, args.limit = "gpu-feed-8", 300.0
    chosen = {*device_check.SETUP_STEPS, "ceiling", "gpu-feed-8"}
    scale = device_check.plan_scale(args, plan, chosen)
    assert abs(scale * sum(s.cap for s in plan if s.name in chosen) - (300.0 - device_check.MARGIN)) < 1e-6
    args.only, args.rehearse = "", True
    assert device_check.plan_scale(args, plan, set(names)) == device_check.REHEARSAL_SCALE


def test_gpu_feed_starts_no_launch_its_budget_cannot_hold(tmp_path: Path) -> None:
    """Three configurations whose launch is a real process that exits at once (it reports no rank: a failed
    launch, measured like any other); a budget of 2 s with a launch estimated at 30 s runs the first only."""
    quick = (sys.executable, "-c", "pass")
    configs = [gpu_feed.Config(name, quick) for name in ("a", "b", "c")]
    args = argparse.Namespace(repeats=1, budget=2.0, launch_estimate=30.0, start_timeout=60.0, seconds=0.1, ranks=1)
    skipped: list[dict[str, str]] = []
    results = gpu_feed.run_all(configs, args, [], str(tmp_path / "go"), skipped)
    assert [r.config.name for r in results] == ["a"] and results[0].outcomes[0].error
    assert [s["name"] for s in skipped] == ["b", "c"]
    assert all(s["reason"].startswith("out of budget") and "a launch takes 30 s" in s["reason"] for s in skipped)


def test_the_ceilings_nvml_sample_is_the_mean_of_its_readings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from device_check_run import nvml_utilisation

    fake_pynvml(monkeypatch, tmp_path, [("00000000:17:00.0", "GPU-a")])
    nvml_state(tmp_path, {"utilisation": [20]})
    util, said = nvml_utilisation(0.0)  # one reading: 20%
    assert util == [20.0] and said == "NVIDIA driver 575.57.08"
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    util, said = nvml_utilisation(0.0)
    assert util is None and "nvidia-ml-py is not installed" in said
