"""``--feed-report``: the data wait each rank reports is the wait its loop measures itself, with real torch
DataLoaders (workers 0 and 2, fork and spawn, persistent, abandoned iterators, several loaders, killed ranks),
through ``affrun exec``, ``affrun torchrun`` and ``affrun run``; and without it, nothing is patched."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.feed.meter import live_paths
from tests.launch import PROGRAMS, affrun_argv, clean_env, json_lines, run

pytestmark = pytest.mark.torch

LOOP = str(PROGRAMS / "feed_loop.py")
POINTS = 0.04  # "within a few points": the meter and the loop time the same calls, a few microseconds apart
LINE = re.compile(r"^affrun: rank (\d+) feed: (\d+) batches in [\d.]+ s, [\d.]+ batches/s, data wait ([\d.]+)%"
                  r"(?:, cpu wait [\d.]+%)?(?:, gpu busy \d+%)? \((?:fed|starved|underused|unknown)[^\n]*\)$", re.M)


def _figures(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    assert isinstance(data, list)
    return data


def _agrees(mine: dict[str, Any], own: dict[str, Any]) -> None:
    """The meter's figures of one rank against the loop's own measurement."""
    assert mine["batches"] == own["batches"], (mine, own)
    assert mine["data_wait_fraction"] == pytest.approx(own["fraction"], abs=POINTS), (mine, own)
    assert mine["seconds"] == pytest.approx(own["seconds"], rel=0.05, abs=0.02), (mine, own)
    assert mine["batches_per_s"] == pytest.approx(own["batches"] / own["seconds"], rel=0.05), (mine, own)
    assert mine["num_workers"] == own["num_workers"] and mine["loaders"] == len(own["num_workers"])


def test_exec_meters_an_unmodified_loop_and_sums_its_loaders(tmp_path: Path) -> None:
    """No workers, two DataLoaders: one object for the rank, the batches and waits of both summed."""
    out = tmp_path / "feed.json"
    proc = run(affrun_argv("exec", "--feed-json", str(out), "--", "python", LOOP, "--loaders", "2"), check=True)
    (own,) = json_lines(proc.stdout)
    assert 0.3 < own["fraction"] < 0.8, own  # the loop does wait: 10 ms of data for 10 ms of step
    (mine,) = _figures(out)
    _agrees(mine, own)
    assert mine["final"] is True and mine["rank"] == 0 and mine["pid"] == own["pid"]
    assert mine["workers_source"] == "script"
    (line,) = LINE.findall(proc.stderr)
    assert int(line[1]) == own["batches"] and float(line[2]) == pytest.approx(100 * own["fraction"], abs=100 * POINTS)
    assert own["patched"]
    assert not any(os.path.exists(p) for p in live_paths(own["pid"], os.getuid(), clean_env()))  # clean exit
    assert not any(os.path.exists(os.path.dirname(p)) for p in live_paths(own["pid"], os.getuid(), clean_env())) \
        or any(name.endswith(".json") for d in {os.path.dirname(p) for p in live_paths(1, os.getuid(), clean_env())}
               if os.path.isdir(d) for name in os.listdir(d))  # the directory too, unless another rank uses it


@pytest.mark.parametrize("extra", [
    ["--context", "fork", "--abandon", "3", "--epochs", "2"],
    ["--context", "spawn", "--persistent", "--abandon", "3", "--epochs", "2"],
], ids=["fork-abandoned", "spawn-persistent-abandoned"])
def test_torchrun_ranks_with_two_workers(tmp_path: Path, extra: list[str]) -> None:
    """Two ranks of two workers each; the first epoch's iterator is left mid-epoch, then a full epoch."""
    out = tmp_path / "feed.json"
    argv = affrun_argv("torchrun", "--nproc-per-node", "2", "--feed-json", str(out), "--feed-interval", "0.2",
                       LOOP, "--workers", "2", "--item-sleep", "0.02", "--items", "32", *extra)
    proc = run(argv, check=True, timeout=300)
    owns = {o["pid"]: o for o in json_lines(proc.stdout)}
    figures = _figures(out)
    assert [f["rank"] for f in figures] == [0, 1]
    for mine in figures:
        _agrees(mine, owns[mine["pid"]])
        assert mine["num_workers"] == [2] and mine["final"] is True
    finals = LINE.findall(proc.stderr)
    assert {r for r, _, _ in finals} == {"0", "1"} and len(finals) > 2  # the periodic lines, then the last ones
    assert sorted(os.listdir(tmp_path)) == ["feed.json"]  # no temporary file left beside it
    for pid in owns:
        assert not any(os.path.exists(p) for p in live_paths(pid, os.getuid(), clean_env())), pid


def test_run_meters_rank_zero(tmp_path: Path) -> None:
    out = tmp_path / "feed.json"
    proc = run(affrun_argv("run", "--feed-json", str(out), "--", "python", LOOP), check=True)
    (own,) = json_lines(proc.stdout)
    (mine,) = _figures(out)
    _agrees(mine, own)


@pytest.mark.parametrize("command", [["exec", "--"], ["run", "--"]])
def test_without_feed_report_nothing_is_patched_or_imported(command: list[str]) -> None:
    proc = run(affrun_argv(*command, "python", LOOP, "--items", "4"), check=True)
    (own,) = json_lines(proc.stdout)
    assert not own["patched"] and own["affrun_modules"] == [], own
    assert "feed:" not in proc.stderr


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
    """The rank's line on stdout (it has iterated and hangs), then the JSON's figures of a later flush."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    own: dict[str, Any] = json.loads(line)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            (mine,) = _figures(path)
            if mine["batches"] >= own["batches"] // 2:
                return own
        time.sleep(0.1)
    pytest.fail(f"{path} never held the figures; rank printed {line!r}")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_rank_keeps_its_figures(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGKILL: the figures of the last flush (about a second old) are there. SIGTERM: the final ones, and the
    rank still ends by SIGTERM."""
    out = tmp_path / "feed.json"
    argv = affrun_argv("exec", "--feed-json", str(out), "--", "python", LOOP, "--items", "100000",
                       "--hang-after", "250")
    with subprocess.Popen(argv, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            own = _wait_for(out, proc)
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == -sig
    (mine,) = _figures(out)
    assert mine["pid"] == own["pid"]
    assert mine["data_wait_fraction"] == pytest.approx(own["fraction"], abs=POINTS), (mine, own)
    if sig == signal.SIGTERM:
        assert mine["final"] is True and mine["batches"] == own["batches"]
        assert LINE.search(err), err
    else:
        assert mine["final"] is False and own["batches"] // 2 <= mine["batches"] <= own["batches"]


def test_tune_overrides_the_scripts_workers_and_a_script_may_ask(tmp_path: Path) -> None:
    """AFFRUN_FEED_FORCE_WORKERS=1 (affrun tune's trials): the script's num_workers=0 becomes --loader-workers'."""
    out = tmp_path / "feed.json"
    argv = affrun_argv("exec", "--feed-json", str(out), "--loader-workers", "2", "--", "python", LOOP, "--items", "8")
    proc = run(argv, env=clean_env(AFFRUN_FEED_FORCE_WORKERS="1"), check=True)
    (own,) = json_lines(proc.stdout)
    (mine,) = _figures(out)
    assert own["num_workers"] == [2] and mine["num_workers"] == [2] and mine["workers_source"] == "overridden"
    proc = run(affrun_argv("exec", "--feed-json", str(out), "--loader-workers", "3", "--", "python", LOOP,
                           "--items", "8", "--ask"), check=True)
    (own,) = json_lines(proc.stdout)
    (mine,) = _figures(out)
    assert own["num_workers"] == [3] and mine["workers_source"] == "asked"


def test_bad_feed_options_are_one_error_line(tmp_path: Path) -> None:
    for argv in (["--feed-interval", "0"], ["--feed-interval", "nan"], ["--loader-workers", "-1"],
                 ["--feed-json", str(tmp_path / "missing" / "f.json")], ["--feed-json", str(tmp_path)]):
        proc = run(affrun_argv("exec", *argv, "--", "true"))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (argv, proc.stderr)
        assert "error:" in proc.stderr and argv[0] in proc.stderr, (argv, proc.stderr)


WATCH = """
import json, os, sys, time
from torch.utils.data import DataLoader
path, inodes, end = sys.argv[1], set(), time.monotonic() + 2.5
while time.monotonic() < end:
    for _ in DataLoader(list(range(1000)), batch_size=1):
        try:
            inodes.add(os.stat(path).st_ino)  # each write renames a new file into place
        except FileNotFoundError:
            pass
print(json.dumps({"writes": len(inodes)}))
"""


def test_a_short_feed_interval_prints_lines_but_writes_the_files_once_a_second(tmp_path: Path) -> None:
    """--feed-interval 0.1 over 2.5 s of batches: about 25 lines, and the JSON file rewritten about once a second
    (it was rewritten at every line: 30x slower loops with --feed-interval 0.000001, now refused below 0.1)."""
    out = tmp_path / "feed.json"
    argv = affrun_argv("exec", "--feed-interval", "0.1", "--feed-json", str(out), "--", "python", "-c", WATCH, str(out))
    proc = run(argv, check=True)
    (seen,) = json_lines(proc.stdout)
    lines = [line for line in proc.stderr.splitlines() if LINE.search(line)]
    assert len(lines) >= 10, proc.stderr
    assert 1 <= seen["writes"] <= 5, seen  # 2.5 s: the first batch's write, then once per second
    refused = run(affrun_argv("exec", "--feed-interval", "0.05", "--", "true"))
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        "affrun: error: argument --feed-interval: '0.05' is not a number of seconds >= 0.1 (affrun exec --help gives "
        "the full usage)"]


def test_a_loader_worker_count_beyond_any_machine_is_refused_in_the_rank(tmp_path: Path) -> None:
    """AFFRUN_LOADER_WORKERS above --loader-workers' bound (set by hand, forced as affrun tune forces it) hung the
    rank starting workers; now one warning and the script's own num_workers."""
    env = clean_env(AFFRUN_FEED="1", AFFRUN_FEED_FORCE_WORKERS="1", AFFRUN_LOADER_WORKERS="99999999999999999999")
    proc = run(["python", LOOP, "--items", "8"], env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (own,) = json_lines(proc.stdout)
    assert own["num_workers"] == [0]
    assert [line for line in proc.stderr.splitlines() if "AFFRUN_LOADER_WORKERS" in line] == [
        "affrun: warning: AFFRUN_FEED_FORCE_WORKERS: AFFRUN_LOADER_WORKERS='99999999999999999999' is not a whole "
        "number from 0 to 65536; the script's num_workers are kept"]
