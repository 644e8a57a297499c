"""The meter's files: ``--feed-json``'s list, which every rank merges its figures into under a lock of the file
itself, and each rank's live file. Bounded reads, no link, FIFO or device followed, no wait without end
(docs/tune.md, "What the meter refuses or skips")."""

from __future__ import annotations

import errno
import os
import stat
from time import perf_counter, sleep
from typing import Any, Literal

from launcher.base.outpath import file_kind, own_dir, remove, replace_file, temporary

write_atomic = replace_file  # the one writer of affrun's files (launcher.base.outpath): (path, data, mode=None)

LIMIT = 16 << 20  # bytes: the figures of 60,000 ranks; a larger file at the path is not the meter's
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
_LOCKED = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
_NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC  # lock_problem's probe
Merged = Literal["written", "busy", "large"]


def read_open(fd: int, limit: int = LIMIT) -> bytes | None:
    """The content of the open file ``fd``; ``None`` when it is not a regular file or holds more than ``limit``."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.pread(fd, min(1 << 20, limit + 1 - size), size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return None if size > limit else b"".join(chunks)


def read_file(path: str, uid: int | None = None) -> bytes | None:
    """The content of the regular file ``path`` (of user ``uid``, when given); ``None`` for anything else: missing,
    a link, a FIFO or device (opened without waiting for a writer, never read), larger than :data:`LIMIT`."""
    try:
        fd = os.open(path, _READ)
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        return None
    try:
        if uid is not None and os.fstat(fd).st_uid != uid:
            return None
        return read_open(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def _lock(fd: int, deadline: float) -> bool:
    """An exclusive flock of ``fd``, polled until ``deadline`` (``perf_counter``): never a wait without end."""
    import fcntl

    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        if perf_counter() >= deadline:
            return False
        sleep(pause)
        pause = min(2 * pause, 0.02)


def _usable(info: os.stat_result) -> None:
    """Raise when the path no longer names a regular file of this user's (something replaced it after the start)."""
    if not stat.S_ISREG(info.st_mode):
        raise OSError(errno.EINVAL, f"{file_kind(info.st_mode)} took its place: not followed, not opened")
    if info.st_uid != os.geteuid():
        raise OSError(errno.EPERM, f"belongs to another user (uid {info.st_uid}) now")


def merge_json(path: str, figures: dict[str, Any], wait_s: float, most: int = LIMIT) -> Merged:
    """Put one rank's ``figures`` into the JSON list at ``path`` (sorted by rank), under an flock of the file itself,
    good only while ``path`` still names the locked file (each writer renames over it). ``"busy"``: the lock was
    held ``wait_s`` seconds; ``"large"``: the file holds more than ``most`` bytes, left unread. Raises ``OSError``
    when the file cannot be written."""
    import json

    deadline = perf_counter() + wait_s
    while True:
        try:
            _usable(os.lstat(path))
        except FileNotFoundError:
            pass
        fd = os.open(path, _LOCKED, 0o666)
        try:
            info = os.fstat(fd)
            _usable(info)
            if not _lock(fd, deadline):
                return "busy"
            try:
                now = os.lstat(path)
            except FileNotFoundError:
                continue
            if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):  # another rank renamed its file in meanwhile
                if perf_counter() >= deadline:
                    return "busy"
                continue
            raw = read_open(fd) or b"" if os.fstat(fd).st_size <= most else _larger(fd)
            if raw is None:  # what may be many ranks' figures, more than this merge may read
                return "large"
            try:
                old = json.loads(raw) if raw else []
            except (ValueError, RecursionError):  # not the meter's list: replaced, never raised in the loop
                old = []
            ranks = [r for r in old if isinstance(r, dict) and _rank_of(r) not in (None, figures["rank"])] \
                if isinstance(old, list) else []
            ranks.append(figures)
            ranks.sort(key=lambda r: r["rank"])
            write_atomic(path, json.dumps(ranks, separators=(",", ":")).encode("utf-8"))
            return "written"
        finally:
            os.close(fd)


def _larger(fd: int) -> bytes | None:
    """A file larger than a merge may read: ``None`` (left alone) when it may be the meter's list (it begins as a
    list of objects), else nothing (replaced, as a corrupt file is); beyond :data:`LIMIT`, nothing."""
    if os.fstat(fd).st_size > LIMIT:
        return b""
    head = os.pread(fd, 64, 0).lstrip()
    return None if head[:1] == b"[" and head[1:].lstrip()[:1] in (b"{", b"") else b""


def _rank_of(item: dict[str, Any]) -> int | None:
    """An object's rank; ``None`` for one without (it is no rank's figures: not kept)."""
    rank = item.get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def lock_problem(path: str) -> str | None:
    """Why ranks could not merge into ``path`` (``None`` when they can): a file created beside it (removed at once)
    must take an exclusive flock. A network filesystem without a lock manager refuses one."""
    import fcntl

    probe = temporary(path)
    try:
        fd = os.open(probe, _NEW, 0o600)
    except OSError as exc:
        return f"cannot create a file in its directory ({exc.strerror or exc})"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None
    except OSError as exc:
        return (f"is on a filesystem that takes no file lock (flock: {exc.strerror or exc}), which the ranks need "
                "to merge their figures: give a file on a local filesystem (/tmp, /dev/shm)")
    finally:
        os.close(fd)
        remove(probe)
    return None


__all__ = ["LIMIT", "Merged", "lock_problem", "merge_json", "own_dir", "read_file", "read_open", "remove", "temporary",
           "write_atomic"]
