"""``affrun run`` with real launchers: accelerate, Lightning, DeepSpeed, torch.multiprocessing.spawn + bind_rank.

Every process records the binding it really runs with (/proc/self/status, os.environ) into a directory; the
expected values come from the plan ``affrun run --dry-run`` prints for the same options, never from constants.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.base.cpulist import format_cpulist, parse_cpulist
from tests.conftest import ROOT, need

PROGRAMS = ROOT / "tests" / "programs"
BIN = Path(sys.executable).parent
AFFRUN = str(BIN / "affrun")

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def plan_of(*options: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The plan ``affrun run OPTIONS`` hands to the job (started with ``env`` added), from its --dry-run."""
    out = subprocess.run([AFFRUN, "run", *options, "--dry-run"], capture_output=True, text=True, timeout=60,
                         check=True, env={**os.environ, **(env or {})}).stdout
    (line,) = [ln for ln in out.splitlines() if ln.startswith("AFFRUN_PLAN=")]
    plan: dict[str, Any] = json.loads(line.removeprefix("AFFRUN_PLAN="))["plan"]
    return plan


def run_job(tmp_path: Path, options: list[str], command: list[str], timeout: int = 240,
            env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    probe = tmp_path / "probe"
    probe.mkdir()
    full_env = {**os.environ, "PROBE_DIR": str(probe), "PATH": f"{BIN}:{os.environ['PATH']}", **(env or {})}
    full_env.pop("AFFRUN_RUN", None)
    proc = subprocess.run([AFFRUN, "run", *options, "--", *command], capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=tmp_path)
    records = [json.loads(p.read_text()) for p in sorted(probe.iterdir())]
    return proc, records


def by_rank(records: list[dict[str, Any]], key: str = "local_rank") -> dict[int, dict[str, Any]]:
    ranks = [r for r in records if r["kind"] == "rank"]
    out = {int(r[key]): r for r in ranks}
    assert len(out) == len(ranks), ranks
    return out


def assert_matches_plan(ranks: dict[int, dict[str, Any]], plan: dict[str, Any]) -> None:
    assert sorted(ranks) == [r["local_rank"] for r in plan["ranks"]]
    for planned in plan["ranks"]:
        got = ranks[planned["local_rank"]]
        assert parse_cpulist(got["mask"]) == frozenset(planned["cpus"]), (got, planned)
        assert got["OMP_NUM_THREADS"] == str(planned["threads"]), (got, planned)
    masks = [parse_cpulist(r["mask"]) for r in ranks.values()]
    assert sum(len(m) for m in masks) == len(frozenset().union(*masks)), f"ranks overlap: {masks}"


# ----------------------------------------------------------------------------------------------- accelerate
def test_accelerate_launch_two_processes(tmp_path: Path) -> None:
    """accelerate's torchrun-based launcher (--multi_gpu) runs on CPU: Accelerator(cpu=True) is MULTI_CPU/gloo."""
    need(have("accelerate"), "accelerate is not installed (tests/run_all.sh installs the test extra)")
    options = ["--nproc-per-node", "2"]
    plan = plan_of(*options)
    proc, records = run_job(tmp_path, options, [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes",
                                                "2", "--num_machines", "1", "--mixed_precision", "no",
                                                "--dynamo_backend", "no", str(PROGRAMS / "accelerate_probe.py")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = by_rank(records)
    assert {r["distributed"] for r in ranks.values()} == {"DistributedType.MULTI_CPU"}
    assert_matches_plan(ranks, plan)


# ----------------------------------------------------------------------------------------------- Lightning
def test_lightning_ddp_two_cpu_devices(tmp_path: Path) -> None:
    """Rank 0 is the script itself (no LOCAL_RANK): bound at start; ranks disjoint; spawn DataLoader workers stay
    on their rank's CPUs (not collapsed onto one) and are not rebound as ranks (forkserver: the test below)."""
    need(have("pytorch_lightning"), "pytorch-lightning is not installed")
    options = ["--nproc-per-node", "2"]
    plan = plan_of(*options)
    proc, records = run_job(tmp_path, options, [sys.executable, str(PROGRAMS / "lightning_train.py"), "spawn"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = by_rank(records)
    assert_matches_plan(ranks, plan)
    starts = {r["pid"]: r for r in records if r["kind"] == "start"}
    rank0 = ranks[0]
    assert starts[rank0["pid"]]["LOCAL_RANK"] is None  # Lightning's rank 0 is the script, and affrun set no LOCAL_RANK
    assert parse_cpulist(starts[rank0["pid"]]["mask"]) == frozenset(plan["ranks"][0]["cpus"])  # bound before imports
    workers = [r for r in records if r["kind"] == "worker"]
    assert {int(w["AFFRUN_LOCAL_RANK"]) for w in workers} == set(ranks)  # both ranks' workers ran
    assert {w["ppid"] for w in workers} == {r["pid"] for r in ranks.values()}  # spawned by the ranks themselves
    for w in workers:
        owner = int(w["AFFRUN_LOCAL_RANK"])
        assert parse_cpulist(w["mask"]) <= frozenset(plan["ranks"][owner]["cpus"]), w
        assert w["OMP_PLACES"] is None  # no per-thread place to pin the worker's main thread to
    for owner in ranks:  # each worker on its home (the rank's hooks), together on all of the rank's CPUs
        masks = [parse_cpulist(w["mask"]) for w in workers if int(w["AFFRUN_LOCAL_RANK"]) == owner]
        assert frozenset().union(*masks) == frozenset(plan["ranks"][owner]["cpus"]), masks


def test_dataloader_workers_go_to_loader_cores(tmp_path: Path) -> None:
    """With --loader-cores, spawn and forkserver DataLoader workers move to the rank's loader CPUs."""
    need(len(os.sched_getaffinity(0)) >= 2, "needs 2 CPUs")
    options = ["--nproc-per-node", "1", "--loader-cores", "1"]
    plan = plan_of(*options)
    (rank,) = plan["ranks"]
    need(rank["loader_cpus"], "the plan has no loader CPUs here")
    for context in ("spawn", "forkserver"):
        sub = tmp_path / context
        sub.mkdir()
        proc, records = run_job(sub, options, [sys.executable, str(PROGRAMS / "loader_workers.py"), context])
        assert proc.returncode == 0, proc.stderr[-3000:]
        (main,) = [r for r in records if r["kind"] == "rank"]
        assert parse_cpulist(main["mask"]) == frozenset(rank["cpus"])
        workers = [r for r in records if r["kind"] == "worker"]
        assert workers
        assert {parse_cpulist(w["mask"]) for w in workers} == {frozenset(rank["loader_cpus"])}, (context, workers)


# ----------------------------------------------------------------------------------------------- mp.spawn
@pytest.mark.parametrize("under_run", [False, True])
def test_spawn_with_bind_rank(tmp_path: Path, under_run: bool) -> None:
    """Two spawned ranks bind themselves with bind_rank: disjoint, and every thread (OpenMP pool threads started
    before and after the call) inside the rank's mask."""
    need(len(os.sched_getaffinity(0)) >= 2, "needs 2 CPUs")
    options = ["--nproc-per-node", "2"]
    plan = plan_of(*options)
    command = [sys.executable, str(PROGRAMS / "spawn_probe.py"), "before"]
    if under_run:
        proc, records = run_job(tmp_path, options, command)
    else:
        probe = tmp_path / "probe"
        probe.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("AFFRUN_RUN", "AFFRUN_PLAN")}
        proc = subprocess.run(command, capture_output=True, text=True, timeout=240, env={**env, "PROBE_DIR": str(probe)})
        records = [json.loads(p.read_text()) for p in sorted(probe.iterdir())]
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = by_rank(records)
    assert_matches_plan(ranks, plan)
    for i, r in ranks.items():
        assert r["threads"] == [format_cpulist(plan["ranks"][i]["cpus"])], r  # every thread, pool included
        assert any("per-thread places" in n for n in r["not_applied"])  # libgomp read OMP_PLACES at import torch


# ----------------------------------------------------------------------------------------------- DeepSpeed
def _deepspeed() -> str:
    need(have("deepspeed") and (BIN / "deepspeed").exists(), "deepspeed is not installed")
    return str(BIN / "deepspeed")


def test_deepspeed_launcher_on_cpu(tmp_path: Path) -> None:
    deepspeed = _deepspeed()
    options = ["--nproc-per-node", "2"]
    plan = plan_of(*options)
    proc, records = run_job(tmp_path, options, [deepspeed, "--num_gpus", "2", str(PROGRAMS / "rank_probe_plain.py")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_matches_plan(by_rank(records, key="LOCAL_RANK"), plan)


def test_doctor_double_binding_deepspeed(tmp_path: Path) -> None:
    need(shutil.which("numactl"), "numactl is not installed (DeepSpeed binds through it)")
    deepspeed = _deepspeed()
    proc, records = run_job(tmp_path, ["--nproc-per-node", "2"],
                            [deepspeed, "--bind_cores_to_rank", "--num_gpus", "2", str(PROGRAMS / "doctor_in_rank.py")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "double-binding" in proc.stderr  # affrun run's own warning, before it starts deepspeed
    doctors = [r for r in records if r["kind"] == "doctor"]
    assert len(doctors) == 2
    for d in doctors:
        assert "double-binding" in d["findings"], d
        assert any("--bind_cores_to_rank" in m for m in d["messages"]), d


def test_doctor_double_binding_accelerate(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("AFFRUN_RUN", "AFFRUN_PLAN", "AFFRUN_CPUS")}

    def findings(cmd: list[str]) -> list[str]:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                             env={**env, "ACCELERATE_CPU_AFFINITY": "1"})
        return [f["id"] for f in json.loads(out.stdout)["findings"]]

    assert "double-binding" in findings([AFFRUN, "run", "--nproc-per-node", "2", "--", AFFRUN, "doctor", "--json"])
    assert "double-binding" not in findings([AFFRUN, "doctor", "--json"])  # accelerate alone binds once
