"""The GPU-feed benchmark (benchmarks/gpu_feed.py) runs end to end: every configuration is launched for real
(torchrun, affrun torchrun) for a fraction of a second, and the JSON holds every figure, with the right types.
No timing is asserted; the CPUs the DataLoader workers were confined to are (a user checks them in /proc).
The affrun variants it measures follow the installed affrun's option table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.base.cpulist import parse_cpulist
from launcher.options.table import BINDING_OPTIONS
from tests.conftest import ROOT, need
from tests.launch import clean_env

BENCH = ROOT / "benchmarks" / "gpu_feed.py"
sys.path.insert(0, str(BENCH.parent))  # the benchmarks import their siblings by name, as when run as scripts
BASELINES = ("torchrun", "torchrun-collapse", "kmp-disabled", "oversubscribed", "affrun")


def test_variants_follow_the_installed_option_table() -> None:
    """A flag or choice this affrun lacks is skipped with the reason; a new choice becomes a variant by itself."""
    import gpu_feed

    now = gpu_feed.installed_affrun_options()
    variants, skipped = gpu_feed.affrun_variants(2, now)
    names = {v.name for v in variants}
    assert {f"affrun-omp-bind-{c}" for c in now["--omp-bind"][0] or () if c != now["--omp-bind"][1]} <= names
    # An affrun with --spill loader|compute|none (default loader) and no "core" layout for --omp-bind:
    later = {**now, "--spill": (("loader", "compute", "none"), "loader"), "--omp-bind": (("rank",), "rank")}
    variants, skipped = gpu_feed.affrun_variants(2, later)
    names = {v.name for v in variants}
    assert {"affrun-spill-compute", "affrun-spill-none"} <= names
    assert not any(n.startswith("affrun-omp-bind-core") for n in names)
    assert {"name": "affrun-omp-bind-core-init", "reason": "this affrun has no --omp-bind core"} in skipped
    # Too few cores per rank for --loader-cores 1 to leave a compute core.
    _, skipped = gpu_feed.affrun_variants(1, now)
    assert any(s["name"] == "affrun-loader-cores-1" and "2 cores per rank" in s["reason"] for s in skipped)


@pytest.mark.slow
@pytest.mark.torch
def test_gpu_feed_reports_every_figure(tmp_path: Path) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        need(False, "matplotlib is not installed (pip install '.[benchmarks]')")
    need((Path(sys.prefix) / "lib" / "libiomp5.so").exists(), "libiomp5.so not found (pip install intel-openmp)")
    cores = len(os.sched_getaffinity(0))
    ranks = min(2, cores)
    out_json, out_png = tmp_path / "feed.json", tmp_path / "feed.png"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--ranks", str(ranks), "--repeats", "1", "--seconds", "0.5", "--warmup", "0.2",
         "--json", str(out_json), "--png", str(out_png)],
        env=clean_env(), capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out_json.read_text())
    assert isinstance(report["device"], str) and report["device"]
    assert report["cores"] == cores and report["ranks"] == ranks
    configs = {c["name"]: c for c in report["configs"]}
    # One variant per non-default choice of the affrun options the benchmark varies, where this affrun has them.
    expected_variants = {f"affrun-{o.flag.lstrip('-')}-{choice}" for o in BINDING_OPTIONS
                         if o.flag in ("--omp-bind", "--spill") for choice in (o.choices or ()) if choice != o.default}
    # Each is measured, or skipped with its reason (a planning variant that gives this machine affrun's default
    # plan, --spill on one NUMA node, has nothing different to measure).
    skipped = {s["name"]: s["reason"] for s in report["skipped"]}
    assert set(BASELINES) <= set(configs), sorted(configs)
    assert expected_variants <= set(configs) | set(skipped), (sorted(configs), skipped)
    assert all(skipped[name] for name in expected_variants - set(configs)), skipped
    for c in configs.values():
        assert isinstance(c["samples_per_s"], float) and c["samples_per_s"] >= 0, c
        assert isinstance(c["device_wait_fraction"], float) and 0.0 <= c["device_wait_fraction"] <= 1.0, c
        assert c["migrations_per_s"] is None or isinstance(c["migrations_per_s"], float), c
        assert c["gpu_util"] is None or isinstance(c["gpu_util"], float), c
        if c["status"] == "ok":
            assert c["samples_per_s"] > 0 and isinstance(c["migrations_per_s"], float), c
        else:
            assert c["error"], c  # a failed launch says why, and the benchmark goes on
    if report["device"] == "cpu":
        assert all(c["gpu_util"] is None for c in configs.values())
    # The collapse confines every rank's workers to one CPU; affrun's workers keep the cores of their ranks.
    assert configs["torchrun-collapse"]["status"] == "ok", configs["torchrun-collapse"]
    assert len(parse_cpulist(configs["torchrun-collapse"]["worker_cpus"])) == 1
    assert configs["affrun"]["status"] == "ok", configs["affrun"]
    assert configs["affrun"]["vs_affrun"] == 1.0  # each ratio is against affrun's run of the same benchmark
    for c in configs.values():
        assert c["vs_affrun"] == round(c["samples_per_s"] / configs["affrun"]["samples_per_s"], 3), c
    assert parse_cpulist(configs["affrun"]["worker_cpus"]) == frozenset(os.sched_getaffinity(0))
    # The ceiling: the same device step with the batch already there, no loader; every figure is read against it.
    assert configs["ceiling"]["status"] == "ok", configs["ceiling"]
    assert report["ceiling"]["samples_per_s"] == configs["ceiling"]["samples_per_s"]
    for c in configs.values():
        assert c["vs_ceiling"] == round(c["samples_per_s"] / configs["ceiling"]["samples_per_s"], 3), c
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in configs:
        assert name in proc.stdout  # the table
