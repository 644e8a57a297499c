"""``affrun tune`` through its entry point, with real torch DataLoaders and short trials: the best it picks is the
one an independent measurement (the loop's own count, without the meter) favours; later failing trials are
skipped; the user's arguments arrive byte for byte and no process of a trial outlives it (Ctrl-C included); a
first trial that fails or never iterates a DataLoader is one error line; --save/--tuned round trip, a flag on the
command line wins, and a file tuned on another machine gets a warning naming the difference."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.errors import error_lines
from tests.launch import PROGRAMS, affrun, affrun_argv, alive, clean_env, communicate, default_sigint, json_lines, run
from tests.machines import fake_cpu_4000_tree

pytestmark = pytest.mark.torch

FEED_LOOP = str(PROGRAMS / "tune_loop.py")
SHORT = ("--trial-seconds", "2", "--warmup-seconds", "1")


def _tune(*args: str) -> subprocess.CompletedProcess[str]:
    """``affrun tune ARGS``: its trials start torch each time, up to half a minute apiece on a busy 2-CPU machine."""
    return run(affrun_argv("tune", *args), env=clean_env(), timeout=900)


def _own_rate(*options: str) -> float:
    """The loop's own batches/s under ``affrun torchrun OPTIONS``, without the meter (the independent figure)."""
    proc = affrun("torchrun", "--nproc-per-node", "1", *options, FEED_LOOP, "--workers", "ask", "--io-ms", "20",
                  "--seconds", "5")
    assert proc.returncode == 0, proc.stderr
    return float(json_lines(proc.stdout)[-1]["batches_per_s"])


def test_the_best_is_what_the_loops_own_count_favours(tmp_path: Path) -> None:
    """A loop whose items wait 20 ms (storage): workers feed it faster. The trial with one worker fails on
    purpose (a later failing trial is reported and skipped)."""
    saved, svg = tmp_path / "tuned.yaml", tmp_path / "tune.svg"
    proc = _tune("--nproc-per-node", "1", *SHORT, "--json", "--save", str(saved), "--svg", str(svg),
                  FEED_LOOP, "--workers", "ask", "--io-ms", "20", "--fail-with-workers", "1")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    best = result["best"]["options"]
    assert best and not result["best"]["default_stands"], result
    cores, workers = int(best[1]), int(best[3])
    assert workers >= 2 and cores >= 1  # the one-worker trial failed; two beat none
    by_options = {tuple(t["options"]): t for t in result["trials"]}
    assert by_options[("--loader-cores", "1", "--loader-workers", "1")]["failures"]
    assert "failed (exit" in proc.stderr and "skipped" in proc.stderr
    assert result["workers"].startswith("the script asks affrun")
    assert {t["workers_source"] for t in result["trials"] if t["median"]} == {"asked"}
    for trial in (t for t in result["trials"] if t["median"]):  # the meter's verdict of each trial (issue 39)
        assert 0 <= trial["cpu_wait_fraction"] <= 1 and trial["gpu_busy_fraction"] is None, trial
        assert trial["verdict"]["verdict"] == "unknown", trial  # no NVML here
    default_verdict = result["trials"][0]["verdict"]  # its items wait 20 ms each, no worker: starved
    assert default_verdict["likely"] in ("starved-by-data", "starved-of-cpu"), default_verdict
    # the independent measurement: the loop's own count under the best options and under the default
    tuned_own, default_own = _own_rate(*best), _own_rate()
    assert tuned_own > 1.3 * default_own, (tuned_own, default_own)
    tuned_meter = by_options[tuple(best)]["median"]
    assert 0.5 * tuned_own < tuned_meter < 2 * tuned_own, (tuned_meter, tuned_own)
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    # --save, then --tuned applies it (the dry run prints the rank's loader CPUs); a flag given here wins
    text = saved.read_text()
    assert "loader-cores" in text and "cpu-model" in text and "date" in text
    applied = affrun("torchrun", "--tuned", str(saved), "--dry-run", "--nproc-per-node", "1", FEED_LOOP)
    assert applied.returncode == 0, applied.stderr
    assert f"loader {1 if cores == 1 else ''}" in applied.stderr and "warning" not in applied.stderr
    overridden = affrun("torchrun", "--tuned", str(saved), "--loader-cores", "0", "--dry-run",
                        "--nproc-per-node", "1", FEED_LOOP)
    assert "loader - " in overridden.stderr, overridden.stderr


def test_arguments_arrive_byte_for_byte_and_ctrl_c_leaves_no_process(tmp_path: Path) -> None:
    record = tmp_path / "record"
    record.mkdir()
    weird = ["--trial-seconds", "99", "-h", "--", "a b", "caf\udcc3\udca9", "", "--json", "--nproc-per-node=9"]
    argv = affrun_argv("tune", "--nproc-per-node", "1", *SHORT, FEED_LOOP, "--workers", "2", "--record", str(record),
                       *weird)
    with subprocess.Popen(argv, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=default_sigint) as child:
        deadline = time.monotonic() + 240
        while not list(record.glob("pid-*")) or len(list(record.glob("pid-*"))) < 2:
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.2)
        time.sleep(2)  # the job runs, its workers too
        child.send_signal(signal.SIGINT)
        out, err = communicate(child, 120)
    assert child.returncode == 130, err
    assert "interrupted" in out and "trial" in out.splitlines()[0]
    expected = [os.fsencode(a).hex() for a in ["--workers", "2", "--record", str(record), *weird]]
    assert json.loads((record / "argv").read_text()) == expected
    pids = [int(p.name[4:]) for p in record.glob("pid-*")]
    assert len(pids) >= 2  # the rank and at least one DataLoader worker
    assert not [pid for pid in pids if alive(pid)], [(pid, (record / f"pid-{pid}").read_text()) for pid in pids]


@pytest.mark.parametrize("padding", [0, 200_000])
def test_a_first_trial_that_fails_is_one_error_line(padding: int) -> None:
    # The script's error, not torchrun's summary; with a message of 200 kB (three times what tune once kept of a
    # trial's output, whose last 64 KiB then began inside it) not torchrun's frame that followed it either.
    proc = _tune("--nproc-per-node", "1", *SHORT, FEED_LOOP, "--fail", "--fail-padding", str(padding))
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = error_lines(proc.stderr)
    assert "failed in its first trial" in line and "exit" in line
    if padding:
        assert "ValueError: failing on purpose padding padding" in line, line
    else:
        assert line.endswith("ValueError: failing on purpose"), line


@pytest.mark.parametrize("extra", [("--seconds", "1"), ("--start-seconds", "3")])
def test_a_script_without_a_dataloader_is_one_error_line(extra: tuple[str, ...]) -> None:
    before, after = (extra, ()) if extra[0] == "--start-seconds" else ((), extra)
    proc = _tune("--nproc-per-node", "1", *SHORT, *before, FEED_LOOP, "--no-loader", *after)
    assert proc.returncode == 2, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert "never iterated a torch DataLoader" in line


def test_the_budget_stops_with_what_it_has() -> None:
    proc = _tune("--nproc-per-node", "1", *SHORT, "--budget", "1", FEED_LOOP)
    assert proc.returncode == 0, proc.stderr
    assert "budget" in proc.stdout and "default" in proc.stdout


def _dry_run(command: str) -> tuple[list[str], list[str]]:
    """``command``'s dry run of two ranks of the feed loop: the words before affrun's options, and after."""
    head = {"torchrun": ["torchrun", "--dry-run", "--nproc-per-node", "2"],
            "exec": ["exec", "--dry-run", "--local-rank", "0", "--nproc-per-node", "2"],
            "run": ["run", "--dry-run", "--nproc-per-node", "2"]}[command]
    return head, [FEED_LOOP] if command == "torchrun" else ["--", "python3", FEED_LOOP]


@pytest.mark.parametrize("command", ["torchrun", "exec", "run"])
def test_a_file_tuned_on_another_machine_gets_a_warning(tmp_path: Path, command: str) -> None:
    root = fake_cpu_4000_tree(tmp_path)
    foreign, home = tmp_path / "foreign.yaml", tmp_path / "home.yaml"
    foreign.write_text("affrun-tuned: 1\noptions:\n  loader-cores: 1\n  loader-workers: 3\nmachine:\n"
                       "  cpu-model: Other CPU\n  packages: 1\n  cores: 64\n  cpus: 128\n  gpus: []\n"
                       "date: '2026-01-01'\n")
    home.write_text(foreign.read_text().replace("Other CPU", "Fake CPU 4000").replace("64", "4")
                    .replace("128", "4"))
    head, tail = _dry_run(command)
    proc = affrun(*head, "--fsroot", str(root), "--tuned", str(foreign), *tail)
    assert proc.returncode == 0, proc.stderr
    (warning,) = [line for line in proc.stderr.splitlines() if "tuned on another machine" in line]
    assert "cpu-model 'Other CPU' there, 'Fake CPU 4000' here" in warning and "cores 64 there, 4 here" in warning
    same = affrun(*head, "--fsroot", str(root), "--tuned", str(home), *tail)
    assert same.returncode == 0 and "tuned on another machine" not in same.stderr, same.stderr
    if command == "exec":
        assert "AFFRUN_LOADER_WORKERS=3" in same.stdout and "AFFRUN_LOADER_CPUS=" in same.stdout, same.stdout


@pytest.mark.parametrize("command", ["torchrun", "exec", "run"])
@pytest.mark.parametrize("given", ["flag", "tuned"])
def test_zero_loader_workers_reach_the_rank(tmp_path: Path, command: str, given: str) -> None:
    """``--loader-workers 0`` (what ``tune --save`` writes when the loop is fastest without workers), on the command
    line or from a tuned file: every launcher exports it (``affrun exec`` took 0 for "not given", and the script's
    loader_workers() fell back to the plan's count)."""
    root = fake_cpu_4000_tree(tmp_path)
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text("affrun-tuned: 1\noptions:\n  loader-cores: 1\n  loader-workers: 0\n")
    options = ["--tuned", str(tuned)] if given == "tuned" else ["--loader-cores", "1", "--loader-workers", "0"]
    head, tail = _dry_run(command)
    proc = affrun(*head, "--fsroot", str(root), *options, *tail)
    assert proc.returncode == 0, proc.stderr
    assert "AFFRUN_LOADER_WORKERS=0" in proc.stdout, proc.stdout


def test_sbatch_hands_the_tuned_file_to_the_job(tmp_path: Path) -> None:
    tuned = tmp_path / "t.yaml"
    tuned.write_text("affrun-tuned: 1\noptions:\n  loader-cores: 1\n")
    proc = affrun("sbatch", "--tuned", str(tuned), "--", "train.py")
    assert proc.returncode == 0, proc.stderr
    assert f"--tuned {tuned}" in proc.stdout
    bad = affrun("sbatch", "--tuned", str(tmp_path / "missing.yaml"), "--", "train.py")
    assert bad.returncode == 2 and len(error_lines(bad.stderr)) == 1
