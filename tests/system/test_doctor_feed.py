"""``affrun doctor --pid`` of a job under ``--feed-report``: each rank's data wait so far, against the wait the
rank's own loop measured, and ``feed-starved`` with the cause doctor sees; no file is left once the job ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from launcher.feed.meter import live_paths
from tests.conftest import need
from tests.launch import PROGRAMS, affrun_argv, clean_env, run

pytestmark = pytest.mark.torch
LOOP = str(PROGRAMS / "feed_loop.py")
POINTS = 0.04


@contextmanager
def job(argv: list[str], ranks: int) -> Iterator[tuple[subprocess.Popen[str], list[dict[str, Any]]]]:
    """Start ``argv`` (its ranks iterate, then hang: ``--hang-after``), wait for every rank's own figures and
    for its live file, yield; then SIGTERM the job and wait for it."""
    proc = subprocess.Popen(argv, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        owns = [json.loads(proc.stdout.readline()) for _ in range(ranks)]
        deadline = time.monotonic() + 60
        while not all(os.path.exists(live_paths(o["pid"], os.getuid(), clean_env())[0]) for o in owns):
            assert time.monotonic() < deadline, "no live file"
            time.sleep(0.1)
        yield proc, owns
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.communicate()


def _rank(own: dict[str, Any]) -> int:
    return int(own["rank"])


def _doctor(pid: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return run(affrun_argv("doctor", "--pid", str(pid), "--duration", "0.3", *extra), timeout=120)


def test_doctor_shows_each_ranks_wait_and_finds_the_starved_ones() -> None:
    argv = affrun_argv("torchrun", "--nproc-per-node", "2", "--feed-report", LOOP, "--items", "100000",
                       "--hang-after", "150")
    with job(argv, 2) as (proc, owns):
        report = json.loads(_doctor(proc.pid, "--json").stdout)
        text = _doctor(proc.pid).stdout
    by_pid = {p["pid"]: p for p in report["processes"]}
    for own in owns:
        feed = by_pid[own["pid"]]["feed"]
        assert by_pid[own["pid"]]["role"] == "rank"
        assert feed["data_wait_fraction"] == pytest.approx(own["fraction"], abs=POINTS), (feed, own)
        assert 0 < feed["batches"] <= own["batches"] and feed["batches_per_s"] > 0
    starved = [f for f in report["findings"] if f["id"] == "feed-starved"]
    subjects = "; ".join(f["subject"] for f in starved)  # one per rank, or one for both where the figures agree
    assert all(f"rank {r} (pid {o['pid']})" in subjects for r, o in enumerate(sorted(owns, key=_rank))), starved
    assert all("num_workers=0" in f["why"] and "affrun tune" in f["fix"] for f in starved)
    assert text.count("  feed: ") == 2 and "feed-starved" in text
    for own in owns:  # the job ended cleanly (SIGTERM): its live files are gone
        assert not any(os.path.exists(p) for p in live_paths(own["pid"], os.getuid(), clean_env()))


def test_too_few_workers_for_the_loader_cpus() -> None:
    need(len(os.sched_getaffinity(0)) >= 2, "needs 2 CPUs: one compute core and one loader core")
    argv = affrun_argv("exec", "--feed-report", "--loader-cores", "1", "--", "python", LOOP, "--items", "100000",
                       "--hang-after", "150", "--workers", "0")
    with job(argv, 1) as (proc, _):
        report = json.loads(_doctor(proc.pid, "--json").stdout)
    (starved,) = [f for f in report["findings"] if f["id"] == "feed-starved"]
    assert "too few workers for the loader CPUs: 0 worker(s) for" in starved["why"], starved


def test_a_fed_rank_is_not_starved() -> None:
    argv = affrun_argv("exec", "--feed-report", "--", "python", LOOP, "--items", "100000", "--hang-after", "60",
                       "--item-sleep", "0", "--step-sleep", "0.02")
    with job(argv, 1) as (proc, owns):
        report = json.loads(_doctor(proc.pid, "--json").stdout)
    (process,) = [p for p in report["processes"] if p["pid"] == owns[0]["pid"]]
    assert process["feed"]["data_wait_fraction"] < 0.2
    assert not [f for f in report["findings"] if f["id"] == "feed-starved"]
