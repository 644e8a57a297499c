"""Hostile streams and plan hand-offs through the real CLI (issue 18, classes 3, 9, 10 and 14's AFFRUN_PLAN messages).

- A closed stdout or stderr (``>&-``, ``2>&-``, done by a real shell): every command works, and the command affrun
  runs keeps its exit code and finds the stream closed, as the user left it.
- A stdout that cannot be written (``> /dev/full``, a read-only descriptor): one ``affrun: error:`` line and exit 1.
  A stderr that cannot be written never stops the command.
- The plan reaches every process of the job in ``AFFRUN_PLAN`` itself, however large: no file to leave behind, to be
  removed under the job, or to need a writable temporary directory for.
- A value of ``AFFRUN_PLAN`` that is no plan is one line that says what it holds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.bind.handoff import INLINE_PLAN_LIMIT, ParentPlan
from launcher.bind.wire import read_job
from launcher.plan.planner import Request, make_plan
from launcher.topology import load_topology
from tests.conftest import need
from tests.errors import refused
from tests.fakesys import uniform, write_tree
from tests.launch import affrun_argv, clean_env
from tests.system.test_hostile_input import BOUND, affrun

# The shell reports whether its own descriptor N is open (0) or closed (1) on the other stream, then exits 7.
FD_PROBE = 'test -e /proc/$$/fd/{fd}; echo "fd{fd}=$?" >&{other}; exit 7'
CLOSE = {"stdout": ">&-", "stderr": "2>&-"}


def shell(redirect: str, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
          timeout: float = BOUND) -> subprocess.CompletedProcess[str]:
    """``argv`` started by a real shell with ``redirect`` applied (``>&-``, ``2>/dev/full``...); the streams that
    stay open are captured."""
    return subprocess.run(["sh", "-c", f'exec "$@" {redirect}', "sh", *argv], env=clean_env(**(env or {})),
                          capture_output=True, text=True, errors="replace", timeout=timeout, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def big_tree(tmp_path: Path) -> Path:
    """2 sockets x 64 cores x 2 threads: a plan of 128 ranks is about 170 KB of JSON."""
    return write_tree(tmp_path / "big", uniform(2, 64, threads=2, nodes_per_package=4))


BIG_PLAN = ["--nproc-per-node", "128", "--mode", "socket"]


# ---------------------------------------------------------------------------------------------- class 3: closed streams
@pytest.mark.parametrize("closed", ["stdout", "stderr"])
@pytest.mark.parametrize("command", ["exec", "run"])
def test_the_command_runs_with_a_closed_stream_and_finds_it_closed(command: str, closed: str) -> None:
    fd, other = (1, 2) if closed == "stdout" else (2, 1)
    opts = ["--nproc-per-node", "1"] if command == "run" else []
    proc = shell(CLOSE[closed], affrun_argv(command, *opts, "--", "sh", "-c", FD_PROBE.format(fd=fd, other=other)))
    seen = proc.stderr if closed == "stdout" else proc.stdout
    assert proc.returncode == 7, (proc.returncode, proc.stdout, proc.stderr)
    assert f"fd{fd}=1" in seen.splitlines(), seen  # the command's own descriptor is still closed
    assert "Traceback" not in proc.stdout + proc.stderr
    if closed == "stderr":  # what affrun says on stderr goes nowhere, never to stdout
        assert proc.stdout == f"fd{fd}=1\n", proc.stdout


@pytest.mark.parametrize(("args", "closed"), [
    (["show"], "stdout"),
    (["exec", "--dry-run", "--", "true"], "stdout"),
    (["exec", "--verbose", "--", "true"], "stdout"),
    (["exec", "--verbose", "--", "true"], "stderr"),
    (["run", "--dry-run", "--nproc-per-node", "2", "--", "true"], "stdout"),
    (["run", "--dry-run", "--nproc-per-node", "2", "--", "true"], "stderr"),
    (["run", "--verbose", "--nproc-per-node", "1", "--", "true"], "stdout"),
    (["run", "--verbose", "--nproc-per-node", "1", "--", "true"], "stderr"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else a)
def test_every_command_works_with_a_closed_stream(args: list[str], closed: str) -> None:
    expected = affrun(*args)  # the same command with both streams open
    proc = shell(CLOSE[closed], affrun_argv(*args))
    assert proc.returncode == expected.returncode, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
    if closed == "stderr":  # what goes to stderr goes nowhere, not to stdout
        assert proc.stdout == expected.stdout
    else:
        assert proc.stderr == expected.stderr


TORCH_SCRIPT = """import os, sys
open(os.path.join(sys.argv[1], "rank" + os.environ["LOCAL_RANK"]), "w").write(
    f"{sys.stdout is None} {sys.stderr is None} {sorted(os.sched_getaffinity(0))}")
"""


@pytest.mark.torch
@pytest.mark.parametrize("closed", ["stdout", "stderr"])
def test_every_torchrun_worker_works_with_a_closed_stream(tmp_path: Path, closed: str) -> None:
    script = tmp_path / "s.py"
    script.write_text(TORCH_SCRIPT)
    proc = shell(CLOSE[closed], affrun_argv("torchrun", "--nproc-per-node", "2", str(script), str(tmp_path)),
                 cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    for rank in (0, 1):
        stdout_none, stderr_none, _ = (tmp_path / f"rank{rank}").read_text().split(" ", 2)
        # each worker sees the stream closed, as under plain torchrun
        assert (stdout_none, stderr_none) == (("True", "False") if closed == "stdout" else ("False", "True"))
    if closed == "stderr":
        assert "rank" not in proc.stdout, proc.stdout  # the rank lines go nowhere
    else:
        assert proc.stderr.count("affrun: starting rank ") == 2, proc.stderr


# ---------------------------------------------------------------------------------------------- class 10: full stdout
@pytest.mark.parametrize("args", [
    ["plan", "--json", "--nproc-per-node", "2"],
    ["plan", "--nproc-per-node", "2"],
    ["plan", "--help"],
    ["topology", "--json"],
    ["show"],
    ["doctor"],
    ["--version"],
    ["exec", "--dry-run", "--", "true"],
    ["exec", "--help"],
    ["run", "--dry-run", "--nproc-per-node", "2", "--", "true"],
    ["run", "--help"],
    ["sbatch", "--nodes", "1", "--gpus-per-node", "1", "--", "train.py"],
], ids=lambda a: " ".join(a))
@pytest.mark.parametrize("target", ["> /dev/full", "1</dev/null"], ids=["full", "read-only"])
def test_a_stdout_that_cannot_be_written_is_one_error_line(args: list[str], target: str) -> None:
    proc = shell(target, affrun_argv(*args))
    errors = [line for line in proc.stderr.splitlines() if line.startswith("affrun: error:")]
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-3000:]
    assert len(errors) == 1 and "stdout" in errors[0], proc.stderr[-3000:]
    assert ("No space left" if "full" in target else "Bad file descriptor") in errors[0]


@pytest.mark.torch
def test_a_torchrun_dry_run_to_a_full_stdout_is_one_error_line() -> None:
    proc = shell("> /dev/full", affrun_argv("torchrun", "--affrun-dry-run", "--nproc-per-node", "1", __file__),
                 timeout=180)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if line.startswith("affrun: error:")] == [
        "affrun: error: cannot write the output (stdout): No space left on device"]


@pytest.mark.parametrize("command", ["exec", "run"])
def test_a_full_stderr_never_stops_the_command(command: str) -> None:
    opts = ["--verbose", "--nproc-per-node", "1"] if command == "run" else ["--verbose"]
    proc = shell("2>/dev/full", affrun_argv(command, *opts, "--", "sh", "-c", "echo ran; exit 5"))
    assert (proc.returncode, proc.stdout) == (5, "ran\n")


# ---------------------------------------------------------------------------------------------- class 9: plan files
def _affrun_entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("affrun"))


def test_a_large_plan_reaches_every_process_of_the_job_without_a_file(tmp_path: Path) -> None:
    """``affrun run`` with a plan far over 32 KiB: the launcher and a process it starts later both read the plan
    (through the startup hook), and nothing is written to the temporary directory, nor left there."""
    root = big_tree(tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    before = _affrun_entries(Path("/tmp"))
    later = "import os; print('later', len(os.environ['AFFRUN_PLAN']))"
    code = f"import os, subprocess, sys; subprocess.run([sys.executable, '-c', {later!r}], check=True); print('first')"
    proc = affrun("run", "--fsroot", str(root), *BIG_PLAN, "--top", "launcher", "--", sys.executable, "-c", code,
                  env={"TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.split()
    assert lines[0] == "later" and int(lines[1]) < 128 * 1024 and lines[2] == "first", proc.stdout
    assert list(tmp.iterdir()) == []
    assert _affrun_entries(Path("/tmp")) == before


def test_a_large_plan_is_read_by_every_rank(tmp_path: Path) -> None:
    topo = load_topology(fsroot=str(big_tree(tmp_path)))
    parent = ParentPlan(make_plan(topo, Request(nproc=128, mode="socket")), "rank", "safe", "none", "auto", {}, False)
    assert len(parent.to_json()) > INLINE_PLAN_LIMIT
    value = parent.to_env()
    assert len(value) < 32 * 1024 and read_job(value).plan == parent.plan
    env = {"AFFRUN_PLAN": value, "LOCAL_RANK": "127", "LOCAL_WORLD_SIZE": "128"}
    proc = affrun("exec", "--dry-run", "--", "true", env=env)
    assert proc.returncode == 0 and proc.stdout.startswith("affrun: rank 127/128 "), proc.stderr[-2000:]


@pytest.mark.torch
def test_a_killed_torchrun_agent_leaves_nothing_behind(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "sleep.py"
    script.write_text("import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(300)\n")
    ready = tmp_path / "ready"
    agent = subprocess.Popen(affrun_argv("torchrun", "--nproc-per-node", "1", str(script), str(ready)),
                             env=clean_env(TMPDIR=str(tmp)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL)
    worker = 0
    try:
        deadline = time.monotonic() + 180
        while not (ready.exists() and ready.read_text()) and time.monotonic() < deadline and agent.poll() is None:
            time.sleep(0.2)
        assert ready.exists(), "the worker never started"
        worker = int(ready.read_text())
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        if worker:
            try:
                os.kill(worker, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert _affrun_entries(tmp) == []


def test_no_writable_temporary_directory_is_needed(tmp_path: Path) -> None:
    """In a mount namespace where /tmp, /var/tmp and the working directory are read-only, a large plan still
    reaches the command."""
    need(shutil.which("unshare") and os.geteuid() == 0, "needs root and unshare(1) for a read-only /tmp")
    root = big_tree(tmp_path)
    ro = "mount --bind {0} {0} && mount -o remount,bind,ro {0}"
    setup = " && ".join(ro.format(d) for d in ("/tmp", "/var/tmp") if os.path.isdir(d))
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", setup],
                           capture_output=True, timeout=30)
    need(probe.returncode == 0, f"cannot make /tmp read-only here: {probe.stderr[-200:]!r}")
    argv = affrun_argv("run", "--fsroot", str(root), *BIG_PLAN, "--top", "launcher", "--", sys.executable, "-c",
                       "print('ran')")
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           f'{setup} && cd /tmp && exec "$@"', "sh", *argv], env=clean_env(TMPDIR="/tmp"),
                          capture_output=True, text=True, timeout=BOUND)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0 and proc.stdout == "ran\n", proc.stderr[-3000:]


# ---------------------------------------------------------------------------------------------- class 14: AFFRUN_PLAN
@pytest.mark.parametrize(("value", "needles"), [
    ("@", ["AFFRUN_PLAN='@' names a plan file (@FILE), which affrun no longer reads"]),
    ("@/nonexistent/affrun-plan.json", ["AFFRUN_PLAN='@/nonexistent/affrun-plan.json' names a plan file"]),
    ("1e999", ["a number (1e999)", "plan object"]),
    ("-1e999", ["a number (-1e999)", "plan object"]),
    ("1e308", ["a number", "plan object"]),
    ("9" * 5000, ["a number", "plan object"]),
    ("NaN", ["a number (NaN)", "plan object"]),
    ("Infinity", ["a number", "plan object"]),
    ("42", ["a number (42)", "plan object"]),
    ('"plan"', ["a string", "plan object"]),
    ("[1, 2]", ["a list", "plan object"]),
    ("[" * 100000, ["a list", "plan object"]),
    ("true", ["holds true", "plan object"]),
    ("null", ["holds null", "plan object"]),
    (" ", ["nothing", "plan object"]),
    ('{"verbose": 1e999}', ["1e999 is out of range"]),
    ("zlib+base64:not base64!", ["damaged", "base64"]),
    ("zlib+base64:aGVsbG8=", ["damaged", "zlib"]),
], ids=lambda v: v[:20] if isinstance(v, str) else None)
def test_a_plan_variable_that_is_no_plan_says_what_it_holds(tmp_path: Path, value: str, needles: list[str]) -> None:
    proc = affrun("exec", "--", "true", env={"AFFRUN_PLAN": value, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    line = refused(proc, *needles)
    assert "inf" not in line.replace("Infinity", ""), line
    assert ": No such file" not in line, line


def test_a_plan_file_is_refused_in_one_line_even_when_it_holds_a_plan(tmp_path: Path) -> None:
    """``AFFRUN_PLAN=@FILE`` (affrun wrote none since it hands the plan in the variable) is no longer read: one line
    naming it, through the startup hook of a Python process as through affrun exec, the file left unread."""
    saved = tmp_path / "affrun-plan.json"
    saved.write_text(ParentPlan(make_plan(load_topology(), Request(nproc=1)), "rank", "safe", "none", "auto", {},
                                False).to_json())
    # affrun exec reads it as its parent's plan; (under AFFRUN_RUN it would be a job of its own, which leaves
    # affrun run's variables: tests/system/test_run_nesting.py)
    refused(affrun("exec", "--", "true", env={"AFFRUN_PLAN": f"@{saved}", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}),
            "names a plan file (@FILE), which affrun no longer reads")
    proc = subprocess.run([sys.executable, "-c", "print('user code ran')"], capture_output=True, text=True,
                          env=clean_env(AFFRUN_PLAN=f"@{saved}", AFFRUN_RUN="rank0"), timeout=BOUND)
    refused(proc, "no longer reads")
    assert "user code ran" not in proc.stdout
