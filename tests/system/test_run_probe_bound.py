"""``affrun run``'s interpreter probe is bounded for real (issue 26, item 6).

The probe runs COMMAND's interpreter once. Here that interpreter is a wrapper script named ``python3`` (as pyenv's
and conda's shims are) that leaves a child running with the probe's output: it must not hold ``affrun run``
past the probe's bound, whether the wrapper then answers (it execs this venv's python) or never does, and
whether the child stays in the probe's process group or leaves for a session of its own. What the probe
leaves in its own group is ended. Real processes: the CLI, /bin/sh wrappers, sleep.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from launcher.launch.run_target import PROBE_SECONDS
from tests.conftest import need
from tests.errors import refused
from tests.launch import rank_lines
from tests.system.test_hostile_input import affrun

LEFT = 300  # seconds the left-behind child would hold the output: far past any bound asserted here
WRAPPERS = {
    # answers (execs this venv's python, which loads the hook) after starting a child that keeps stdout
    "answers": f'sleep {LEFT} & echo $! > "$PIDFILE"\nexec {sys.executable} "$@"\n',
    # never answers, and leaves a child too
    "silent": f'sleep {LEFT} & echo $! > "$PIDFILE"\nsleep {LEFT}\n',
    # answers; its child leaves for a session of its own, out of reach of the probe's group
    "escapes": f'setsid sleep {LEFT} & echo $! > "$PIDFILE"\nexec {sys.executable} "$@"\n',
}


def gone(pid: int, within: float = 10.0) -> bool:
    """The process ``pid`` has ended (a zombie counts) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("kind", list(WRAPPERS))
def test_a_child_left_holding_the_probes_output_cannot_hold_affrun_run(tmp_path: Path, kind: str) -> None:
    need(bool(shutil.which("sleep")) and (kind != "escapes" or bool(shutil.which("setsid"))), "no sleep/setsid")
    shim = tmp_path / "shims"
    shim.mkdir()
    (shim / "python3").write_text("#!/bin/sh\n" + WRAPPERS[kind])
    (shim / "python3").chmod(0o755)
    pidfile = tmp_path / "child.pid"
    env = {"PATH": f"{shim}:{os.environ['PATH']}", "PIDFILE": str(pidfile)}
    bound = PROBE_SECONDS + 30  # the probe's own bound, and room for a loaded machine
    try:
        start = time.monotonic()
        proc = affrun("run", "--nproc-per-node", "1", "--dry-run", "--", "python3", "-c", "pass", env=env,
                      timeout=bound)
        took = time.monotonic() - start
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        if kind == "silent":
            assert took >= PROBE_SECONDS * 0.9
            warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("affrun: warning:")]
            assert len(warnings) == 1 and f"no answer in {PROBE_SECONDS:g} s" in warnings[0], proc.stderr
            assert rank_lines(proc.stderr) == []  # nobody saw the hook: no binding is claimed
        else:
            assert took < PROBE_SECONDS, f"affrun run waited {took:.1f} s for a child of the probe"
            assert "affrun: warning" not in proc.stderr and len(rank_lines(proc.stderr)) == 1, proc.stderr
        child = int(pidfile.read_text())
        if kind != "escapes":
            assert gone(child), "the probe left its child running"
    finally:
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass


def test_strict_refuses_an_interpreter_that_never_answers(tmp_path: Path) -> None:
    shim = tmp_path / "shims"
    shim.mkdir()
    (shim / "python3").write_text(f"#!/bin/sh\nexec sleep {LEFT}\n")
    (shim / "python3").chmod(0o755)
    canary = tmp_path / "ran"
    proc = affrun("run", "--strict", "--nproc-per-node", "1", "--", "python3", "-c", "pass", str(canary),
                  env={"PATH": f"{shim}:{os.environ['PATH']}"}, timeout=PROBE_SECONDS + 30)
    refused(proc, "--strict", "no answer")
    assert not canary.exists()
