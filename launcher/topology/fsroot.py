"""Reads under an ``--fsroot`` stay inside it: a path is opened with ``O_PATH`` and reads as absent unless its real
path lies under the tree's. The root holds for a read's duration (:class:`within`); with none (the live machine),
paths are opened as they are. Why and how: docs/design.md §6."""

from __future__ import annotations

import errno
import os
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import TracebackType


_ROOT: ContextVar[str | None] = ContextVar("affrun_fsroot", default=None)  # the active tree's real path


class within:
    """``with within(root):`` confines the reads of this module's callers to ``root`` (nothing for ``/``)."""

    def __init__(self, root: str) -> None:
        real = os.path.realpath(root)
        self.real = None if real == "/" else real
        self.token: Token[str | None] | None = None

    def __enter__(self) -> within:
        self.token = _ROOT.set(self.real)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.token is not None:
            _ROOT.reset(self.token)


def _confined(path: str, follow_last: bool = True) -> str:
    """``path`` itself outside any root, else its real path (of the link itself at its end unless ``follow_last``),
    which must lie in the tree: :class:`FileNotFoundError` when it does not, :class:`OSError` as ``os.open``."""
    root = _ROOT.get()
    if root is None:
        return path
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC | (0 if follow_last else os.O_NOFOLLOW))
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no procfs mounted here
        head, tail = (path, "") if follow_last else os.path.split(path)
        real = os.path.join(os.path.realpath(head), tail) if tail else os.path.realpath(head)
    finally:
        os.close(fd)
    if real != root and not real.startswith(root + "/"):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory (a link leads out of the fsroot)", path)
    return real


def open_fd(path: str, flags: int) -> int:
    """``os.open(path, flags)``, confined to the active root. Raises :class:`OSError` as ``os.open`` does."""
    if _ROOT.get() is None:
        return os.open(path, flags)
    return os.open(_confined(path), flags | os.O_NOFOLLOW)  # a real path: no link left to follow


def listdir(path: str) -> list[str]:
    """``os.listdir(path)``, confined to the active root."""
    return os.listdir(_confined(path))


def isdir(path: str) -> bool:
    """``os.path.isdir(path)``, confined to the active root."""
    try:
        return os.path.isdir(_confined(path))
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        return False


def realpath(path: str) -> str | None:
    """The real path of ``path`` with every link resolved, confined to the active root (under the root's real path
    there); ``None`` when it does not exist, its links loop or lead out of the root."""
    try:
        return os.path.realpath(path, strict=True) if _ROOT.get() is None else _confined(path)
    except (OSError, ValueError):
        return None


def root_real() -> str | None:
    """The real path of the active root (``None`` when none is set: the live machine)."""
    return _ROOT.get()


def lexists(path: str) -> bool:
    """``os.path.lexists(path)`` (a link counts, wherever it points), confined to the active root."""
    try:
        return os.path.lexists(_confined(path, follow_last=False))
    except (OSError, ValueError):
        return False
