"""Every file affrun writes: the one check of an output path (:func:`check`) and the one writer (:func:`write`, over
:func:`replace_file`: a new file beside the target, renamed over it). Standard library only. What a path may be,
and why: docs/design.md §15."""

from __future__ import annotations

import errno
import os
import stat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from launcher.base.errors import ConfigError, Opt

    Mine = Callable[[int], bool]  # whether the open regular file (a descriptor) holds what affrun writes there

KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
         (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
STREAMS = ("standard input", "standard output", "standard error")
HEAD = 4096  # bytes read from an existing file to find the marker of what affrun writes there
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_LOOK = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_HOPS = 40  # links followed before a path is a loop, as the kernel counts (path_resolution(7))
_NO_LINK = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK)  # a filesystem without hard links


class Refused(ValueError):
    """Why an output path cannot be written: the message, in words that follow the path (``is a FIFO, ...``)."""


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (``a FIFO``)."""
    return next((name for test, name in KINDS if test(mode)), "a regular file")


def marked(marker: bytes) -> Mine:
    """A test of a file that holds ``marker`` in its first :data:`HEAD` bytes (what affrun writes there)."""
    return lambda fd: marker in os.pread(fd, HEAD, 0)


def _shown(path: str, limit: int = 200) -> str:
    """``path`` for an error line: a ``repr``, at most about ``limit`` characters (the line stays short)."""
    from launcher.base.untrusted import short

    return short(path, limit)


def _procfs() -> int | None:
    """The device of procfs, where ``/proc/self`` is a link (``None`` without one)."""
    try:
        info = os.lstat("/proc/self")
    except OSError:
        return None
    return info.st_dev if stat.S_ISLNK(info.st_mode) else None


def resolve(path: str) -> tuple[str, bool]:
    """The real path of ``path`` (links followed as the kernel follows them, from the first name that does not
    exist on kept as written) and whether a link followed lives in procfs: ``/dev/stdout``, ``/dev/fd/N`` and
    ``/proc/PID/fd/N`` lead to a file someone holds open, not to a name. OSError: a loop, a file as a directory."""
    proc = _procfs()
    todo = path.split("/")[::-1]
    real, magic, hops = ("/" if path.startswith("/") else os.getcwd()), False, 0
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            real = os.path.dirname(real)
            continue
        here = os.path.join(real, name)
        try:
            info = os.lstat(here)
        except FileNotFoundError:
            return os.path.normpath(os.path.join(here, *todo[::-1])), magic
        if not stat.S_ISLNK(info.st_mode):
            real = here
            continue
        hops += 1
        if hops > _HOPS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
        magic = magic or info.st_dev == proc or here.startswith("/proc/")
        target = os.readlink(here)
        if target.startswith("/"):
            real = "/"
        todo.extend(target.split("/")[::-1])
    return real, magic


def _stream(info: os.stat_result) -> str | None:
    """Which of this process's standard streams is the file ``info`` (``None``: none)."""
    for fd, name in enumerate(STREAMS):
        try:
            other = os.fstat(fd)
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (info.st_dev, info.st_ino):
            return f"{name} (fd {fd})"
    return None


def _written_elsewhere(fd: int) -> bool:
    """Whether any process holds the file of ``fd`` (open read-only) open for writing: a read lease is refused then.
    A filesystem without leases answers no. The lease's break signal is SIGURG, which is ignored, not SIGIO."""
    import fcntl
    import signal

    try:
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as exc:
        return exc.errno == errno.EAGAIN
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    return False


def _existing(real: str, info: os.stat_result, mine: Mine, script: str | None, through: str) -> str | None:
    """Why the existing file ``real`` may not be replaced (``None``: it may); ``through``: how a link led to it."""
    if stat.S_ISDIR(info.st_mode):
        return f"is a directory{through}: give a file's name"
    if not stat.S_ISREG(info.st_mode):
        return f"is {file_kind(info.st_mode)}{through}, not a regular file: give a regular file"
    if info.st_uid != os.geteuid():
        return f"is another user's file{through} (uid {info.st_uid}): give a file of your own"
    stream = _stream(info)
    if stream is not None:
        return f"is affrun's {stream}{through}: writing it would replace that output; give another file"
    if script is not None and os.path.exists(script) and os.path.samefile(real, script):
        return f"is the training script{through}: give a new file"
    try:
        fd = os.open(real, _LOOK)
    except OSError as exc:
        return f"cannot be read{through} ({exc.strerror or exc})"
    try:
        if _written_elsewhere(fd):
            return (f"is open for writing in another process{through} (a shell's redirection, tee, a running job): "
                    "writing it would cut that output off; give another file")
        if not mine(fd):
            return f"holds something affrun did not write{through}: give a new file, or remove it first"
    finally:
        os.close(fd)
    return None


def check(path: str, mine: Mine, script: str | None = None) -> str:
    """The real path to write for the output path ``path`` (a link followed to the file it names), or
    :class:`Refused`. ``mine``: whether an existing file holds what affrun writes there; ``script``: a file never to
    replace (the training script)."""
    if not path:
        raise Refused("is empty: give a file")
    try:
        real, magic = resolve(path)
        given = os.lstat(path) if os.path.lexists(path) else None
        info = os.lstat(real) if os.path.lexists(real) else None
    except (OSError, ValueError) as exc:  # a link loop, a component that is a file, a NUL byte
        raise Refused(f"cannot be used: {getattr(exc, 'strerror', None) or exc}") from None
    through = "" if given is None or not stat.S_ISLNK(given.st_mode) else f" (through its link to {_shown(real, 120)})"
    if magic:
        raise Refused("reaches a file through /proc (as /dev/stdout and /dev/fd/N do): that is a file some process "
                      "holds open, not a name; give a file's own path")
    if info is not None:
        why = _existing(real, info, mine, script, through)
        if why is not None:
            raise Refused(why)
    elif through:
        raise Refused(f"is a link to nothing{through}: give a file, or the file the link should name")
    where = os.path.dirname(real)
    if not os.path.isdir(where):
        raise Refused(f"names a directory that does not exist ({_shown(where)}): give a file in an existing directory")
    if not os.access(where, os.W_OK | os.X_OK):  # a new file is made there, then renamed over the name
        raise Refused(f"is in a directory that is not writable ({_shown(where)}): give a file in another directory")
    return real


def write(path: str, data: bytes, mine: Mine, mode: int | None = None, script: str | None = None) -> str:
    """``data`` as the output file ``path``, checked again (:func:`check`) and written by :func:`replace_file`
    (``mode`` as it says); the real path written. A file created at the name, or put in the place of the file
    checked, while this ran is never replaced. Raises :class:`Refused` or OSError."""
    real = check(path, mine, script)
    try:
        before: os.stat_result | None = os.lstat(real)
    except FileNotFoundError:
        before = None
    replace_file(real, data, mode, was=before)
    return real


def checked(option: str | Opt, path: str, mine: Mine, script: str | None = None) -> str:
    """:func:`check` for a front end: the real path, or one :class:`~launcher.errors.ConfigError` naming
    ``option`` (a flag, or the table's :class:`~launcher.errors.Opt` quoting the path) and why."""
    try:
        return check(path, mine, script)
    except Refused as exc:
        raise _error(option, path, exc) from None


def written(option: str | Opt, path: str, data: bytes, mine: Mine, mode: int | None = None,
            script: str | None = None) -> str:
    """:func:`write` for a front end: the real path written, or one :class:`~launcher.errors.ConfigError`."""
    try:
        return write(path, data, mine, mode, script)
    except (Refused, OSError) as exc:
        raise _error(option, path, exc) from None


def _error(option: str | Opt, path: str, exc: Exception) -> ConfigError:
    from launcher.base.errors import ConfigError

    named = f"{option} {_shown(path)}" if isinstance(option, str) else option
    why = f" {exc}" if isinstance(exc, Refused) else f": {getattr(exc, 'strerror', None) or exc}"
    return ConfigError(named, why)


def replace_file(path: str, data: bytes, mode: int | None = None,
                 was: os.stat_result | bool | None = True) -> None:
    """``data`` as the file ``path``, written beside it and renamed over it (docs/design.md §15). ``mode``: these
    permission bits (``None``: the old file's, else 0666 less the umask); ``was``: replace whatever is there
    (``True``), only that file (its ``lstat``), or only nothing (``None``). The new file is removed on any failure."""
    where, name = os.path.split(path)
    dfd = os.open(where or ".", _DIR)
    try:
        if mode is None:
            mode = _bits(name, dfd, was)
        tmp = temporary(name)
        fd = os.open(tmp, _NEW, 0o666 if mode is None else 0o600, dir_fd=dfd)
        try:
            try:
                if mode is not None:
                    os.fchmod(fd, mode)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            _put(dfd, tmp, name, was)
        except BaseException:
            _unlink(tmp, dfd)
            raise
    finally:
        os.close(dfd)


def _bits(name: str, dfd: int, was: os.stat_result | bool | None) -> int | None:
    """The permission bits of the regular file a new one replaces (``None``: there is none)."""
    if not isinstance(was, os.stat_result):
        try:
            was = os.lstat(name, dir_fd=dfd) if was else None
        except OSError:
            was = None
    return stat.S_IMODE(was.st_mode) & 0o777 if was is not None and stat.S_ISREG(was.st_mode) else None


def _put(dfd: int, tmp: str, name: str, was: os.stat_result | bool | None) -> None:
    """Give the written file ``tmp`` the name ``name`` in the directory ``dfd``, as :func:`replace_file` says."""
    if was is None:
        try:
            os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                raise Refused("was created by another process while affrun wrote it: not replaced") from None
            if exc.errno not in _NO_LINK:
                raise
        else:
            _unlink(tmp, dfd)
            return
    if isinstance(was, os.stat_result) or was is None:
        try:
            now: os.stat_result | None = os.lstat(name, dir_fd=dfd)
        except FileNotFoundError:
            now = None
        if (now is None) != (was is None) or (now is not None and isinstance(was, os.stat_result)
                                              and (now.st_dev, now.st_ino) != (was.st_dev, was.st_ino)):
            raise Refused("was replaced by another file while affrun wrote it: not replaced")
    os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)


def _unlink(name: str, dfd: int) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except OSError:
        pass


def temporary(path: str) -> str:
    """A fresh name beside ``path`` for a file written then renamed over it (or a probe, removed at once)."""
    return f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"


def remove(path: str) -> None:
    """Remove ``path``, a file affrun made (a temporary file, a probe, a rank's live file), if it is there."""
    try:
        os.unlink(path)
    except OSError:
        pass


def own_dir(where: str, uid: int) -> bool:
    """Whether ``where`` is a directory (not a link to one) of user ``uid`` that no other user may write to."""
    try:
        info = os.lstat(where)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == uid and not info.st_mode & 0o022


__all__ = ["Refused", "check", "checked", "file_kind", "marked", "own_dir", "remove", "replace_file", "resolve", "temporary",
           "write", "written"]
