"""Issue 34, class 1: hostile ``--feed-json`` paths and live files, through ``affrun exec``, ``run`` and ``torchrun``.

What can be known before the start is refused by the front end in one line, the file left as it was: a directory,
a FIFO, a device (through a link), another user's file, a file that is not the meter's (the user's own data, the
script, a huge or corrupt file), a filesystem that takes no lock. What shows later (the directory removed, a FIFO or
link or huge file put in place, a full tmpfs) costs the rank one warning and never its loop. The ranks' lock works
where flock needs a file open for writing (NFS), and every rank's final figures end up in the file. docs/tune.md
("What the meter refuses or skips") states each case.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.feed.meter import live_paths
from tests.conftest import need
from tests.errors import refused
from tests.launch import OTHER_UID, PROGRAMS, affrun_argv, another_users_file, clean_env, json_lines, run
from tests.system.test_hostile_input import affrun

pytestmark = pytest.mark.torch

LOOP = str(PROGRAMS / "feed_loop.py")
HOSTILE = str(PROGRAMS / "feed_hostile_loop.py")


def _figures(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    assert isinstance(data, list)
    return data


def _quiet(proc: subprocess.CompletedProcess[str], warnings: int = 0) -> None:
    """The training ran to its end: exit 0, no traceback, exactly ``warnings`` lines of affrun's warnings."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("affrun: warning")]
    assert len(said) == warnings, proc.stderr[-3000:]


# ---------------------------------------------------------------------------------------------- before the start
def _hostile_path(tmp_path: Path, kind: str) -> tuple[Path, bytes | None]:
    """A ``--feed-json`` path of ``kind``, and its bytes (None: not a regular file of ours) to hold unchanged."""
    path = tmp_path / "feed.json"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link-to-device":
        path.symlink_to("/dev/zero")
    elif kind == "link-to-theirs":
        path.symlink_to(another_users_file(tmp_path))
    elif kind == "link-loop":
        path.symlink_to(path)
    elif kind == "their-file":
        path = another_users_file(tmp_path)
    elif kind == "users-data":
        path.write_text('{"accuracy": 0.91}\n')
    elif kind == "the-script":
        path = tmp_path / "train.py"
        shutil.copy(LOOP, path)
    elif kind == "corrupt":
        path.write_bytes(b'[{"rank": 0, "batches": 1')
    elif kind == "huge":
        with open(path, "wb") as fh:
            fh.truncate(1 << 30)  # sparse: never read, never on disk
    return path, path.read_bytes() if kind in ("users-data", "the-script", "corrupt") else None


KINDS = {"directory": "is a directory", "fifo": "is a FIFO", "link-to-device": "character device",
         "link-to-theirs": "another user's file", "link-loop": "cannot be used", "their-file": "another user's file",
         "users-data": "affrun did not write", "the-script": "affrun did not write",
         "corrupt": "affrun did not write", "huge": "affrun did not write"}


@pytest.mark.parametrize("kind", list(KINDS))
def test_exec_refuses_what_it_can_know_before_the_start(tmp_path: Path, kind: str) -> None:
    """Before: a FIFO hung the rank at its first flush (SIGTERM could not end it); a file of the user's, the script
    named by mistake, was replaced by the figures."""
    path, held = _hostile_path(tmp_path, kind)
    before = os.lstat(path)
    refused(affrun("exec", "--feed-json", str(path), "--", sys.executable, LOOP), "--feed-json", KINDS[kind])
    after = os.lstat(path)
    assert (after.st_ino, after.st_mode, after.st_size) == (before.st_ino, before.st_mode, before.st_size)
    if held is not None:
        assert path.read_bytes() == held


@pytest.mark.parametrize("kind", ["fifo", "the-script"])
@pytest.mark.parametrize("front", ["run", "torchrun"])
def test_run_and_torchrun_no_longer_remove_what_is_not_theirs(tmp_path: Path, kind: str, front: str) -> None:
    """Before: ``affrun run`` and ``affrun torchrun`` removed the file at the path, whatever it was, at the start."""
    path, held = _hostile_path(tmp_path, kind)
    option = ["--feed-json", str(path)]
    argv = ["torchrun", "--nproc-per-node", "1", *option, LOOP] if front == "torchrun" else \
        ["run", *option, "--", sys.executable, LOOP]
    refused(affrun(*argv), KINDS[kind])
    assert stat.S_ISFIFO(os.lstat(path).st_mode) if kind == "fifo" else path.read_bytes() == held


def test_a_filesystem_without_locks_is_refused(tmp_path: Path) -> None:
    """flock answering ENOLCK (an NFS mount without a lock manager): the ranks could not merge, so it is refused."""
    shim = _nfs_shim(tmp_path)
    path = tmp_path / "feed.json"
    proc = affrun("exec", "--feed-json", str(path), "--", sys.executable, LOOP,
                  env={"LD_PRELOAD": str(shim), "NFS_FLOCK_ERRNO": "ENOLCK"})
    refused(proc, "takes no file lock", "No locks available")
    assert os.listdir(tmp_path) == [shim.name]  # the probe is gone


def test_a_link_to_a_file_of_ones_own_is_written_through(tmp_path: Path) -> None:
    """A link the user made (to a file of theirs elsewhere) is followed by the front end: the figures go to the
    file it points to, and the link stays."""
    (tmp_path / "elsewhere").mkdir()
    target = tmp_path / "elsewhere" / "feed.json"
    target.write_text("[]")
    link = tmp_path / "feed.json"
    link.symlink_to(target)
    _quiet(run(affrun_argv("exec", "--feed-json", str(link), "--", sys.executable, LOOP, "--items", "8")))
    assert link.is_symlink() and [f["final"] for f in _figures(target)] == [True]
    assert sorted(os.listdir(target.parent)) == ["feed.json"]


def test_exec_as_the_jobs_only_rank_clears_an_old_file(tmp_path: Path) -> None:
    """As torchrun and run do: an old file's ranks (here 3, from an earlier job of 4) are gone."""
    path = tmp_path / "feed.json"
    path.write_text(json.dumps([{"rank": r, "batches": 1} for r in range(4)]))
    _quiet(run(affrun_argv("exec", "--feed-json", str(path), "--", sys.executable, LOOP, "--items", "8")))
    assert [f["rank"] for f in _figures(path)] == [0]


# ---------------------------------------------------------------------------------------------- the ranks' lock
def _nfs_shim(tmp_path: Path) -> Path:
    """tests/programs/nfs_flock.c built: flock() as an NFS client has it (an exclusive lock needs a file open for
    writing: a directory never takes one)."""
    need(shutil.which("gcc"), "gcc is not installed")
    out = tmp_path / "nfs_flock.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", str(PROGRAMS / "nfs_flock.c"), "-o", str(out), "-ldl"],
                   check=True)
    return out


def test_ranks_merge_their_figures_where_flock_works_as_on_nfs(tmp_path: Path) -> None:
    """Two ranks under torchrun, flock as on NFS. Before: every rank warned 'Bad file descriptor' (it locked the
    directory, opened read-only) and the file was never written."""
    shim = _nfs_shim(tmp_path)
    (tmp_path / "out").mkdir()
    path = tmp_path / "out" / "feed.json"
    argv = affrun_argv("torchrun", "--nproc-per-node", "2", "--feed-json", str(path), HOSTILE,
                       "--items", "300", "--item-sleep", "0.002", "--step-sleep", "0.002")
    proc = run(argv, env=clean_env(LD_PRELOAD=str(shim)), timeout=300)
    _quiet(proc)
    owns = {o["pid"]: o for o in json_lines(proc.stdout)}
    figures = _figures(path)
    assert [f["rank"] for f in figures] == [0, 1] and all(f["final"] for f in figures)
    assert all(f["batches"] == owns[f["pid"]]["batches"] == 300 for f in figures)
    assert os.listdir(path.parent) == ["feed.json"]  # no temporary file left


def test_a_lock_that_fails_under_the_rank_is_one_warning(tmp_path: Path) -> None:
    """flock failing only in the rank (ENOLCK: the lock manager went away after the start; the rank's own variables,
    as torchrun's ranks get them): one warning, the loop runs to its end."""
    shim = _nfs_shim(tmp_path)
    path = tmp_path / "feed.json"
    proc = run([sys.executable, LOOP], env=clean_env(AFFRUN_FEED="1", AFFRUN_FEED_JSON=str(path),
                                                     LD_PRELOAD=str(shim), NFS_FLOCK_ERRNO="ENOLCK"))
    _quiet(proc, warnings=1)
    assert "No locks available" in proc.stderr and path.read_bytes() == b""  # made to be locked, never written


RACE = """
import os, sys, time
from torch.utils.data import DataLoader
ready, ranks = sys.argv[1], int(sys.argv[2])
open(os.path.join(ready, os.environ["RANK"]), "w").close()
while len(os.listdir(ready)) < ranks:  # every rank has imported torch
    time.sleep(0.01)
end = max(os.stat(os.path.join(ready, name)).st_mtime for name in os.listdir(ready)) + 3
loader = DataLoader(list(range(64)), batch_size=1)
while time.time() < end:  # tiny batches up to a common instant: every rank flushes often, and all exit at once
    for _ in loader:
        pass
"""


def test_many_ranks_exiting_at_once_all_leave_their_final_figures(tmp_path: Path) -> None:
    """Eight ranks (the variables torchrun gives them) flush about once a second and write their final figures at
    the same instant: every rank's final object is in the file, none lost to another's rename."""
    path = tmp_path / "feed.json"
    (tmp_path / "ready").mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(tmp_path / "ready"), "8"], stderr=subprocess.PIPE,
                              text=True, env=clean_env(AFFRUN_FEED="1", AFFRUN_FEED_JSON=str(path), RANK=str(rank)))
             for rank in range(8)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "warning" not in err and "Traceback" not in err, err
    figures = _figures(path)
    assert [f["rank"] for f in figures] == list(range(8)) and all(f["final"] for f in figures), figures
    assert sorted(os.listdir(tmp_path)) == ["feed.json", "ready"]


# ---------------------------------------------------------------------------------------------- after the start
def _hostile_run(tmp_path: Path, kind: str, target: str = "") -> tuple[subprocess.CompletedProcess[str], Path]:
    """A loop under ``affrun exec --feed-json DIR/feed.json`` during which something else does ``kind`` to the
    path (tests/programs/feed_hostile_loop.py --hostile)."""
    (tmp_path / "out").mkdir()
    path = tmp_path / "out" / "feed.json"
    argv = affrun_argv("exec", "--feed-json", str(path), "--", sys.executable, HOSTILE, "--items", "600",
                       "--item-sleep", "0.002", "--step-sleep", "0.002", "--hostile", kind, "--at", "200",
                       "--path", str(path), "--target", target)
    return run(argv, timeout=300), path


def test_a_directory_removed_under_the_rank_is_one_warning(tmp_path: Path) -> None:
    proc, path = _hostile_run(tmp_path, "vanish")
    _quiet(proc, warnings=1)
    assert "no more figures" in proc.stderr and not path.parent.exists()  # never made again


def test_a_huge_file_put_in_place_is_never_read(tmp_path: Path) -> None:
    """Before: the next flush read the whole GiB into memory (about 2 GiB more resident), stalling the loop for
    seconds while the meter's wait did not count it."""
    proc, path = _hostile_run(tmp_path, "huge")
    _quiet(proc)
    (own,) = json_lines(proc.stdout)
    assert own["maxrss_mib"] < 700, own  # torch's rank is about 220 MiB here
    assert [f["final"] for f in _figures(path)] == [True]


def test_a_fifo_put_in_place_is_never_opened(tmp_path: Path) -> None:
    """Before: the next flush opened the FIFO and waited for a writer forever."""
    proc, path = _hostile_run(tmp_path, "fifo")
    _quiet(proc, warnings=1)
    assert "a FIFO took its place" in proc.stderr and stat.S_ISFIFO(os.lstat(path).st_mode)


@pytest.mark.parametrize("target", ["/dev/zero", "theirs"])
def test_a_link_put_in_place_is_never_followed(tmp_path: Path, target: str) -> None:
    """A link to /dev/zero (before: read without end) or to another user's file: not followed, not replaced."""
    victim = another_users_file(tmp_path) if target == "theirs" else Path(target)
    held = victim.read_bytes() if target == "theirs" else b""
    proc, path = _hostile_run(tmp_path, "symlink", str(victim))
    _quiet(proc, warnings=1)
    assert "a symbolic link took its place" in proc.stderr and os.readlink(path) == str(victim)
    assert target != "theirs" or victim.read_bytes() == held


# ---------------------------------------------------------------------------------------------- the live files
@pytest.fixture
def outside() -> Any:
    """A directory out of /dev/shm (where the tests' own temporary directories may be): a namespace of the test's
    own mounts a fresh tmpfs there."""
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="affrun-feed-test-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    yield where
    shutil.rmtree(where, ignore_errors=True)


def _namespace(setup: str, argv: list[str], env: dict[str, str], after: str = "") -> subprocess.CompletedProcess[str]:
    """``argv`` in a mount namespace of its own, where /dev/shm is a fresh tmpfs and ``setup`` (sh) has run, then
    ``after`` (its output on stdout too); the exit status is ``argv``'s. Without ``after`` the shell execs
    ``argv``: ``$$`` in ``setup`` is the rank's pid (affrun exec runs the command in its own process)."""
    need(shutil.which("unshare") and os.geteuid() == 0, "needs root and unshare(1) for a /dev/shm of the test's own")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, timeout=30)
    need(probe.returncode == 0, f"no mount namespace here: {probe.stderr[-200:]!r}")
    then = f'{{ "$@"; rc=$?; {after}; exit $rc; }}' if after else 'exec "$@"'
    script = f"mount -t tmpfs -o size=1m,mode=1777 tmpfs /dev/shm && {setup} && {then}"
    return run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv],
               env=clean_env(**env), timeout=300)


def test_a_live_directory_others_may_write_is_not_used(outside: Path) -> None:
    """/dev/shm/affrun-feed-0 is root's but open to all, and another user has put links in it where the rank
    writes (its live file, and the temporary name it had before): the rank leaves the directory alone, nothing is
    followed, it uses $TMPDIR's directory instead and removes it at exit. Before: the victim was overwritten."""
    victim = another_users_file(outside)
    held = victim.read_bytes()
    (outside / "tmp").mkdir()
    d = "/dev/shm/affrun-feed-0"
    setup = (f"mkdir -m 777 {d} && ln -s {victim} {d}/$$.json && ln -s {victim} {d}/$$.json.$$.tmp && "
             f"chown -h {OTHER_UID} {d}/$$.json {d}/$$.json.$$.tmp")
    argv = affrun_argv("exec", "--feed-report", "--", sys.executable, HOSTILE, "--items", "300",
                       "--item-sleep", "0.002", "--step-sleep", "0.002")
    _quiet(_namespace(setup, argv, {"TMPDIR": str(outside / "tmp")}))
    assert victim.read_bytes() == held
    assert os.listdir(outside / "tmp") == []  # $TMPDIR's directory was used instead, and removed at exit


def test_a_read_only_filesystem_is_refused(outside: Path) -> None:
    """Even for root, whom the permission bits do not stop."""
    setup = f"mount -t tmpfs -o ro tmpfs {outside}"
    proc = _namespace(setup, affrun_argv("exec", "--feed-json", str(outside / "feed.json"), "--", "true"), {})
    refused(proc, "--feed-json", "is not writable")


def test_a_full_tmpfs_is_one_warning_each_and_leaves_nothing(outside: Path) -> None:
    """/dev/shm and the JSON's directory both full. Before: an empty temporary file stayed in each, the live file
    was tried again every second, without a word."""
    (outside / "full").mkdir()
    path = outside / "full" / "feed.json"
    fill = "{{ dd if=/dev/zero of={0}/fill bs=4096 count=1024 2>/dev/null; true; }}"
    setup = (f"mount -t tmpfs -o size=64k tmpfs {path.parent} && {fill.format('/dev/shm')} && "
             f"{fill.format(path.parent)} && mkdir -m 700 /dev/shm/affrun-feed-0")
    argv = affrun_argv("exec", "--feed-json", str(path), "--", sys.executable, HOSTILE, "--items", "300",
                       "--item-sleep", "0.002", "--step-sleep", "0.002")
    proc = _namespace(setup, argv, {}, after=f"echo LEFT $(ls -A /dev/shm/affrun-feed-0) $(ls -A {path.parent})")
    _quiet(proc, warnings=2)
    assert proc.stderr.count("No space left on device") == 2, proc.stderr
    assert proc.stdout.splitlines()[-1].split() == ["LEFT", "feed.json", "fill"], proc.stdout


FAKE = {"rank": 0, "batches": 9999, "seconds": 10.0, "batches_per_s": 999.9, "data_wait_fraction": 0.99, "loaders": 1,
        "num_workers": [0], "workers_source": "script", "final": False, "host": "vm"}


@pytest.mark.parametrize("planted", ["figures", "fifo"])
def test_doctor_reads_no_live_file_another_user_planted(outside: Path, planted: str) -> None:
    """Another user made /dev/shm/affrun-feed-0 first, with a file named after the rank's pid: made-up figures (before:
    ``affrun doctor --pid`` showed them as the rank's), or a FIFO (before: doctor waited on it for a writer forever).
    The rank keeps its live file under $TMPDIR; doctor, run in the rank's mount namespace, reads that one."""
    need(shutil.which("nsenter"), "needs nsenter(1) to run doctor in the rank's mount namespace")
    (outside / "tmp").mkdir()
    d = "/dev/shm/affrun-feed-0"
    fake = json.dumps(FAKE)[:-1] + ', "pid": '  # and the rank's pid, $$ for the shell that execs it
    plant = f"mkfifo {d}/$$.json" if planted == "fifo" else f"echo '{fake}'$$'}}' > {d}/$$.json"
    setup = f"mkdir -m 755 {d} && {plant} && chown -R {OTHER_UID} {d}"
    argv = affrun_argv("exec", "--feed-report", "--", sys.executable, LOOP, "--items", "100000", "--hang-after", "150")
    script = f'mount -t tmpfs -o size=1m,mode=1777 tmpfs /dev/shm && {setup} && exec "$@"'
    _namespace("true", ["true"], {})  # the checks that namespaces work here
    with subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv],
                          env=clean_env(TMPDIR=str(outside / "tmp")), stdout=subprocess.PIPE, text=True) as rank:
        try:
            assert rank.stdout is not None
            own = json.loads(rank.stdout.readline())
            live = live_paths(own["pid"], os.getuid(), {"TMPDIR": str(outside / "tmp")})[1]
            for _ in range(600):
                if os.path.exists(live):
                    break
                time.sleep(0.1)
            doctor = run(["nsenter", f"--mount=/proc/{own['pid']}/ns/mnt", "--", *affrun_argv(
                "doctor", "--pid", str(own["pid"]), "--duration", "0.3", "--json")], timeout=120)
        finally:
            rank.kill()
    (process,) = [p for p in json.loads(doctor.stdout)["processes"] if p["pid"] == own["pid"]]
    assert process["feed"]["data_wait_fraction"] == pytest.approx(own["fraction"], abs=0.04), (process["feed"], own)
    assert process["feed"]["batches"] <= own["batches"]
