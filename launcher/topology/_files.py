"""Small, safe readers for sysfs/procfs files under an fsroot.

Never follows links recursively (hwloc's tarballs contain ``cpuN/cpufreq -> .`` loops); each read opens one
path and returns ``None`` when it is absent, a dangling or looping link, or unreadable. Reads use
``os.open``/``os.read`` directly: a topology read opens about one file per core, and the buffered ``open()``
costs twice as much per file.
"""

from __future__ import annotations

import os

from launcher.cpulist import CpuIdTooLarge, parse_cpulist, parse_hexmask
from launcher.errors import TopologyError

_CHUNK = 65536
_O_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


def read_bytes(path: str) -> bytes | None:
    """The whole file, or ``None`` if it cannot be opened or read (missing, ELOOP, EISDIR, EACCES...)."""
    try:
        fd = os.open(path, _O_FLAGS)
    except OSError:
        return None
    try:
        data = os.read(fd, _CHUNK)
        if len(data) == _CHUNK:  # sysfs attributes fit in one page; regular files in an fsroot may not
            parts = [data]
            while chunk := os.read(fd, _CHUNK):
                parts.append(chunk)
            data = b"".join(parts)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data


def read_text(path: str) -> str | None:
    """The file's text with NUL bytes removed (some sysfs files end in ``\\n\\0``) and whitespace stripped."""
    data = read_bytes(path)
    if data is None:
        return None
    if b"\0" in data:
        data = data.replace(b"\0", b"")
    return data.decode("utf-8", "replace").strip()


def read_int(path: str) -> int | None:
    text = read_text(path)
    if text is None or text == "":
        return None
    try:
        return int(text, 16) if text[:2].lower() == "0x" else int(text)
    except ValueError:
        raise TopologyError(f"{path}: expected an integer, found {text[:40]!r}") from None


def parse_cpus_file(path: str, text: str, *, is_list: bool) -> frozenset[int]:
    """Parse ``text`` read from ``path`` as a cpu list (``0-3,8``) or a hex mask; one-line error naming the file."""
    try:
        return parse_cpulist(text) if is_list else parse_hexmask(text)
    except CpuIdTooLarge as exc:
        raise TopologyError(f"{path}: {exc}") from None
    except ValueError:
        kind = "cpu list" if is_list else "cpu mask"
        raise TopologyError(f"{path}: not a {kind}: {text[:60]!r}") from None


def read_cpulist(path: str) -> frozenset[int] | None:
    text = read_text(path)
    return None if text is None else parse_cpus_file(path, text, is_list=True)


def read_cpumask(path: str) -> frozenset[int] | None:
    text = read_text(path)
    return None if text is None else parse_cpus_file(path, text, is_list=False)


def read_cpus(list_path: str, mask_path: str) -> frozenset[int] | None:
    """Prefer the ``*_list`` form, fall back to the hex mask form."""
    cpus = read_cpulist(list_path)
    return cpus if cpus is not None else read_cpumask(mask_path)


class CpusFile:
    """Reads one per-CPU attribute that the kernel spells several ways, remembering which spelling exists.

    ``names`` are ``(file name, is_list)`` in order of preference, e.g. ``core_cpus_list`` (5.x kernels) then
    ``thread_siblings_list``. A name that is missing where a later one exists is dropped, so a machine of
    1,024 CPUs does not pay 1,024 failed opens for a file its kernel never had.
    """

    def __init__(self, *names: tuple[str, bool]) -> None:
        self.names = list(names)

    def read(self, directory: str) -> frozenset[int] | None:
        for i, (name, is_list) in enumerate(self.names):
            path = os.path.join(directory, name)
            text = read_text(path)
            if text is None:
                continue
            if i:
                del self.names[:i]  # the directory exists and these spellings are absent: stop trying them
            return parse_cpus_file(path, text, is_list=is_list)
        return None

    def forget_all(self) -> None:
        """Called once a directory is known to exist but has none of the names: no CPU will have them."""
        self.names.clear()


def numbered_entries(directory: str, prefix: str) -> list[int]:
    """Sorted N of every ``<prefix>N`` entry in ``directory`` (``cpu12``, ``node33``)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    plen = len(prefix)
    out = [int(name[plen:]) for name in names if name.startswith(prefix) and name[plen:].isdigit()]
    out.sort()
    return out
