"""Every number on affrun's command lines is read as its ASCII digits say. Every number of seconds (``--feed-interval`` of exec, run and torchrun; tune's
``--budget`` and its other durations; doctor's ``--duration`` and ``--interval``) is read by one reader,
launcher/base/untrusted.py's ``seconds``: through the real ``affrun`` command, a value that is no plain ASCII
decimal (``1_0``, `` 5 ``, ``nan``, ``inf``, Arabic-Indic ``٥``, ``0x10``) or out of range is one
``affrun: error:`` line worded the same way, exit 2, and every plain decimal accepted before still is. The counts and pids of the click front ends (plan, show,
doctor) are read as exec's argparse reads them: ASCII digits, in range."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch import affrun_argv, clean_env, run

# float() reads all of these; none is a number of seconds a user types.
NOT_DECIMAL = ["1_0", " 5 ", "5 ", "nan", "NaN", "inf", "-inf", "Infinity", "\u0665", "\u0661\u0660", "\uff15",
               "0x10", "1e", "e3", ".", "", "five", "1e999"]
# Plain decimals each option took before, and takes still.
DECIMAL = {"5": 5.0, "0.2": 0.2, "2.5": 2.5, ".5": 0.5, "2.": 2.0, "1e3": 1000.0, "1E-1": 0.1, "+5": 5.0}


def error_line(proc: subprocess.CompletedProcess[str], option: str) -> str:
    """Exit 2, no traceback, one line in all, ``affrun: error:`` naming ``option``; returns it."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr[-3000:])
    (line,) = proc.stderr.splitlines()
    assert line.startswith("affrun: error:") and option in line and "is not a number of seconds" in line, line
    return line


def exec_feed(value: str) -> subprocess.CompletedProcess[str]:
    return run(affrun_argv("exec", f"--feed-interval={value}", "--dry-run", "--", "true"), env=clean_env())


@pytest.mark.parametrize("value", [*NOT_DECIMAL, "0", "-1", "-0"])
def test_exec_feed_interval_refuses_what_is_no_plain_decimal(value: str) -> None:
    error_line(exec_feed(value), "--feed-interval")


@pytest.mark.parametrize("value", list(DECIMAL))
def test_exec_feed_interval_takes_plain_decimals(value: str) -> None:
    proc = exec_feed(value)
    assert proc.returncode == 0, proc.stderr
    assert f"AFFRUN_FEED_INTERVAL={DECIMAL[value]!r}\n" in proc.stdout, proc.stdout


@pytest.mark.parametrize("value", ["1_0", "\u0665"])
def test_run_feed_interval_refuses_the_same_way(value: str) -> None:
    proc = run(affrun_argv("run", "--feed-interval", value, "--dry-run", "--", "true"), env=clean_env())
    wording = f"argument --feed-interval: {value!r} is not a number of seconds >= 0.1"
    assert wording in error_line(proc, "--feed-interval") and wording in error_line(exec_feed(value), "--feed")


@pytest.mark.torch
@pytest.mark.parametrize("value", ["nan", " 5 "])
def test_torchrun_feed_interval_refuses_the_same_way(tmp_path: Path, value: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    proc = run(affrun_argv("torchrun", "--nproc-per-node", "1", "--feed-interval", value, "--dry-run", str(script)),
               env=clean_env())
    line = error_line(proc, "--feed-interval")
    assert f"{value!r} is not a number of seconds >= 0.1" in line, line


@pytest.mark.torch
def test_torchrun_feed_interval_takes_a_plain_decimal(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    proc = run(affrun_argv("torchrun", "--nproc-per-node", "1", "--feed-interval", "1e3", "--dry-run", str(script)),
               env=clean_env())
    assert proc.returncode == 0 and "AFFRUN_FEED_INTERVAL=1000.0\n" in proc.stdout, proc.stderr


def _gone_pid() -> int:
    """A pid no process has now: a child that exited and was reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("option", ["--duration", "--interval"])
@pytest.mark.parametrize("value", ["\u0665", "1_0", " 5 ", "nan", "-1", "1e9"])
def test_doctor_durations_refuse_the_same_way(option: str, value: str) -> None:
    proc = run(affrun_argv("doctor", "--pid", "1", option, value), env=clean_env())
    assert error_line(proc, option).startswith(f"affrun: error: {option} {value!r} is not a number of seconds")


@pytest.mark.parametrize("value", ["5", "2.5", ".5", "1e2", "+5", "0"])
def test_doctor_duration_takes_plain_decimals(value: str) -> None:
    """Taken: the error that follows is the pid's (no process), not the duration's."""
    pid = _gone_pid()
    proc = run(affrun_argv("doctor", "--pid", str(pid), "--duration", value), env=clean_env())
    assert proc.returncode == 2 and proc.stderr == f"affrun: error: --pid {pid}: no such process\n", proc.stderr


TUNE_BAD = [("--budget", v) for v in ("\u0665", "1_0", " 5 ", "nan", "inf", "-1")] + [
    (option, v) for option in ("--trial-seconds", "--warmup-seconds", "--start-seconds") for v in ("\u0665", "1_0")]


@pytest.mark.torch
@pytest.mark.parametrize(("option", "value"), TUNE_BAD)
def test_tune_durations_refuse_the_same_way(option: str, value: str) -> None:
    proc = run(affrun_argv("tune", "--nproc-per-node", "1", option, value, "train.py"), env=clean_env())
    line = error_line(proc, option)
    assert f"{value!r} is not a number of seconds >" in line, line


@pytest.mark.torch
@pytest.mark.parametrize("value", ["900", "2.5", ".5", "1e300", "+5"])
def test_tune_budget_takes_plain_decimals(tmp_path: Path, value: str) -> None:
    """Taken: the error that follows is --save's (a directory), checked after tune's options are read."""
    proc = run(affrun_argv("tune", "--budget", value, "--save", str(tmp_path), "train.py"), env=clean_env())
    assert proc.returncode == 2 and "--save" in proc.stderr and "--budget" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(("command", "option", "value", "needle"), [
    ("plan", "--nproc-per-node", "\u0662", "is not a whole number from 0 to 65536"),
    ("plan", "--nproc-per-node", " 1_0", "is not a whole number from 0 to 65536"),
    ("plan", "--loader-cores", "\u0661", "is not a whole number from 0 to 65536"),
    ("show", "--comm-cores", "+1", "is not a whole number from 0 to 65536"),
    ("doctor", "--nproc-per-node", "\uff12", "is not a whole number from 0 to 65536"),
    ("doctor", "--pid", " 1", "is not a whole number >= 1"),
    ("show", "--pid", "0", "is not a whole number >= 1"),
])
def test_click_counts_and_pids_take_ascii_digits_only(command: str, option: str, value: str, needle: str) -> None:
    proc = run(affrun_argv(command, option, value), env=clean_env())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("affrun: error:") and option in line and f"{value!r} {needle}" in line, line


def test_click_counts_take_what_they_took() -> None:
    proc = run(affrun_argv("plan", "--nproc-per-node", "2", "--loader-cores", "0", "--json"), env=clean_env())
    assert proc.returncode == 0, proc.stderr
    assert [r["local_rank"] for r in json.loads(proc.stdout)["ranks"]] == [0, 1]
