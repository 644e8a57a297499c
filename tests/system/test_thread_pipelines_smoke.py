"""The thread-pipelines benchmark (benchmarks/thread_pipelines.py) runs end to end: one short run of one real
pipeline (OpenCV decode and resize in DataLoader workers) under each configuration, launched for real, and its
JSON holds every configuration with its figures and what its processes ran with. No timing is asserted; what a
user would check in /proc is: affrun's workers run within their rank's CPUs, each pool no larger than the CPUs
of its worker, and plain torchrun's workers keep their rank's whole mask."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.base.cpulist import parse_cpulist
from tests.conftest import ROOT, need
from tests.launch import clean_env

BENCH = ROOT / "benchmarks" / "thread_pipelines.py"
CONFIGS = ("affrun", "torchrun", "torchrun-omp1")


@pytest.mark.slow
@pytest.mark.torch
def test_thread_pipelines_reports_every_configuration(tmp_path: Path) -> None:
    try:
        import cv2  # noqa: F401
    except ImportError:
        need(False, "opencv-python-headless is not installed")
    ranks = min(2, len(os.sched_getaffinity(0)))
    out = tmp_path / "threads.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--pipelines", "image-opencv", "--repeats", "1", "--seconds", "0.3",
         "--warmup", "0.2", "--ranks", str(ranks), "--json", str(out), "--markdown"],
        env=clean_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["ranks"] == ranks and report["workers"] == 2 and report["repeats"] == 1
    assert report["cores"] == len(os.sched_getaffinity(0)) and len(report["load_before"]) == 3
    assert set(report["configs"]) == set(CONFIGS) and report["skipped"] == []
    (pipeline,) = report["pipelines"]
    assert pipeline["name"] == "image-opencv"
    configs = {c["name"]: c for c in pipeline["configs"]}
    assert set(configs) == set(CONFIGS)
    for c in configs.values():
        assert c["status"] == "ok" and c["error"] is None, c
        assert isinstance(c["samples_per_s"], float) and c["samples_per_s"] > 0, c
        assert c["min"] <= c["samples_per_s"] <= c["max"] and len(c["runs"]) == 1, c
        # The ratio is of the unrounded medians; both shown figures are rounded to 0.1 sample/s.
        assert c["vs_a"] == pytest.approx(c["samples_per_s"] / configs["affrun"]["samples_per_s"], abs=2e-3), c
        assert len(c["paired_vs_a"]) == 1 and c["worker_threads"]["min"] >= 1 and c["rank_threads"]["min"] >= 1, c
        assert "cv2" in c["worker_pools"] and any(k.startswith("openblas:") for k in c["worker_pools"]), c
        assert c["rank_env"]["OMP_NUM_THREADS"] != [None] or ranks == 1, c  # torchrun sets it for 2+ ranks
    assert configs["affrun"]["vs_a"] == 1.0
    assert configs["torchrun-omp1"]["rank_env"]["OMP_NUM_THREADS"] == ["1"]
    # affrun: each worker within one rank's CPUs, every pool within the worker's CPUs.
    affrun = configs["affrun"]
    rank_cpus = [parse_cpulist(cpus) for cpus in affrun["rank_cpus"]]
    assert len(rank_cpus) == ranks and not any(a & b for i, a in enumerate(rank_cpus) for b in rank_cpus[i + 1:])
    widest = max(len(parse_cpulist(cpus)) for cpus in affrun["worker_cpus"])
    assert all(any(parse_cpulist(cpus) <= r for r in rank_cpus) for cpus in affrun["worker_cpus"]), affrun
    for name, values in affrun["worker_pools"].items():  # as OpenCV, numexpr and threadpoolctl report them
        if name in ("cv2", "numexpr", "rayon") or ":" in name:
            assert all(v <= widest for v in values), affrun["worker_pools"]
    # Plain torchrun binds nothing: its workers have every CPU this test may use.
    for name in ("torchrun", "torchrun-omp1"):
        assert [parse_cpulist(cpus) for cpus in configs[name]["worker_cpus"]] == [set(os.sched_getaffinity(0))]
    assert "| image-opencv | a) `affrun torchrun` |" in proc.stdout  # the markdown table
