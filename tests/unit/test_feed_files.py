"""The meter's file handling (launcher.feed.files) and the front ends' check and writer of an output path
(launcher.base.outpath), on real files: what is never followed, opened or read past its bound, and how two writers
holding the same path agree."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from launcher.feed import files


def test_reads_are_bounded_and_never_follow_or_wait(tmp_path: Path) -> None:
    data = tmp_path / "data.json"
    data.write_bytes(b"[1]")
    assert files.read_file(str(data)) == b"[1]"
    assert files.read_file(str(data), os.getuid() + 1) is None  # another user's: not read
    link = tmp_path / "link"
    link.symlink_to(data)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opened without waiting for a writer, never read
    huge = tmp_path / "huge"
    with open(huge, "wb") as fh:
        fh.truncate(files.LIMIT + 1)
    for path in (link, fifo, huge, tmp_path, tmp_path / "missing", "/dev/zero", "nul\0byte"):
        assert files.read_file(str(path)) is None, path


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "gone" / "feed.json"
    with pytest.raises(FileNotFoundError):
        files.write_atomic(str(target), b"[]")
    (tmp_path / "feed.json").mkdir()  # the rename fails: the temporary file it wrote is removed
    with pytest.raises(OSError):
        files.write_atomic(str(tmp_path / "feed.json"), b"[]")
    assert os.listdir(tmp_path) == ["feed.json"]


def test_merge_keeps_every_ranks_object_under_threads_that_race(tmp_path: Path) -> None:
    """Sixteen writers at once (each opens the file itself: flock excludes them as it does processes), ten writes
    each: every rank's last object is there."""
    path = str(tmp_path / "feed.json")

    def rank(r: int) -> None:
        for n in range(10):
            assert files.merge_json(path, {"rank": r, "n": n}, 30.0) == "written"

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert json.loads(Path(path).read_text()) == [{"rank": r, "n": 9} for r in range(16)]
    assert os.listdir(tmp_path) == ["feed.json"]


def test_a_held_lock_is_waited_for_within_the_bound_only(tmp_path: Path) -> None:
    import fcntl

    path = tmp_path / "feed.json"
    path.write_text("[]")
    with open(path, "r+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert files.merge_json(str(path), {"rank": 0}, 0.05) == "busy"
    assert files.merge_json(str(path), {"rank": 0}, 0.05) == "written"


def test_what_replaced_the_file_is_an_error_not_followed(tmp_path: Path) -> None:
    path = tmp_path / "feed.json"
    path.symlink_to("/dev/zero")
    with pytest.raises(OSError, match="a symbolic link took its place"):
        files.merge_json(str(path), {"rank": 0}, 0.05)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(OSError, match="a FIFO took its place"):
        files.merge_json(str(path), {"rank": 0}, 0.05)


def test_own_dir(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    link = tmp_path / "link"
    link.symlink_to(mine)
    assert files.own_dir(str(mine), os.getuid())
    assert not files.own_dir(str(mine), os.getuid() + 1)
    assert not files.own_dir(str(shared), os.getuid()) and not files.own_dir(str(link), os.getuid())
    assert files.lock_problem(str(mine / "feed.json")) is None and os.listdir(mine) == []


def test_a_rank_line_with_control_characters_is_escaped(capfd: pytest.CaptureFixture[str]) -> None:
    """A --feed-json path with a newline or an escape sequence reaches stderr as one escaped line."""
    from launcher.feed import meter

    meter._say("affrun: warning: --feed-json /tmp/a\nb\x1b[31m: gone")
    err = capfd.readouterr().err
    assert err == "affrun: warning: --feed-json /tmp/a\\nb\\x1b[31m: gone\n"


@pytest.mark.parametrize("planted", ["link", "file", "fifo"])
def test_what_takes_the_name_between_the_check_and_the_write_is_never_replaced(tmp_path: Path, planted: str) -> None:
    """The window a link planted in a world-writable directory would use: the name was free when checked, so the
    new file takes it with link(2), which fails if anything is there now; the planted thing stays as it was."""
    from launcher.base.outpath import Refused, check, marked, replace_file

    path = tmp_path / "out.svg"
    real = check(str(path), marked(b"<svg"))
    victim = tmp_path / "victim"
    victim.write_text("someone else's")
    {"link": lambda: path.symlink_to(victim), "file": lambda: path.write_text("planted"),
     "fifo": lambda: os.mkfifo(path)}[planted]()
    before = os.lstat(path)
    with pytest.raises(Refused, match="created by another process"):
        replace_file(real, b"<svg/>", was=None)
    after = os.lstat(path)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode) and victim.read_text() == "someone else's"
    assert sorted(os.listdir(tmp_path)) == ["out.svg", "victim"]


def test_a_file_swapped_after_the_check_is_never_replaced(tmp_path: Path) -> None:
    from launcher.base.outpath import Refused, replace_file

    path = tmp_path / "out.svg"
    path.write_text("<svg/>")
    checked = os.lstat(path)
    path.unlink()
    path.symlink_to("/dev/null")
    with pytest.raises(Refused, match="replaced by another file"):
        replace_file(str(path), b"<svg/>", was=checked)
    assert path.is_symlink() and os.listdir(tmp_path) == ["out.svg"]
