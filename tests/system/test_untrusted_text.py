"""Untrusted text in text reports: environment values, command lines and process names reach the terminal
escaped, in every report that echoes them (``doctor``, ``doctor --pid``, the dry runs of ``exec``, ``run`` and
``torchrun``, ``topology``/``plan``/``show``), and JSON keeps the exact value.

Each hostile value holds a newline (a forged line), a carriage return, an ANSI escape sequence, a zero-width
space and a bidi override. A report passes when every character of it but its own line breaks is printable,
no line starts with the forged text, and the value shows in its escaped form.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fakesys import uniform, write_tree
from tests.launch import RANK_PROBE, affrun_argv, clean_env, run

pytestmark = pytest.mark.slow
FORGED = "error forged: line"
# One hostile value per kind of character a terminal acts on or hides; each also forges a line.
VALUES = [
    f"2\n{FORGED}",
    f"x\r{FORGED}",
    f"\x1b[2J\x1b[31m{FORGED}\x1b[0m",
    f"a\u200bb\u202e{FORGED}",
    f"tab\tbell\x07del\x7fnel\x85{FORGED}",
]


def escaped(value: str) -> str:
    """How a value is shown: each character that is not printable as ``repr`` writes it."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)


def assert_clean(text: str) -> None:
    """Nothing but printable characters and line breaks, and no forged line."""
    raw = sorted({c for c in text if not c.isprintable() and c != "\n"})
    assert not raw, f"raw characters {raw!r} in the report:\n{text[-3000:]}"
    forged = [line for line in text.split("\n") if line.startswith(FORGED)]
    assert not forged, text[-3000:]


def bash_words(line: str) -> list[bytes]:
    """The words bash reads from a command line the report printed."""
    out = subprocess.run(["bash", "-c", f'for w in {line}; do printf "%s\\0" "$w"; done'], capture_output=True,
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}, timeout=60, check=True)
    return out.stdout.split(b"\0")[:-1]


@pytest.mark.parametrize("value", VALUES)
def test_doctor_text_escapes_environment_values_and_json_keeps_them(value: str) -> None:
    env = clean_env(OMP_NUM_THREADS=value, KMP_AFFINITY=value, OMP_PLACES=value)
    text = run(affrun_argv("doctor"), env=env)
    assert text.returncode in (0, 1), text.stderr[-3000:]
    assert_clean(text.stdout)
    assert f"KMP_AFFINITY={escaped(value)}" in text.stdout  # shown, not dropped (click drops escape sequences
    # from what it writes to a pipe, but not from what it writes to a terminal)
    data = json.loads(run(affrun_argv("doctor", "--json"), env=env).stdout)
    assert data["environment"]["OMP_NUM_THREADS"] == value
    assert any(value in f["message"] for f in data["findings"])


def _start_named(tmp_path: Path, value: str) -> subprocess.Popen[bytes]:
    """A process named ``value`` (``/proc/self/comm``, up to 15 bytes), with ``value`` in its argv and its
    environment; it prints READY once renamed."""
    script = tmp_path / "named.py"
    script.write_text("import os, sys, time\n"
                      "with open('/proc/self/comm', 'w') as fh:\n"
                      "    fh.write(os.environ['NAME'])\n"
                      "os.write(1, b'READY\\n')\n"
                      "time.sleep(120)\n")
    comm = value.replace(FORGED, "F")  # keeps the hostile characters within the kernel's 15 bytes
    env = clean_env(NAME=comm, OMP_NUM_THREADS=value, KMP_AFFINITY=value)
    proc = subprocess.Popen([sys.executable, str(script), value, "next"], env=env, stdout=subprocess.PIPE,
                            start_new_session=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while not select.select([proc.stdout], [], [], 1)[0]:
        assert time.monotonic() < deadline, "the named process did not start"
    assert proc.stdout.readline() == b"READY\n"
    return proc


@pytest.mark.parametrize("value", VALUES)
def test_doctor_pid_escapes_names_command_lines_and_environment(tmp_path: Path, value: str) -> None:
    proc = _start_named(tmp_path, value)
    try:
        comm = os.fsdecode(Path(f"/proc/{proc.pid}/comm").read_bytes()[:-1])  # what the kernel kept of the name
        # (read as bytes: a text read turns its \r into \n, as affrun did)
        text = run(affrun_argv("doctor", "--pid", str(proc.pid), "--duration", "0.2"))
        data = json.loads(run(affrun_argv("doctor", "--pid", str(proc.pid), "--duration", "0.2", "--json")).stdout)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert text.returncode in (0, 1), text.stderr[-3000:]
    assert_clean(text.stdout)
    assert f"({escaped(comm)})" in text.stdout and escaped(value) in text.stdout
    record = next(p for p in data["processes"] if p["pid"] == proc.pid)
    assert record["comm"] == comm and record["cmdline"][-2:] == [value, "next"]


@pytest.mark.parametrize("value", VALUES)
def test_exec_dry_run_escapes_values_and_prints_a_command_bash_reads_back(value: str) -> None:
    words = [value, "it's", "", "\udcff not utf-8"]
    proc = run(affrun_argv("exec", "--dry-run", "--nproc-per-node", "1", "--local-rank", "0", "--", "prog", *words),
               env=clean_env(OMP_PLACES=value, OMP_NUM_THREADS=value))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_clean(proc.stdout)
    assert f"OMP_PLACES={escaped(value)}" in proc.stdout  # the user's value, kept or replaced: shown
    command = next(line for line in proc.stdout.splitlines() if line.startswith("exec "))
    assert bash_words(command[len("exec "):]) == [os.fsencode(w) for w in ["prog", *words]]


def test_run_dry_run_prints_a_command_bash_reads_back() -> None:
    words = [*VALUES, "\udcff"]
    proc = run(affrun_argv("run", "--dry-run", "--nproc-per-node", "1", "--", "prog", *words))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_clean(proc.stdout)
    assert_clean(proc.stderr)
    command = next(line for line in proc.stdout.splitlines() if line.startswith("exec "))
    assert bash_words(command[len("exec "):]) == [os.fsencode(w) for w in ["prog", *words]]


@pytest.mark.torch
def test_torchrun_dry_run_prints_a_worker_command_bash_reads_back() -> None:
    proc = run(affrun_argv("torchrun", "--affrun-dry-run", "--nproc-per-node", "1", str(RANK_PROBE), *VALUES))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_clean(proc.stdout)
    worker = next(line for line in proc.stdout.splitlines() if line.startswith("worker: "))
    assert bash_words(worker[len("worker: "):])[-len(VALUES):] == [os.fsencode(v) for v in VALUES]


@pytest.mark.parametrize("command", [["topology"], ["plan"], ["show", "--no-color"]])
def test_a_source_path_is_shown_escaped(tmp_path: Path, command: list[str]) -> None:
    tree = write_tree(tmp_path / "base", uniform(1, 2))
    hostile = tmp_path / VALUES[0].replace(FORGED, "FORGED").replace("\n", "\n\x1b[31m")
    shutil.move(str(tree), str(hostile))
    proc = run(affrun_argv(*command, "--fsroot", str(hostile)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_clean(proc.stdout)
    assert escaped(str(hostile)) in proc.stdout.replace("\n", "")  # show wraps long lines
