"""The one reader of ``/proc/cpuinfo``: the first processor's entry under an fsroot (``/``: this machine), as its
fields, read bounded and up to its first blank line, and the text rule for the values shown of it
(docs/design.md §6)."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from launcher.topology.fsroot import lexists, open_fd, within

CPUINFO = "proc/cpuinfo"
# The kernel's first entry is a few KiB (x86 with every flag name the kernel knows, about 5 KiB; s390x's header, a
# line per CPU, about 30 KiB at 400 CPUs): a file whose first entry does not end within 256 KiB is not the kernel's.
READ_LIMIT = 256 << 10
TEXT_LIMIT = 100  # the longest value kept as text (x86's brand string is at most 48 characters)
_CHUNK = 16 << 10
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class Cpuinfo:
    """``fields``: the first processor's ``key : value`` lines, keys and values stripped of spaces and tabs, the
    first of each key; ``present``: the file was read; ``problem``: why it was not read, or not to its first
    entry's end (``None``: it was, or there is no file)."""

    path: str
    fields: dict[str, str]
    present: bool
    problem: str | None = None


def read_cpuinfo(fsroot: str) -> Cpuinfo:
    """``proc/cpuinfo`` under ``fsroot``, its links followed if they stay in the tree. Never raises, never blocks."""
    path = os.path.join(fsroot, CPUINFO)
    with within(fsroot):
        data, problem = read_head(path)
    if data is None:
        return Cpuinfo(path, {}, False, problem)
    head, blank, _ = data.partition(b"\n\n")
    if not blank and len(data) >= READ_LIMIT:
        head = head.rpartition(b"\n")[0]  # a line cut at the limit is not read
        problem = (f"its first processor's entry does not end within {READ_LIMIT >> 10} KiB (the kernel's is a few "
                   "KiB); only the lines before that were read")
    return Cpuinfo(path, parse_entry(head.decode("utf-8", "surrogateescape")), True, problem)


def parse_entry(text: str) -> dict[str, str]:
    """The ``key : value`` lines of one entry (split at ``\\n`` only: a ``\\r`` starts no line)."""
    fields: dict[str, str] = {}
    for line in text.split("\n"):
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(" \t"), value.strip(" \t"))
    return fields


def field_text(value: str | None) -> tuple[str | None, str | None]:
    """A value as text to show: runs of spaces and tabs made one space; ``(None, why)`` when it holds what no
    kernel writes (a character that is not printable, bytes that are not UTF-8) or is longer than
    :data:`TEXT_LIMIT`; ``(None, None)`` when it is absent or empty."""
    if value is None:
        return None, None
    value = " ".join(w for w in value.replace("\t", " ").split(" ") if w)
    if not value:
        return None, None
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        return None, ("bytes that are not UTF-8" if 0xDC80 <= ord(bad) <= 0xDCFF
                      else f"a character that is not printable ({bad!r})")
    if len(value) > TEXT_LIMIT:
        return None, f"longer than {TEXT_LIMIT} characters"
    return value, None


def read_head(path: str) -> tuple[bytes | None, str | None]:
    """The file's first bytes, up to its first blank line or :data:`READ_LIMIT`; or ``None`` and why (``None``
    too when there is no file)."""
    try:
        fd = open_fd(path, _FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None, "a link to nothing or out of the fsroot, or a loop of links" if lexists(path) else None
    except OSError as exc:
        return None, ("a loop of links" if exc.errno == errno.ELOOP
                      else f"cannot be opened ({exc.strerror or exc.errno})")
    except ValueError:  # a NUL byte in the fsroot's path
        return None, None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            return None, "a directory, not a file"
        if not stat.S_ISREG(mode):
            return None, "not a regular file (a FIFO, device or socket)"
        parts: list[bytes] = []
        size = 0
        last = b""
        while size < READ_LIMIT:
            chunk = os.read(fd, min(_CHUNK, READ_LIMIT - size))
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
            if b"\n\n" in last + chunk:
                break
            last = chunk[-1:]
        return b"".join(parts), None
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc.errno})"
    finally:
        os.close(fd)
