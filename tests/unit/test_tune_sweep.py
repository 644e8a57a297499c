"""``launcher.tune.sweep`` and ``launcher.tune.capture`` on real processes, without torch: a double fork into a
session of its own with an empty environment stays a descendant of a subreaper and is swept; the subreaper
attribute is restored; a trial's output is kept as a bounded tail and its last error line is one printable line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from launcher.tune.capture import HEAD, Blame, Tail, last_line
from launcher.tune.sweep import boot_ticks, descendants, subreaping, sweep

# A child that double-forks: the grandchild starts a session of its own, writes its pid and execs `sleep` with an
# empty environment; the child exits at once, so that the grandchild is an orphan.
ESCAPE = """
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(sys.argv[1], "w") as fh:
            fh.write(str(os.getpid()))
        os.execve("/bin/sleep", ["sleep", "60"], {})
    os._exit(0)
os.wait()
"""


def _escape(tmp_path: Path) -> int:
    where = tmp_path / "pid"
    subprocess.run([sys.executable, "-c", ESCAPE, str(where)], check=True, env={})
    deadline = time.monotonic() + 10
    while not where.exists() or not where.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return int(where.read_text())


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_an_orphan_in_a_new_session_stays_a_descendant_and_is_swept(tmp_path: Path) -> None:
    since = boot_ticks()
    with subreaping() as on:
        assert on
        pid = _escape(tmp_path)
        try:
            assert os.getsid(pid) != os.getsid(0)
            assert pid in {p for p, _ in descendants(os.getpid(), since=since)}
            assert sweep("no-such-marker", set(), since) == 0
        finally:
            if _running(pid):
                os.kill(pid, 9)
        assert not _running(pid) and not os.path.exists(f"/proc/{pid}")  # killed and reaped
    # the attribute is back: a later orphan goes to init (or to a subreaper above this process), not here
    pid = _escape(tmp_path)
    try:
        assert pid not in {p for p, _ in descendants(os.getpid())}
    finally:
        os.kill(pid, 9)


def test_the_output_is_read_in_bounded_memory() -> None:
    # 5 MB on one line, then a line: what is kept of the long line is its start (HEAD bytes), never all of it
    tail = Tail()
    proc = subprocess.Popen(["sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' x; printf '\\nlast\\n'"],
                            stdout=tail.fd, stderr=subprocess.STDOUT)
    tail.started()
    proc.wait()
    assert tail.finish() == "last"
    blame = Blame()
    blame.feed(b"KeyError: " + b"k" * 5_000_000)
    assert len(blame._line) == HEAD and blame.line().startswith("KeyError: kkk")


def test_the_script_s_exception_is_found_however_long_it_is_and_whatever_follows() -> None:
    # A rank's traceback whose exception line is 300 kB, then torchrun's own traceback (whose frame in
    # torch/distributed/elastic/multiprocessing/errors says "error") and its summary; fed whole, byte by byte and
    # in tune's chunks, the blame is the script's exception line.
    output = (b"affrun: starting rank 0/1 host h cpus 0-1\nTraceback (most recent call last):\n"
              b'  File "/job/train.py", line 1, in <module>\n' + b"ValueError: bad shard " + b"s" * 300_000 + b"\n"
              b"E1204 api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 1)\nTraceback (most recent call last):\n"
              b'  File "/v/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367, in wrapper\n'
              b"    return f(*args, **kwargs)\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
              b"====\n/job/train.py FAILED\n  error_file: <N/A>\n  traceback : see errors.html\n====\n")
    for step in (len(output), 1, 4096, 65536):
        blame = Blame()
        for i in range(0, len(output), step):
            blame.feed(output[i:i + step])
        assert blame.line().startswith("ValueError: bad shard sss") and len(blame.line()) <= 203, step
    # without an exception line: the last line that says an error, never torchrun's frame
    assert last_line(b"loading\ncuda error: out of memory\n" + output[output.index(b"E1204"):]) == (
        "cuda error: out of memory")


def test_the_last_line_is_one_printable_line() -> None:
    output = b"ok\nRuntimeError: \x1b[2Jboom\r\x85\nmore\n" + b"y" * 500
    line = last_line(output)
    assert line.startswith("RuntimeError: \\x1b[2Jboom") and line.isprintable()
    assert len(last_line(b"Error " + b"z" * 5000)) <= 203
    assert last_line(b"") == ""
