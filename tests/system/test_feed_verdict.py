"""``--feed-report`` judges a rank by what its main thread and its GPU got (issue 39): each real metered rank's JSON
and line carry the main thread's CPU wait (its run-queue delay, from schedstat), the GPU's busy share where NVML is
there (a fake ``pynvml`` module: this machine has no GPU), and one verdict. A busy neighbour on the rank's CPU
shows as CPU wait. And a large ``--feed-json`` costs the loop no stall (issue 40, item 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.feed import verdict as v
from tests.conftest import need
from tests.launch import PROGRAMS, affrun_argv, clean_env, json_lines, run
from tests.machines import FAKE_PYNVML

pytestmark = pytest.mark.torch

LOOP = str(PROGRAMS / "feed_loop.py")
BOTH = ("starved-by-data", "starved-of-cpu")  # a loop that waits for its data: which one the machine's load decides


@pytest.fixture(autouse=True)
def _schedstat() -> None:
    need(os.path.exists("/proc/thread-self/schedstat"), "the kernel keeps no schedstat (CONFIG_SCHED_INFO)")


def _metered(tmp_path: Path, *loop: str, env: dict[str, str] | None = None,
             front: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "feed.json"
    proc = run(affrun_argv("exec", *front, "--feed-report", "--feed-json", str(out), "--", sys.executable, LOOP,
                           *loop), env=clean_env(**(env or {})), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (mine,) = json.loads(out.read_text())
    return proc, mine


def _fake_nvml(tmp_path: Path, **variables: str) -> dict[str, str]:
    """The environment of a rank that sees one GPU through a fake NVML (:data:`tests.machines.FAKE_PYNVML`)."""
    where = tmp_path / "nvml"
    where.mkdir()
    (where / "pynvml.py").write_text(FAKE_PYNVML.format(gpus=[("00000000:17:00.0", "GPU-abc")]))
    return {"PYTHONPATH": str(where), "CUDA_VISIBLE_DEVICES": "0", **variables}


def _feed_line(stderr: str) -> str:
    (line,) = [x for x in stderr.splitlines() if x.startswith("affrun: rank 0 feed: ")]
    return line


def test_a_rank_without_nvml_reports_its_cpu_wait_and_an_unknown_verdict(tmp_path: Path) -> None:
    """No NVML here: no GPU figure (null, never 0), the verdict is unknown, and it says what the waits suggest (the
    loop waits half its time in next())."""
    proc, mine = _metered(tmp_path, "--items", "40")
    assert 0.0 <= mine["cpu_wait_fraction"] <= 1.0, mine
    assert mine["gpu_busy_fraction"] is None and mine["gpu_busy_source"] is None
    verdict = mine["verdict"]
    assert verdict["verdict"] == v.UNKNOWN and verdict["likely"] in BOTH, verdict
    assert "no GPU signal" in verdict["evidence"] and verdict["fix"]
    line = _feed_line(proc.stderr)
    assert f", cpu wait {100 * mine['cpu_wait_fraction']:.1f}% (unknown: no GPU signal; likely " in line, line
    assert "gpu busy" not in line


def test_a_gpu_busy_per_device_is_fed(tmp_path: Path) -> None:
    """NVML cannot tell processes apart (NOT_SUPPORTED): the device's busy share, 95%: fed."""
    proc, mine = _metered(tmp_path, "--items", "100", env=_fake_nvml(tmp_path, FAKE_NVML_UTIL="95"))
    assert mine["gpu_busy_fraction"] == pytest.approx(0.95) and mine["gpu_busy_source"] == "device", mine
    assert mine["verdict"]["verdict"] == v.FED and mine["verdict"]["fix"] == ""
    assert _feed_line(proc.stderr).endswith(", gpu busy 95% (fed)"), proc.stderr
    assert "warning" not in proc.stderr, proc.stderr


def test_the_rank_s_own_share_wins_over_a_device_busy_with_another_process(tmp_path: Path) -> None:
    """The device is 95% busy, but this process only 30% (NVML per process): the rank is starved, not fed."""
    proc, mine = _metered(tmp_path, "--items", "100",
                          env=_fake_nvml(tmp_path, FAKE_NVML_UTIL="95", FAKE_NVML_PROCESS_UTIL="30"))
    assert mine["gpu_busy_fraction"] == pytest.approx(0.30) and mine["gpu_busy_source"] == "process", mine
    assert mine["verdict"]["verdict"] in BOTH and "busy 30%" in mine["verdict"]["evidence"], mine
    assert f"gpu busy 30% ({mine['verdict']['verdict']}; " in _feed_line(proc.stderr)


def test_polls_between_nvml_s_samples_are_not_counted_as_idle(tmp_path: Path) -> None:
    """NVML takes a sample a period (1/6 s to 1 s by product); here one a second, this process 100% busy. A poll
    that finds no new sample counted as 0% (the first always, 3 in 4 at 4 Hz: the meter said 25-33%)."""
    (tmp_path / "state.json").write_text(json.dumps({"sample_period_s": 1}))
    env = _fake_nvml(tmp_path, FAKE_NVML_UTIL="100", FAKE_NVML_PROCESS_UTIL="100",
                     FAKE_NVML_STATE=str(tmp_path / "state.json"))
    _, mine = _metered(tmp_path, "--seconds", "3.5", env=env)
    assert mine["gpu_busy_source"] == "process" and mine["gpu_busy_fraction"] == pytest.approx(1.0), mine
    assert mine["verdict"]["verdict"] == v.FED, mine


def test_a_gpu_busy_with_other_processes_is_not_this_rank_s_share(tmp_path: Path) -> None:
    """NVML lists another process of this PID namespace on the GPU, 100% busy, and never this rank: no figure (the
    device's 100% would call the rank fed), and the verdict is unknown."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "state.json").write_text(json.dumps(
            {"utilisation": [100], "processes": [[other.pid]], "process_util": [{str(other.pid): 100}]}))
        _, mine = _metered(tmp_path, "--seconds", "2", env=_fake_nvml(
            tmp_path, FAKE_NVML_STATE=str(tmp_path / "state.json")))
    finally:
        other.kill()
        other.wait()
    assert mine["gpu_busy_fraction"] is None and mine["verdict"]["verdict"] == v.UNKNOWN, mine


@pytest.mark.parametrize("util", ["broken", "hang"])
def test_an_nvml_that_fails_or_hangs_costs_one_warning_at_most_and_never_the_exit(tmp_path: Path, util: str) -> None:
    """A GPU named by its UUID; NVML's utilisation call raises (one warning, no figure) or never returns (no figure,
    and the rank still exits at once: its sampler is a daemon thread)."""
    where = tmp_path / "nvml"
    where.mkdir()
    calls = {"broken": "raise RuntimeError('GPU is lost')", "hang": "time.sleep(3600)"}[util]
    (where / "pynvml.py").write_text(FAKE_PYNVML.format(gpus=[("00000000:17:00.0", "GPU-abc")])
                                     + f"def nvmlDeviceGetUtilizationRates(h):\n    {calls}\n")
    proc, mine = _metered(tmp_path, "--items", "100",
                          env={"PYTHONPATH": str(where), "CUDA_VISIBLE_DEVICES": "GPU-abc"})
    warnings = [x for x in proc.stderr.splitlines() if "warning" in x]
    assert len(warnings) == (util == "broken"), proc.stderr
    assert all("no GPU busy share" in w and "GPU is lost" in w for w in warnings), warnings
    assert mine["gpu_busy_fraction"] is None and mine["verdict"]["verdict"] == v.UNKNOWN, mine
    assert "Traceback" not in proc.stderr


def test_busy_neighbours_on_the_rank_s_cpu_are_its_cpu_wait(tmp_path: Path) -> None:
    """Three processes that spin on the rank's one CPU: its main thread, which computes each step, waits for that
    CPU, and the verdict's likely cause is the CPU, not the data."""
    cpu = str(min(os.sched_getaffinity(0)))
    spin = f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    neighbours = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(3)]
    try:
        proc, mine = _metered(tmp_path, "--items", "160", "--item-sleep", "0", "--step-sleep", "0",
                              "--step-spin", "0.005", front=("--cpus", cpu))
    finally:
        for n in neighbours:
            n.kill()
            n.wait()
    assert mine["cpu_wait_fraction"] > 0, mine
    assert mine["verdict"]["verdict"] == v.UNKNOWN and mine["verdict"]["likely"] == v.CPU, mine
    assert "likely starved-of-cpu" in _feed_line(proc.stderr)


def _figure(rank: int) -> dict[str, Any]:
    return {"rank": rank, "batches": 1200, "seconds": 61.3, "batches_per_s": 19.6, "data_wait_fraction": 0.42,
            "loaders": 1, "num_workers": [2], "workers_source": "script", "final": True, "pid": 100000 + rank,
            "host": "node-0001"}


BIG = json.dumps([_figure(r) for r in range(1, 80_001)], separators=(",", ":")).encode()  # 80,000 ranks: 14 MiB


def test_a_13_mib_feed_json_is_not_rewritten_while_the_loop_runs(tmp_path: Path) -> None:
    """80,000 valid figures, under the 16 MiB the front end takes: each periodic write merged the whole file in the
    loop's thread (0.4 s idle, 1-2 s under load, each a stall of the loop). Now the rank says once that it writes
    to such a file at exit only: the file is the same file while the loop runs, and the final figures (here at
    SIGTERM) join the others."""
    assert 12 << 20 < len(BIG) < 16 << 20
    out = tmp_path / "feed.json"
    out.write_bytes(BIG)
    before = out.stat()
    argv = affrun_argv("exec", "--feed-json", str(out), "--", sys.executable, LOOP, "--items", "100000",
                       "--item-sleep", "0", "--step-sleep", "0.002", "--hang-after", "300")
    with subprocess.Popen(argv, env=clean_env(RANK="0", WORLD_SIZE="2"), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:  # a rank of a 2-rank job: the file is kept
        assert proc.stdout is not None
        own = json.loads(proc.stdout.readline())  # 300 batches taken: the loop hangs
        during = out.stat()
        proc.terminate()
        _, stderr = proc.communicate(timeout=120)
    assert own["batches"] == 300 and proc.returncode == -15, stderr[-3000:]
    assert (during.st_ino, during.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), stderr[-3000:]
    warnings = [x for x in stderr.splitlines() if "warning" in x]
    assert len(warnings) == 1 and "at exit only" in warnings[0], stderr
    data = json.loads(out.read_bytes())
    assert len(data) == 80_001 and data[0]["rank"] == 0 and data[0]["final"] is True and data[1] == _figure(1)


def _loop_rate(tmp_path: Path, content: bytes, name: str) -> float:
    """The loop's own batches/s over 3 s, in a rank whose ``--feed-json`` holds ``content`` at the start."""
    out = tmp_path / name / "feed.json"
    out.parent.mkdir()
    out.write_bytes(content)
    proc = run(affrun_argv("exec", "--feed-json", str(out), "--", sys.executable, LOOP, "--seconds", "3",
                           "--items", "100000", "--item-sleep", "0", "--step-sleep", "0.002"),
               env=clean_env(RANK="0", WORLD_SIZE="2"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (own,) = json_lines(proc.stdout)
    return float(own["batches"] / own["seconds"])


def test_a_13_mib_feed_json_leaves_the_loop_its_rate(tmp_path: Path) -> None:
    """The same loop with that file and with an empty one, best of two runs each, interleaved: a generous bound
    (the benchmark benchmarks/feed_json_large.py gives the ratio)."""
    rates: dict[str, list[float]] = {"empty": [], "big": []}
    for i in range(2):
        for kind in ("empty", "big"):
            rates[kind].append(_loop_rate(tmp_path, b"" if kind == "empty" else BIG, f"{kind}{i}"))
    assert max(rates["big"]) >= 0.5 * max(rates["empty"]), rates
