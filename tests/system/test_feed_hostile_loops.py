"""Issue 34, class 2: the loops the feed meter meets, through ``affrun exec --feed-json`` with real DataLoaders
(tests/programs/feed_hostile_loop.py measures its own wait): an IterableDataset, DataLoader subclasses, a generator,
a ``__next__`` that raises, KeyboardInterrupt, SystemExit and SIGTERM in the loop, two threads, a DataLoader per
epoch, and scripts the meter cannot see into (torch absent, ``sys.meta_path`` replaced, dataloader.py loaded by
file path): those run as without the meter, with no warning. docs/tune.md says what the figures mean in each case.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from tests.launch import PROGRAMS, affrun_argv, json_lines, run

pytestmark = pytest.mark.torch

HOSTILE = str(PROGRAMS / "feed_hostile_loop.py")
POINTS = 0.04  # the meter and the loop time the same calls, a few microseconds apart (tests/system/test_feed_meter.py)
LINE = re.compile(r"^affrun: rank 0 feed: (\d+) batches in ", re.M)


def _metered(tmp_path: Path, *extra: str, feed: tuple[str, ...] = (), killed: bool = False,
             sigint: bool = False) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]:
    """The loop under ``affrun exec --feed-json``: the process, the loop's own figures (none when a signal
    ``killed`` it), the JSON's path. ``sigint``: SIGINT at its default in the loop (it interrupts itself)."""
    out = tmp_path / "feed.json"
    proc = run(affrun_argv("exec", "--feed-json", str(out), *feed, "--", sys.executable, HOSTILE, *extra),
               timeout=300, sigint=sigint)
    assert "Traceback" not in proc.stderr or "KeyboardInterrupt" in proc.stderr, proc.stderr[-3000:]
    owns = json_lines(proc.stdout)
    assert len(owns) == (0 if killed else 1), proc.stdout + proc.stderr[-3000:]
    return proc, owns[0] if owns else {}, out


def _one(out: Path) -> dict[str, Any]:
    (mine,) = json.loads(out.read_text())
    assert isinstance(mine, dict)
    return mine


def _no_warning(proc: subprocess.CompletedProcess[str]) -> None:
    assert "affrun: warning" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("extra", [
    ["--dataset", "iterable"],
    ["--dataset", "iterable", "--workers", "2"],
    ["--loader", "wrap"],
    ["--generator"],
], ids=["iterable", "iterable-2-workers", "subclass-wrapping-torch", "generator"])
def test_loops_whose_batches_come_out_of_torchs_iterator_are_metered(tmp_path: Path, extra: list[str]) -> None:
    """The wait is the time inside torch's own ``__next__``: a subclass's or generator's work around it is the
    loop's, as the loop's own clock (around the subclass's ``next``) counts it within a few points."""
    proc, own, out = _metered(tmp_path, *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _no_warning(proc)
    mine = _one(out)
    assert mine["batches"] == own["batches"] == 40 and mine["final"] is True
    assert mine["data_wait_fraction"] == pytest.approx(own["fraction"], abs=POINTS), (mine, own)
    assert len(LINE.findall(proc.stderr)) == 1


def test_a_subclass_with_an_iterator_of_its_own_is_not_metered(tmp_path: Path) -> None:
    """No torch iterator is ever made: no figures, no file, no line, no warning (docs/tune.md: what it cannot see)."""
    proc, own, out = _metered(tmp_path, "--loader", "own")
    assert proc.returncode == 0 and own["batches"] == 40 and own["patched"], proc.stderr[-3000:]
    _no_warning(proc)
    assert not out.exists() and not LINE.search(proc.stderr)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_an_exception_from_next_reaches_the_script_unchanged(tmp_path: Path, workers: str) -> None:
    """Item 7 raises ValueError; the script catches it and goes on. It catches the same exception as without the
    meter, and the meter counts the batches that came (39 of 40)."""
    extra = ["--raise-at", "7", "--workers", workers]
    proc, own, out = _metered(tmp_path, *extra)
    bare = run([sys.executable, HOSTILE, *extra], timeout=300)
    (unmetered,) = json_lines(bare.stdout)
    assert proc.returncode == 0 and own["caught"] == unmetered["caught"] and len(own["caught"]) == 1, own
    assert own["caught"][0][0] == "ValueError" and not unmetered["patched"]
    mine = _one(out)
    assert mine["batches"] == own["batches"] == 39
    assert mine["data_wait_fraction"] == pytest.approx(own["fraction"], abs=POINTS), (mine, own)


@pytest.mark.parametrize(("extra", "status"), [
    (["--interrupt-at", "10"], -signal.SIGINT),
    (["--exit-at", "10"], 3),
    (["--term-at", "10"], -signal.SIGTERM),
], ids=["KeyboardInterrupt", "SystemExit", "SIGTERM"])
def test_the_loops_own_end_is_kept_and_the_final_figures_written_once(tmp_path: Path, extra: list[str],
                                                                      status: int) -> None:
    """KeyboardInterrupt and SystemExit raised in the loop, SIGTERM sent in it: the process ends as it would without
    the meter, with one final line and the final figures in the file, and no temporary file beside it. (SIGTERM
    ends the script before its ``finally`` prints.)"""
    term = status == -signal.SIGTERM
    proc, own, out = _metered(tmp_path, *extra, killed=term, sigint=status == -signal.SIGINT)
    assert proc.returncode == status, proc.stderr[-3000:]
    mine = _one(out)
    assert mine["final"] is True and len(LINE.findall(proc.stderr)) == 1, proc.stderr
    if not term:
        assert abs(mine["batches"] - own["batches"]) <= 1, (mine, own)  # the signal may land between the two counts
    else:
        assert mine["batches"] == 10, mine
    assert sorted(os.listdir(tmp_path)) == ["feed.json"]


def test_sigterm_where_only_threads_iterate_leaves_the_last_periodic_figures(tmp_path: Path) -> None:
    """The first DataLoader iterator is made in a thread: Python lets only the main thread set a signal handler,
    so the meter has none, and SIGTERM ends the process as without the meter, leaving the figures of the last
    periodic write (``"final": false``), as SIGKILL does (docs/tune.md)."""
    proc, _, out = _metered(tmp_path, "--term-at", "10", "--threads", "2", killed=True)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-3000:]
    mine = _one(out)
    assert mine["final"] is False and 1 <= mine["batches"] <= 10 and not LINE.search(proc.stderr)
    assert sorted(os.listdir(tmp_path)) == ["feed.json"]


def test_two_threads_iterating_one_loader(tmp_path: Path) -> None:
    """Each thread iterates the loader itself (an iterator each): no crash, both threads' batches counted, the loader
    once. The wait is the threads' waits summed, over the loop's wall time: it can pass 100%, and reads 100%."""
    proc, own, out = _metered(tmp_path, "--threads", "2", feed=("--feed-interval", "0.1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    _no_warning(proc)
    mine = _one(out)
    assert mine["batches"] == own["batches"] == 80 and mine["loaders"] == 1
    assert mine["data_wait_fraction"] == pytest.approx(min(own["wait"] / mine["seconds"], 1.0), abs=POINTS)


def test_a_dataloader_per_epoch_keeps_the_figures_small(tmp_path: Path) -> None:
    """200 DataLoaders: all counted, the worker counts of the first 32 listed. Before: one entry each, so a script
    that makes a DataLoader per step grew its figures (and the shared file) without end."""
    proc, own, out = _metered(tmp_path, "--fresh", "--epochs", "200", "--items", "2", "--item-sleep", "0",
                              "--step-sleep", "0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    mine = _one(out)
    assert mine["batches"] == own["batches"] == 400 and mine["loaders"] == 200 and mine["num_workers"] == [0] * 32


@pytest.mark.parametrize("extra", [["--meta-path", "drop"], ["--meta-path", "front"], ["--by-path"]],
                         ids=["meta-path-replaced", "finder-in-front", "dataloader-by-file-path"])
def test_scripts_that_go_around_the_import_hook_run_as_without_the_meter(tmp_path: Path, extra: list[str]) -> None:
    """The import hook is gone, or another finder answers first, or the loop's DataLoader is a copy loaded by file
    path: the meter is not installed on the loop's class (or not at all), the loop runs, and nothing is said."""
    proc, own, out = _metered(tmp_path, *extra)
    assert proc.returncode == 0 and own["batches"] == 40, proc.stderr[-3000:]
    _no_warning(proc)
    assert not out.exists() and not LINE.search(proc.stderr)
    assert own["patched"] is ("--by-path" in extra)  # torch's own module is metered; the copy the loop uses is not


TORCHLESS = """
import json, sys
try:
    import torch  # noqa: F401
    found = True
except ImportError:
    found = False
total = sum(i * i for i in range(100000))
print(json.dumps({"torch": found, "hook": "_affrun_startup" in sys.modules, "total": total}))
"""


def test_an_interpreter_without_torch_meters_nothing_and_says_nothing(tmp_path: Path) -> None:
    """A virtual environment with affrun's startup hook and no torch: the hook runs, the script's ``import torch``
    fails as it would anyway, no warning, no file."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    ours = Path(sysconfig.get_paths()["purelib"])
    for name in ("affrun-startup.pth", "_affrun_startup.py"):
        (site / name).write_bytes((ours / name).read_bytes())
    out = tmp_path / "feed.json"
    proc = run(affrun_argv("exec", "--feed-json", str(out), "--", str(venv / "bin" / "python"), "-c", TORCHLESS))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert json.loads(proc.stdout) == {"torch": False, "hook": True, "total": sum(i * i for i in range(100000))}
    assert not out.exists()
