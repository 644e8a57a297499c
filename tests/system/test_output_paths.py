"""Issue 40, class 1: every file affrun writes, named by a hostile path, through the real entry points.

The writers (``show --svg``, ``show --pid --svg``, ``topology --save``, ``sbatch -o``, ``tune --save``/``--svg``,
``--feed-json`` under ``exec``, ``run`` and ``torchrun``) meet the kinds of path: a FIFO, a standard stream of the
process (``/dev/stdout``, ``/dev/fd/1``, ``/proc/self/fd/1``, ``/proc/PID/fd/N``, the log that is its stdout), a file
another process holds open for writing, a device, a directory, a link to nothing, to a device or to another user's
file, a loop, a missing directory, a file affrun did not write. Each is one ``affrun: error:`` line within a bound,
before any work (nothing on stdout, no trial, no rank), the path and its directory left as they were. A new file, a
file affrun wrote before and a link to the user's own file are written (the link stays, its file is replaced).
docs/design.md ("The files affrun writes") states the rule.

Every writer asks the one reader (``launcher.base.outpath.check``) before any work, so each kind is met by every
writer that starts without torch; the three that import torch first (seconds each) meet the kinds whose answer
depends on the writer: its own file's marker, its process's standard output, a FIFO and a path through /proc.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

import pytest

from tests.errors import refused
from tests.launch import PROGRAMS, affrun_argv, another_users_file, clean_env, run
from tests.system.test_hostile_input import BOUND

LOOP = str(PROGRAMS / "feed_loop.py")
EARLIER = "the training's earlier output\n"


@pytest.fixture(scope="module")
def target_pid() -> Iterator[int]:
    """A running process for ``show --pid`` to draw."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _tune(option: str) -> Callable[[str, int], list[str]]:
    return lambda path, _: ["tune", "--nproc-per-node", "1", "--budget", "1e-9", option, path, LOOP]


# writer -> (the affrun arguments that write PATH, with a process to draw; what the file it writes begins with or
# holds)
WRITERS: dict[str, tuple[Callable[[str, int], list[str]], str]] = {
    "show --svg": (lambda path, _: ["show", "--svg", path], "<title>affrun show"),
    "show --pid --svg": (lambda path, pid: ["show", "--pid", str(pid), "--duration", "0.2", "--svg", path],
                         "<title>affrun show --pid"),
    "topology --save": (lambda path, _: ["topology", "--save", path], '"format": "affrun-topology/'),
    "sbatch -o": (lambda path, _: ["sbatch", "--nodes", "1", "-o", path, "--", "train.py"], "#SBATCH"),
    "tune --save": (_tune("--save"), "affrun-tuned:"),
    "tune --svg": (_tune("--svg"), "<title>affrun tune"),
    "exec --feed-json": (lambda path, _: ["exec", "--feed-json", path, "--", sys.executable, LOOP, "--items", "8"],
                         '"rank":0'),
    "run --feed-json": (lambda path, _: ["run", "--feed-json", path, "--", sys.executable, LOOP, "--items", "8"],
                        '"rank":0'),
    "torchrun --feed-json": (lambda path, _: ["torchrun", "--nproc-per-node", "1", "--feed-json", path, LOOP,
                                              "--items", "8"], '"rank":0'),
}
TORCH_WRITERS = ("tune --save", "tune --svg", "torchrun --feed-json")  # torch is imported before the path is checked
# Good cases that run a job: the tune writers are written after trials (tests/system/test_tune.py), run and
# torchrun write --feed-json through the one writer as exec does.
WRITTEN = ["show --svg", "show --pid --svg", "topology --save", "sbatch -o",
           pytest.param("exec --feed-json", marks=pytest.mark.torch)]

# kind -> what the error line says
HOSTILE = {
    "fifo": "is a FIFO",
    "/dev/stdout": "through /proc",
    "/dev/fd/1": "through /proc",
    "/proc/self/fd/1": "through /proc",
    "/proc/PID/fd/N": "through /proc",
    "the log that is stdout": "standard output (fd 1)",
    "open for writing elsewhere": "open for writing in another process",
    "/dev/null": "is a character device",
    "link to /dev/zero": "is a character device (through its link",
    "directory": "is a directory",
    "dangling link": "is a link to nothing",
    "link to another user's file": "another user's file",
    "link loop": "cannot be used",
    "missing directory": "names a directory that does not exist",
    "a file of the user's": "did not write",
}
STDOUT_KINDS = ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", "/proc/PID/fd/N", "the log that is stdout")
WRITER_KINDS = ("a file of the user's", "the log that is stdout", "fifo", "/dev/stdout")  # what TORCH_WRITERS meet
HOSTILE_CASES = [pytest.param(writer, kind, marks=[pytest.mark.torch] if writer in TORCH_WRITERS else [])
                 for writer in WRITERS for kind in HOSTILE if writer not in TORCH_WRITERS or kind in WRITER_KINDS]


def _state(where: Path) -> dict[str, tuple[int, int, int, bytes | None]]:
    """Each name in ``where``: inode, mode, size and, for a regular file, its bytes."""
    out = {}
    for name in sorted(os.listdir(where)):
        info = os.lstat(where / name)
        data = (where / name).read_bytes() if stat.S_ISREG(info.st_mode) else None
        out[name] = (info.st_ino, info.st_mode, info.st_size, data)
    return out


def _hostile(out: Path, kind: str, log: IO[Any]) -> str:
    """The path of ``kind`` in the directory ``out`` (``log``: the test's open log, the stdout of affrun)."""
    path = out / "out.file"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "/proc/PID/fd/N":
        return f"/proc/{os.getpid()}/fd/{log.fileno()}"
    elif kind in STDOUT_KINDS:
        return log.name if kind == "the log that is stdout" else kind
    elif kind == "open for writing elsewhere":
        path.write_text("")  # held open by this test (log stands for the shell's redirection or tee)
    elif kind == "/dev/null":
        return "/dev/null"
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "dangling link":
        path.symlink_to(out / "planted.file")
    elif kind == "link to another user's file":
        path.symlink_to(another_users_file(out))
    elif kind == "link loop":
        path.symlink_to(path)
    elif kind == "missing directory":
        return str(out / "missing" / "out.file")
    elif kind == "a file of the user's":
        path.write_text("the user's own notes\n")
    return str(path)


@pytest.mark.parametrize(("writer", "kind"), HOSTILE_CASES)
def test_a_hostile_output_path_is_one_error_line_before_any_work(tmp_path: Path, target_pid: int, writer: str,
                                                               kind: str) -> None:
    """Before: show --svg and topology --save drew and then blocked on a FIFO, wrote /dev/null and /dev/stdout
    (truncating the log it led to), wrote through links to other users' files and created the file a dangling
    link named; --feed-json /dev/stdout unlinked the training's log and put the JSON in its place."""
    args = WRITERS[writer][0]
    out = tmp_path / "out"
    out.mkdir()
    log_path = tmp_path / "train.log"
    with open(log_path, "a", encoding="utf-8") as log, ExitStack() as held:  # the log as `>> train.log` opens it
        log.write(EARLIER)
        log.flush()
        path = _hostile(out, kind, log)
        if kind == "open for writing elsewhere":
            held.enter_context(open(path, "a", encoding="utf-8"))
        before, log_before = _state(out), os.stat(log_path)
        stdout = log if kind in STDOUT_KINDS else None
        proc = run(affrun_argv(*args(path, target_pid)), env=clean_env(), timeout=BOUND, stdout=stdout)
    refused(proc, writer.split()[-1], HOSTILE[kind])
    assert proc.stdout == "" and "trial" not in proc.stderr, proc.stdout  # nothing drawn, printed or started
    assert _state(out) == before  # nothing written, created, replaced or left behind
    log_after = os.stat(log_path)
    assert (log_after.st_ino, log_path.read_text()) == (log_before.st_ino, EARLIER)  # the training's log kept


def _run(writer: str, path: Path, pid: int) -> subprocess.CompletedProcess[str]:
    proc = run(affrun_argv(*WRITERS[writer][0](str(path), pid)), env=clean_env(), timeout=4 * BOUND)
    assert proc.returncode == 0 and "affrun: error" not in proc.stderr, proc.stderr[-3000:]
    return proc


def _holds(writer: str, path: Path) -> bool:
    text = path.read_text()
    return WRITERS[writer][1] in (text.replace(" ", "") if writer.endswith("--feed-json") else text)


@pytest.mark.parametrize("writer", WRITTEN)
def test_a_new_file_then_the_same_file_again_is_written(tmp_path: Path, target_pid: int, writer: str) -> None:
    """A file affrun wrote is rewritten: a new file renamed over it, whose permission bits are the old file's (a
    batch script's are 0755, as sbatch -o always set them); no temporary file is left."""
    path = tmp_path / "out.file"
    _run(writer, path, target_pid)
    assert _holds(writer, path)
    path.chmod(0o600)
    first = os.stat(path).st_ino
    _run(writer, path, target_pid)
    assert _holds(writer, path) and os.stat(path).st_ino != first
    mode = 0o755 if writer == "sbatch -o" else 0o600
    assert stat.S_IMODE(os.stat(path).st_mode) == mode and os.listdir(tmp_path) == ["out.file"]


@pytest.mark.parametrize("writer", WRITTEN)
def test_a_link_to_a_file_of_ones_own_is_followed_and_stays(tmp_path: Path, target_pid: int, writer: str) -> None:
    """The file the link names is replaced (it held affrun's earlier output); the link itself stays a link."""
    (tmp_path / "elsewhere").mkdir()
    target = tmp_path / "elsewhere" / "out.file"
    _run(writer, target, target_pid)
    link = tmp_path / "out.file"
    link.symlink_to(target)
    _run(writer, link, target_pid)
    assert link.is_symlink() and os.readlink(link) == str(target) and _holds(writer, target)
    assert os.listdir(target.parent) == ["out.file"]
    if writer == "exec --feed-json":
        assert [f["rank"] for f in json.loads(target.read_text())] == [0]
