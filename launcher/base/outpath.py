"""Whether a path given for a file affrun will write (``--feed-json``, ``affrun tune --save``/``--svg``) can be
written, checked before the work that produces it starts, and whether writing it would replace something else
(:func:`replaces`). A link is judged by what it points to."""

from __future__ import annotations

import os
import stat

KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
         (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (``a FIFO``)."""
    return next((name for test, name in KINDS if test(mode)), "a regular file")


def unwritable(path: str) -> str | None:
    """Why ``path`` cannot be written as a file of this user's (``None`` when it can): empty; a directory, FIFO,
    socket or device (itself or where its link points); another user's file; in a directory that does not exist
    or that this user may not write to."""
    if not path:
        return "is empty: give a file"
    full = os.path.realpath(path)
    through = "" if full == os.path.abspath(path) else f" (through its link to {full})"
    try:
        info: os.stat_result | None = os.stat(full)
    except FileNotFoundError:
        info = None
    except (OSError, ValueError) as exc:  # a link loop, a component that is a file, a NUL byte
        return f"cannot be used{through}: {getattr(exc, 'strerror', None) or exc}"
    if info is not None and stat.S_ISDIR(info.st_mode):
        return f"is a directory{through}: give a file in an existing directory"
    if info is not None and not stat.S_ISREG(info.st_mode):
        return f"is {file_kind(info.st_mode)}{through}, not a regular file: give a file in an existing directory"
    if info is not None and info.st_uid != os.geteuid():
        return f"is another user's file (uid {info.st_uid}){through}: give a file of your own"
    where = os.path.dirname(full)
    if not os.path.isdir(where):
        return f"names a directory that does not exist ({where}): give a file in an existing directory"
    if not os.access(where, os.W_OK | os.X_OK):
        return f"its directory {where} is not writable"
    return None


def replaces(path: str, marker: bytes, script: str | None) -> str | None:
    """What writing ``path`` would destroy (``None``: nothing): the ``script`` itself, or an existing non-empty
    file whose first 4 KiB hold no ``marker`` (what affrun writes there: a file of the user's own)."""
    full = os.path.realpath(path)
    if script is not None and os.path.exists(full) and os.path.exists(script) and os.path.samefile(full, script):
        return "is the training script"
    try:
        with open(full, "rb", opener=lambda p, f: os.open(p, f | os.O_NONBLOCK)) as fh:
            head = fh.read(4096)
    except OSError:
        return None  # absent, or not readable: unwritable() says what is wrong with it
    return None if not head or marker in head else "holds something affrun did not write"
