"""DataLoader workers never collapse onto one CPU under affrun's defaults (docs/design.md §2), with real torch workers."""

from __future__ import annotations

import os
import sys

import pytest

from launcher.base.cpulist import parse_cpulist
from launcher.torch import worker_cpus
from tests.launch import (
    PROGRAMS,
    TORCH_RUNTIMES,
    affrun_argv,
    clean_env,
    display_affinity_env,
    json_lines,
    run,
    runtime_env,
    thread_bindings,
)

pytestmark = pytest.mark.torch

NCPU = len(os.sched_getaffinity(0))
PROBE = str(PROGRAMS / "loader_probe.py")
COLLAPSE_ENV = {"OMP_PLACES": "cores", "OMP_PROC_BIND": "close"}


def _report(argv: list[str], **env: str) -> dict[str, object]:
    proc = run(argv, env=clean_env(**env), check=True)
    (report,) = json_lines(proc.stdout)
    return report


def test_the_collapse_is_real_without_affrun() -> None:
    # The baseline this feature exists for: the user's binding variables pin the main thread at import torch,
    # and every forked worker inherits that single CPU.
    if NCPU < 2:
        pytest.skip("needs 2 CPUs to show a collapse")
    report = _report([sys.executable, PROBE, "plain", "2"], **COLLAPSE_ENV)
    assert len(report["main"]) == 1  # type: ignore[arg-type]
    assert all(len(w) == 1 for w in report["workers"])  # type: ignore[union-attr]


def test_default_affrun_keeps_workers_spread_even_without_worker_init_fn() -> None:
    report = _report(affrun_argv("exec", "--", sys.executable, PROBE, "plain", "2"), **COLLAPSE_ENV)
    # affrun's safe policy replaced the per-core places, and the rank's hooks give each worker its home in the
    # thread plan: together the workers span the rank's whole compute set (tests/system/test_thread_homes.py)
    workers = [set(mask) for mask in report["workers"]]  # type: ignore[union-attr]
    assert set().union(*workers) == os.sched_getaffinity(0)
    assert NCPU < 2 or all(len(w) < NCPU for w in workers)
    hooks_off = _report(affrun_argv("exec", "--rank-hooks", "none", "--", sys.executable, PROBE, "plain", "2"),
                        **COLLAPSE_ENV)
    for mask in hooks_off["workers"]:  # type: ignore[union-attr]
        assert len(mask) == NCPU  # without the hooks: the rank's whole set, inherited


def test_worker_init_fn_gives_each_worker_its_own_cpus_with_core_binding() -> None:
    report = _report(affrun_argv("exec", "--omp-bind", "core", "--", sys.executable, PROBE, "init", str(NCPU)))
    workers = report["workers"]
    assert len(workers) == NCPU  # type: ignore[arg-type]
    flat = [c for w in workers for c in w]  # type: ignore[union-attr]
    assert sorted(flat) == sorted(os.sched_getaffinity(0)), "workers must be on distinct CPUs"


def test_worker_init_fn_uses_the_loader_cores() -> None:
    if NCPU < 2:
        pytest.skip("needs 2 CPUs for one compute and one loader core")
    report = _report(affrun_argv("exec", "--loader-cores", "1", "--", sys.executable, PROBE, "init", "2"))
    loader = {int(c) for c in str(report["loader_cpus"]).split(",")}
    for mask in report["workers"]:  # type: ignore[union-attr]
        assert set(mask) <= loader


def test_worker_init_fn_repairs_a_collapse_outside_affrun() -> None:
    if NCPU < 2:
        pytest.skip("needs 2 CPUs to show a collapse")
    report = _report([sys.executable, PROBE, "init", "2"], **COLLAPSE_ENV)
    flat = sorted(c for w in report["workers"] for c in w)  # type: ignore[union-attr]
    assert flat == sorted(os.sched_getaffinity(0))


# libomp 14 aborts fork() children under explicit places: tests/system/test_user_binding_env.py records that bug.
RUNTIME_STARTS = [(r, s) for r in TORCH_RUNTIMES for s in ("fork", "forkserver", "spawn")
                  if (r, s) != ("libomp14", "fork")]


@pytest.mark.parametrize(("runtime", "start"), RUNTIME_STARTS)
def test_core_binding_pins_the_other_threads_and_keeps_workers_wide(runtime: str, start: str) -> None:
    """``--omp-bind core`` without worker_init_fn: every OpenMP thread but the main one on a CPU of its own, as
    the runtime itself reports it, and the DataLoader workers on the whole rank, whatever starts them."""
    if NCPU < 2:
        pytest.skip("needs 2 CPUs: one core each for the main thread's team")
    proc = run(affrun_argv("exec", "--omp-bind", "core", "--rank-hooks", "none", "--", sys.executable,
                           PROBE, "plain", "2", start),  # the places alone: the hooks would give workers homes
               env=clean_env(**display_affinity_env(), **runtime_env(runtime)), check=True, timeout=240)
    (report,) = json_lines(proc.stdout)
    rank = parse_cpulist(str(report["rank_cpus"]))
    team = thread_bindings(proc.stdout + proc.stderr)[int(report["pid"])]  # type: ignore[call-overload]
    assert sorted(team) == list(range(len(rank))), proc.stderr
    assert team[0] == rank  # the main thread keeps the whole rank
    others = [team[t] for t in sorted(team) if t]
    assert all(len(c) == 1 for c in others) and len(frozenset().union(*others)) == len(others), team
    assert report["workers"] and all(set(w) == rank and len(w) > 1 for w in report["workers"])  # type: ignore[union-attr]


def test_loader_cores_reach_the_workers_without_worker_init_fn() -> None:
    """``affrun torchrun --loader-cores 1``: the main thread's place holds the loader CPU, so forked workers
    inherit it (worker_init_fn then narrows each worker to the loader CPUs alone)."""
    if NCPU < 2:
        pytest.skip("needs 2 CPUs for one compute and one loader core")
    proc = run(affrun_argv("torchrun", "--loader-cores", "1", "--nproc-per-node", "1", PROBE, "plain", "2"),
               env=clean_env(), check=True, timeout=240)
    (report,) = json_lines(proc.stdout)
    loader = parse_cpulist(str(report["loader_cpus"]))
    assert loader and report["workers"]
    for mask in report["workers"]:  # type: ignore[union-attr]
        assert loader <= set(mask)


@pytest.mark.parametrize(
    ("workers", "loader", "rank", "expected"),
    [
        (2, [], [0, 1, 2, 3], [[0, 1], [2, 3]]),
        (3, [], [0, 1, 2, 3], [[0, 1], [2], [3]]),
        (4, [6, 7], [0, 1, 2, 3, 6, 7], [[6], [7], [6], [7]]),
        (1, [6, 7], [0, 1, 6, 7], [[6, 7]]),
        (5, [], [4, 5], [[4], [5], [4], [5], [4]]),
    ],
)
def test_worker_cpus_slices(workers: int, loader: list[int], rank: list[int], expected: list[list[int]]) -> None:
    assert [worker_cpus(k, workers, loader, rank) for k in range(workers)] == expected
