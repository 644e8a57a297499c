"""Reads under an ``--fsroot`` stay inside it, as if the tree were the root of a chroot.

A tree is a copy of ``/sys`` and ``/proc`` (hwloc's test tarballs, a capture, a hand-made fake). The kernel
would follow a symbolic link with an absolute target (``/sys/fs/cgroup/job -> /elsewhere``) or a relative one that
climbs out (``../../../../etc``) to the live machine, whose files then pass for the tree's: a CPU quota, a
cpuset, a GPU of another machine. Here every path under the active root is resolved one component at a time:
an absolute target starts again at the root and ``..`` stops at it, as ``openat2(RESOLVE_IN_ROOT)`` and chroot do.
What a link names and the tree lacks reads as absent; more than 40 links on one path (a loop) too.

The root is set for the duration of a read with :class:`within`; paths that do not lie under it, and every path
when none is set (the live machine, root ``/``), are opened as they are. Each directory of the tree is looked up
once per read (a cache), and the last component of a path is opened with ``O_NOFOLLOW`` and resolved only when it
is a link, so a topology read of 1,024 CPUs costs about two ``lstat`` calls per CPU more than before.
"""

from __future__ import annotations

import errno
import os
import stat
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import TracebackType

MAX_LINKS = 40  # Linux's limit on the links followed while resolving one path (then ELOOP)
_DIR, _OTHER, _ABSENT = "d", "f", None  # what an lstat found; a str starting with "@" is a link's target


class _Root:
    """One tree: its real path, and what each link-free path under it (relative, ``a/b``) is."""

    def __init__(self, root: str) -> None:
        self.given = root
        self.prefix = root if root.endswith("/") else root + "/"
        self.normal = os.path.normpath(root)
        self.real = os.path.realpath(root)
        self.kinds: dict[str, str | None] = {"": _DIR}

    def relative(self, path: str) -> str | None:
        """``path`` relative to the root (may hold ``..`` and links), or ``None`` when it is not under it."""
        if path.startswith(self.prefix):
            return path[len(self.prefix):]
        if path == self.given:
            return ""
        normal = os.path.normpath(path)
        if normal == self.normal:
            return ""
        if self.normal == "." and not os.path.isabs(normal) and normal != ".." and not normal.startswith("../"):
            return normal
        inner = self.normal.rstrip("/") + "/"
        return normal[len(inner):] if normal.startswith(inner) else None

    def _kind(self, rel: str) -> str | None:
        kind = self.kinds.get(rel, "?")
        if kind != "?":
            return kind
        full = os.path.join(self.real, rel)
        try:
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode):
                kind = "@" + os.readlink(full)
            else:
                kind = _DIR if stat.S_ISDIR(mode) else _OTHER
        except (OSError, ValueError):  # ValueError: a NUL byte cannot be in a path
            kind = _ABSENT
        self.kinds[rel] = kind
        return kind

    def resolve(self, rel: str, follow_last: bool) -> str | None:
        """The real path of ``rel`` with every link resolved inside the root (the last one too when
        ``follow_last``), or ``None`` when it does not exist there or names more than :data:`MAX_LINKS` links."""
        pending = rel.split("/")[::-1]
        done = ""
        links = 0
        while pending:
            name = pending.pop()
            if name in ("", "."):
                continue
            if name == "..":
                done = done.rpartition("/")[0]  # ".." of the root is the root
                continue
            here = f"{done}/{name}" if done else name
            if not pending and not follow_last:
                done = here
                break
            kind = self._kind(here)
            if kind is _ABSENT:
                return None
            if kind.startswith("@"):
                links += 1
                if links > MAX_LINKS:
                    return None
                target = kind[1:]
                if target.startswith("/"):
                    done = ""  # an absolute target starts again at the root
                pending.extend(target.split("/")[::-1])
                continue
            if pending and kind != _DIR and any(p not in ("", ".") for p in pending):
                return None  # a file used as a directory
            done = here
        return os.path.join(self.real, done) if done else self.real


_ACTIVE: ContextVar[_Root | None] = ContextVar("affrun_fsroot", default=None)


class within:
    """``with within(root):`` confines the reads of this module's callers to ``root`` (nothing for ``/``). Nested
    uses of the same root share its cache."""

    def __init__(self, root: str) -> None:
        current = _ACTIVE.get()
        if current is not None and (current.given == root or current.normal == os.path.normpath(root)):
            self.root: _Root | None = current
        else:
            self.root = None if os.path.realpath(root) == "/" else _Root(root)
        self.token: Token[_Root | None] | None = None

    def __enter__(self) -> within:
        self.token = _ACTIVE.set(self.root)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.token is not None:
            _ACTIVE.reset(self.token)


def _located(path: str, follow_last: bool) -> str | None:
    """``path`` as it is to be opened: itself outside any root, else its real path inside the root (None: absent)."""
    root = _ACTIVE.get()
    if root is None:
        return path
    rel = root.relative(path)
    return path if rel is None else root.resolve(rel, follow_last)


def open_fd(path: str, flags: int) -> int:
    """``os.open(path, flags)``, confined to the active root. Raises :class:`OSError` as ``os.open`` does."""
    root = _ACTIVE.get()
    rel = None if root is None else root.relative(path)
    if root is None or rel is None:
        return os.open(path, flags)
    real = root.resolve(rel, follow_last=False)
    if real is not None:
        try:
            return os.open(real, flags | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno != errno.ELOOP:  # the last component is a link: resolved below
                raise
        real = root.resolve(rel, follow_last=True)
    if real is None:
        raise FileNotFoundError(2, "No such file or directory (inside the fsroot)", path)
    return os.open(real, flags | os.O_NOFOLLOW)


def listdir(path: str) -> list[str]:
    """``os.listdir(path)``, confined to the active root."""
    real = _located(path, follow_last=True)
    if real is None:
        raise FileNotFoundError(2, "No such file or directory (inside the fsroot)", path)
    return os.listdir(real)


def isdir(path: str) -> bool:
    """``os.path.isdir(path)``, confined to the active root."""
    real = _located(path, follow_last=True)
    return real is not None and os.path.isdir(real)


def realpath(path: str) -> str | None:
    """The real path of ``path`` with every link resolved, confined to the active root; ``None`` when it does not
    exist or its links loop. Under a root the answer is the real path on disk (under the root's real path)."""
    root = _ACTIVE.get()
    rel = None if root is None else root.relative(path)
    if root is None or rel is None:
        try:
            return os.path.realpath(path, strict=True)
        except (OSError, ValueError):
            return None
    return root.resolve(rel, follow_last=True)


def root_real() -> str | None:
    """The real path of the active root (``None`` when none is set: the live machine)."""
    root = _ACTIVE.get()
    return None if root is None else root.real


def lexists(path: str) -> bool:
    """``os.path.lexists(path)`` (a link counts, wherever it points), confined to the active root."""
    real = _located(path, follow_last=False)
    return real is not None and os.path.lexists(real)
