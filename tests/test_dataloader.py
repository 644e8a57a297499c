"""DataLoader workers never collapse onto one CPU under affrun's defaults (docs/design.md §2), with real torch workers."""

from __future__ import annotations

import os
import sys

import pytest

from launcher.torch import worker_cpus
from tests.launch import PROGRAMS, affrun_argv, clean_env, json_lines, require_torch, run

NCPU = len(os.sched_getaffinity(0))
PROBE = str(PROGRAMS / "loader_probe.py")
COLLAPSE_ENV = {"OMP_PLACES": "cores", "OMP_PROC_BIND": "close"}


@pytest.fixture(autouse=True)
def _torch() -> None:
    require_torch()


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
    # affrun's safe policy replaced the per-core places: workers inherit the rank's whole compute set
    for mask in report["workers"]:  # type: ignore[union-attr]
        assert len(mask) == NCPU


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
