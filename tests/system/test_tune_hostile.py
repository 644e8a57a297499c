"""``affrun tune`` against hostile scripts (tests/programs/tune_hostile.py), through its entry point.

What a trial starts is checked against the script's own record, not tune's bookkeeping: every process the script
starts (daemons, a double fork into a session of its own with an empty environment, a process that forks and
exits to change its pid) writes its pid and start time into a directory, and every one is gone once tune exits.
A script that prints megabytes a second fills neither the disk nor tune's memory, one that reads stdin gets its
end at once; one that exits at once or crashes after its warm-up, and a bad --budget, are one error line and
exit 2; Ctrl-C and SIGTERM at each phase print the table so far, exit 128 + the signal and leave nothing;
--save and --svg to a FIFO are one error line, not a hang; the script's odd arguments stay out of the YAML.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest
import yaml

from tests.errors import error_lines
from tests.launch import PROGRAMS, affrun_argv, clean_env, default_sigint, run

pytestmark = pytest.mark.torch

HOSTILE = str(PROGRAMS / "tune_hostile.py")
SHORT = ("--trial-seconds", "1", "--warmup-seconds", "0.5")


@pytest.fixture
def record(tmp_path: Path) -> Iterator[Path]:
    """The directory the script records its processes in; whatever of them still runs at the test's end (a
    failed test) is killed, by pid, so that no test leaves one behind."""
    where = tmp_path / "record"
    where.mkdir()
    yield where
    _left_behind(where, within=0)


def _one_core() -> tuple[str, str]:
    """``--cpus`` of one allowed CPU: a rank of one core, so that tune runs two trials (the default, and the one
    family of no loader cores)."""
    return "--cpus", str(min(os.sched_getaffinity(0)))


def _tune(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run(affrun_argv("tune", *args), env=env or clean_env(), timeout=300)


def _live(pid: int, start: str) -> bool:
    """``pid`` is still the process that recorded ``start`` and has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return False
    return fields[19] == start and fields[0] not in ("Z", "X")


def _recorded(record: Path) -> dict[int, tuple[str, str]]:
    """pid -> (start time, what) of every process the script recorded."""
    out = {}
    for path in record.glob("pid-*"):
        start, _, what = path.read_text().partition(" ")
        out[int(path.name[4:])] = (start, what)
    return out


def _left_behind(record: Path, within: float = 5.0) -> dict[int, str]:
    """The recorded processes still running ``within`` seconds after tune exited (then killed: by pid, the
    processes this test's script started, so that a failure leaves nothing either)."""
    deadline = time.monotonic() + within
    while True:
        left = {pid: what for pid, (start, what) in _recorded(record).items() if _live(pid, start)}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


class _Tune:
    """``affrun tune`` running in a session of its own (its process group is the one a terminal would signal),
    its stderr read line by line as it comes, its stdout whole."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, stdin: int | None = subprocess.DEVNULL):
        self.proc = subprocess.Popen(affrun_argv("tune", *args), env=env or clean_env(), stdin=stdin,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, preexec_fn=default_sigint)
        self.lines: list[str] = []
        self._out: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stderr, self.lines), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stdout, self._out), daemon=True)]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[str] | None, into: list[str]) -> None:
        assert stream is not None
        for line in stream:
            into.append(line)

    def wait_for(self, test: Callable[[], object], what: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not test():
            assert self.proc.poll() is None, (what, "".join(self.lines))
            assert time.monotonic() < deadline, (what, "".join(self.lines))
            time.sleep(0.05)

    def finish(self, timeout: float = 120) -> tuple[str, str]:
        """Wait for tune (then its output's end); (stdout, stderr)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        for reader in self._readers:
            reader.join(10)
        return "".join(self._out), "".join(self.lines)


def _escaped(record: Path) -> list[int]:
    return [pid for pid, (_, what) in _recorded(record).items() if what == "escaped"]


def test_nothing_a_trial_starts_outlives_it(record: Path) -> None:
    """Daemons in the rank's group, a child in a session of its own, and a double fork that re-executes with an
    empty environment and then changes its pid every 0.1 s: every one of them, in both trials, is gone."""
    tune = _Tune("--nproc-per-node", "1", *_one_core(), *SHORT, HOSTILE, "--record", str(record), "--daemon",
                 "--setsid", "--escape", "--hop")
    tune.wait_for(lambda: _escaped(record), "the script's first escape")
    escaped = _escaped(record)[0]
    with open(f"/proc/{escaped}/environ", "rb") as fh:
        assert fh.read() == b""  # no marker variable to find it by
    assert os.getsid(escaped) != os.getsid(tune.proc.pid)
    out, err = tune.finish()
    assert tune.proc.returncode == 0, err
    assert "default" in out and "could not be stopped" not in err
    kinds = [what for _, what in _recorded(record).values()]
    assert kinds.count("rank") == 2 and kinds.count("escaped") == 2 and "hopped" in kinds, kinds
    assert not _left_behind(record)


def test_ctrl_c_held_down_while_the_job_ignores_sigterm(tmp_path: Path, record: Path) -> None:
    """SIGINT to tune's process group (as a terminal sends it) during the first trial, whose rank ignores SIGTERM
    and escapes once more when it gets it, then again and again while tune stops and sweeps the trial and writes
    --save and --svg: the table so far, exit 130, whole files, nothing left."""
    svg, saved = tmp_path / "t.svg", tmp_path / "t.yaml"
    tune = _Tune("--nproc-per-node", "1", *_one_core(), *SHORT, "--svg", str(svg), "--save", str(saved), HOSTILE,
                 "--record", str(record), "--escape", "--escape-on-term")
    tune.wait_for(lambda: _escaped(record), "the script's first escape")
    while tune.proc.poll() is None:
        try:
            os.killpg(tune.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            break
        time.sleep(0.3)
    out, err = tune.finish()
    assert tune.proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in out and out.startswith("trial"), (out, err)
    assert ET.parse(svg).getroot().tag.endswith("svg")
    assert not saved.exists()  # the default was not measured: no advice to save
    assert len(_escaped(record)) == 2, _recorded(record)  # the second one escaped at SIGTERM
    assert not _left_behind(record)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_between_trials_stops_with_the_table(record: Path, sig: signal.Signals) -> None:
    """SIGINT or SIGTERM to tune alone as the first trial ends and the second starts."""
    tune = _Tune("--nproc-per-node", "1", *_one_core(), *SHORT, "--json", HOSTILE, "--record", str(record),
                 "--escape")
    tune.wait_for(lambda: any("trial 1 default" in line for line in tune.lines), "the first trial's end")
    tune.proc.send_signal(sig)
    out, err = tune.finish()
    assert tune.proc.returncode == 128 + sig, err
    assert '"stopped": "interrupted"' in out and "Traceback" not in err
    assert not _left_behind(record)


def test_ctrl_c_before_any_trial_is_exit_130(record: Path) -> None:
    tune = _Tune("--nproc-per-node", "1", *_one_core(), *SHORT, HOSTILE, "--record", str(record), "--escape")

    def importing_torch() -> bool:
        try:
            return "libtorch" in Path(f"/proc/{tune.proc.pid}/maps").read_text()
        except OSError:
            return False

    tune.wait_for(importing_torch, "torch loading in tune")
    os.killpg(tune.proc.pid, signal.SIGINT)
    _, err = tune.finish()
    assert tune.proc.returncode == 130, err
    assert "Traceback" not in err and "Aborted" not in err
    assert not _left_behind(record)


def _disk_use(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def test_megabytes_a_second_and_stdin_are_bounded(tmp_path: Path, record: Path) -> None:
    """A script that reads stdin to its end (tune's own stdin is a pipe nobody writes or closes) and prints
    16 MB a second: the trials are measured, tune's temporary directory and memory stay small, nothing of theirs
    is left in TMPDIR (torchrun's log directory included); odd arguments stay out of --save's YAML."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    saved, svg = tmp_path / "tuned.yaml", tmp_path / "tune.svg"
    odd = ["\nmachine: injected", "caf\udcc3\udca9", "\x1b[31mred"]
    tune = _Tune("--nproc-per-node", "1", *_one_core(), *SHORT, "--save", str(saved), "--svg", str(svg), HOSTILE,
                 "--record", str(record), "--stdin", "--spew", "16", "--", *odd,
                 env=clean_env(TMPDIR=str(tmp)), stdin=subprocess.PIPE)
    tune.wait_for(lambda: (record / "spewed").exists(), "the script's output")
    base, disk, rss = _rss(tune.proc.pid), 0, 0
    while tune.proc.poll() is None:
        disk, rss = max(disk, _disk_use(tmp)), max(rss, _rss(tune.proc.pid))
        time.sleep(0.1)
    out, err = tune.finish()
    assert tune.proc.returncode == 0, err
    assert out.startswith("trial") and "default" in out, out
    spewed = int((record / "spewed").read_text())
    assert spewed > 8e6, spewed
    assert disk < 1 << 20 and rss - base < 32 << 20, (disk, rss - base, spewed)
    assert not list(tmp.iterdir())
    assert "never iterated" not in err and "skipped" not in err, err
    data = yaml.safe_load(saved.read_text())
    assert set(data) == {"affrun-tuned", "options", "machine", "date"} and data["machine"] != "injected"
    assert all(line.startswith("#") or not line.startswith(("machine: injected", "\x1b")) for line in
               saved.read_text().splitlines())
    assert ET.parse(svg).getroot().tag.endswith("svg")
    assert not _left_behind(record)


@pytest.mark.parametrize(("script", "needle"), [
    (["--exit", "0"], "never iterated a torch DataLoader"),
    (["--exit", "3", "--after", "2"], "failed in its first trial"),
])
def test_a_script_that_ends_early_is_one_error_line(script: list[str], needle: str) -> None:
    """Exit 0 at once, before any DataLoader; exit 3 after the warm-up, mid-window: what it measured before
    does not make a crashing script a result."""
    proc = _tune("--nproc-per-node", "1", *_one_core(), "--trial-seconds", "5", "--warmup-seconds", "0.5",
                 HOSTILE, *script)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    (line,) = error_lines(proc.stderr)
    assert needle in line, line


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1", "1_0", "ten", "1e999", "\u0661\u0660"])
def test_a_bad_budget_is_one_line_before_any_trial(record: Path, value: str) -> None:
    proc = _tune("--nproc-per-node", "1", "--budget", value, HOSTILE, "--record", str(record))
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    (line,) = error_lines(proc.stderr)
    assert "--budget" in line and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert not _recorded(record)


def test_a_huge_budget_is_a_budget() -> None:
    proc = _tune("--nproc-per-node", "1", "--budget", "1e300", HOSTILE, "--exit", "0")
    assert proc.returncode == 2, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert "never iterated" in line


@pytest.mark.parametrize("option", ["--svg", "--save"])
def test_a_fifo_to_write_is_an_error_line_not_a_hang(tmp_path: Path, option: str) -> None:
    """A FIFO that nobody reads: named for --svg, refused before any trial (the one check of an output path,
    launcher.base.outpath); created under --save's name while the trials run, refused when tune writes it."""
    fifo = tmp_path / "fifo"
    if option == "--svg":
        os.mkfifo(fifo)
        proc = _tune("--nproc-per-node", "1", "--budget", "1e-9", "--svg", str(fifo), HOSTILE)
    else:
        tune = _Tune("--nproc-per-node", "1", *_one_core(), *SHORT, "--save", str(fifo), HOSTILE)
        tune.wait_for(lambda: any("trial 1 default" in line for line in tune.lines), "the first trial's end")
        os.mkfifo(fifo)
        out, err = tune.finish()
        proc = subprocess.CompletedProcess(tune.proc.args, tune.proc.returncode, out, err)
    assert proc.returncode == 2 and ("trial" in proc.stdout) == (option == "--save"), (proc.stdout, proc.stderr)
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and option in lines[0] and str(fifo) in lines[0] and "FIFO" in lines[0], proc.stderr


@pytest.mark.parametrize("option", ["--svg", "--save"])
@pytest.mark.parametrize("target", ["script", "notes", "picture"])
def test_an_output_that_would_replace_the_script_or_a_user_s_file_is_refused(tmp_path: Path, option: str,
                                                                             target: str) -> None:
    """`--save train.py` replaced the script being tuned with YAML; a file of the user's named by mistake was
    replaced as well. Refused before any trial, the file untouched; affrun's own earlier output is rewritten."""
    script = tmp_path / "train.py"
    script.write_bytes(Path(HOSTILE).read_bytes())
    notes = tmp_path / "notes.txt"
    notes.write_text("the user's own notes\n" if target == "notes" else
                     '<svg xmlns="http://www.w3.org/2000/svg"><title>my own diagram</title></svg>\n')
    named = script if target == "script" else notes
    before = named.read_bytes()
    proc = _tune("--nproc-per-node", "1", "--budget", "1e-9", option, str(named), str(script))
    assert proc.returncode == 2 and "trial" not in proc.stdout, (proc.stdout, proc.stderr)
    (line,) = error_lines(proc.stderr)
    assert option in line and ("is the training script" if target == "script" else "did not write") in line, line
    assert named.read_bytes() == before


@pytest.mark.parametrize(("typed", "meant"), [("--trial-secs", "--trial-seconds"), ("--budgt", "--budget"),
                                              ("--svgg", "--svg"), ("--nproc-per-nodes", "--nproc-per-node")])
def test_a_mistyped_option_gets_tune_s_nearest_spelling(typed: str, meant: str) -> None:
    """torchrun's spellings were offered for tune's own options (--trial-secs: "did you mean --logs-specs?"), and
    every error sent the user to `affrun torchrun --help`."""
    proc = _tune(typed, "2", HOSTILE)
    assert proc.returncode == 2, proc.stderr
    assert error_lines(proc.stderr) == [f"affrun: error: unknown option {typed}: did you mean {meant}? (affrun tune "
                                         "--help gives the full usage)"]
