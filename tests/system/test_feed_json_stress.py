"""The meter's ``--feed-json`` writes under stress: a SIGTERM that lands while the rank holds the flock of the
file's directory (the rank still writes its final figures and dies of SIGTERM, instead of waiting forever for the
lock it holds itself), and a hostile file already at the path (never an exception in the training loop)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PROGRAM = """
import json, os, signal, sys
from launcher.feed import meter

m = meter.Meter({"AFFRUN_FEED_JSON": sys.argv[1]})
m.counts = lambda: (5, 0.5, 2.0)
m.first = 1.0
meter._at_exit(m)
real = json.dumps

def dump(*args, **kwargs):  # SIGTERM arrives in the middle of the periodic write, under the lock
    json.dumps = real
    os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)

json.dumps = dump
m.flush(False)
print("not killed")
"""


def test_sigterm_during_a_write_keeps_the_final_figures_and_the_signal(tmp_path: Path) -> None:
    out = tmp_path / "feed.json"
    proc = subprocess.run([sys.executable, "-c", PROGRAM, str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=30)  # the bug: a hang on the rank's own flock
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    figures = json.loads(out.read_text())
    assert [f["final"] for f in figures] == [True]
    assert figures[0]["batches"] == 5


@pytest.mark.torch
def test_a_hostile_file_at_the_json_path_never_stops_the_training_loop(tmp_path: Path) -> None:
    """A file nested too deep for Python's JSON reader: ``affrun exec --feed-json`` refuses it in one line and leaves
    it alone (it is not the meter's); a rank that finds it at the path (it came after the start: the rank's own
    variables, as torchrun's ranks get them) replaces it with its figures, and the loop runs to its end."""
    from tests.launch import PROGRAMS, affrun_argv, clean_env, run

    out = tmp_path / "feed.json"
    hostile = "[" * 200_000 + "]" * 200_000
    out.write_text(hostile)
    loop = str(PROGRAMS / "feed_loop.py")
    proc = run(affrun_argv("exec", "--feed-json", str(out), "--", sys.executable, loop))
    assert proc.returncode == 2 and proc.stderr.startswith("affrun: error: --feed-json"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and out.read_text() == hostile
    proc = run([sys.executable, loop], env=clean_env(AFFRUN_FEED="1", AFFRUN_FEED_JSON=str(out)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "warning" not in proc.stderr, proc.stderr
    assert [f["final"] for f in json.loads(out.read_text())] == [True]


HELD = """
import fcntl, json, sys
from launcher.feed import meter

path = sys.argv[1]
with open(path, "w") as fh:
    fh.write("[]")
holder = open(path, "r+")  # another open file: its flock conflicts with the meter's, in this process too
fcntl.flock(holder, fcntl.LOCK_EX)
m = meter.Meter({"AFFRUN_FEED_JSON": path})
m.counts = lambda: (5, 0.5, 2.0)
tries, t = 0, 100.0
due = m.tick(99.0, t)  # the first write: the lock is busy
while t < 110.0:  # ten seconds of batches, 10 ms each, on the loop's own clock
    t += 0.01
    if t >= due:
        tries += 1
        due = m.tick(t, t)
print(json.dumps({"tries": tries}))
"""


def test_a_lock_held_by_another_process_costs_a_rank_one_short_wait_a_second(tmp_path: Path) -> None:
    """Each try waits 0.05 s for the lock; retried every 0.1-0.2 s it took a quarter of a tight loop (443 against
    320 batches/s, measured), now once a second: ten seconds of batches make about ten tries."""
    proc = subprocess.run([sys.executable, "-c", HELD, str(tmp_path / "feed.json")], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["tries"] <= 11, seen
