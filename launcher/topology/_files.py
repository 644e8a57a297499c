"""Bounded readers of sysfs/procfs files under an fsroot (:mod:`launcher.topology.fsroot`), and of every document
affrun reads: absent, a dangling or looping link or unreadable is ``None``; a FIFO, a device or a file over the
limit is a :class:`TopologyError` (docs/design.md §6)."""

from __future__ import annotations

import os
import stat

from launcher.base.cpulist import cpu_error, id_problem, parse_cpulist, parse_hexmask
from launcher.base.errors import AffrunError, TopologyError
from launcher.base.pci import sysfs_pci_path
from launcher.base.untrusted import ascii_hex, ascii_int, ascii_uint, short
from launcher.topology.fsroot import listdir, open_fd, realpath, root_real

_CHUNK = 65536
# O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. It changes nothing for regular files.
_O_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
# sysfs and procfs attributes fit in one page; /proc/cpuinfo of a 1,024-CPU machine is about 1.5 MB. A topology
# file larger than this is not one.
SYSFS_LIMIT = 16 << 20
# hwloc XML exports, JSON snapshots and YAML configurations: the largest real ones are a few MB.
DOCUMENT_LIMIT = 64 << 20


class FileTooLarge(TopologyError):
    """A file is larger than the reader's limit (message names it)."""


class NotRegularFile(TopologyError):
    """A path names a FIFO, a device or a socket where a regular file was expected."""


def read_bytes(path: str, limit: int = SYSFS_LIMIT) -> bytes | None:
    """The whole file, or ``None`` if it cannot be opened or read (missing, ELOOP, EISDIR, EACCES...).

    Raises :class:`NotRegularFile` for a FIFO, device or socket and :class:`FileTooLarge` past ``limit`` bytes.
    """
    try:
        fd = open_fd(path, _O_FLAGS)
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        return None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            return None
        if not stat.S_ISREG(mode):
            raise NotRegularFile(f"{path}: not a regular file (a FIFO, device or socket); refusing to read it")
        data = os.read(fd, min(_CHUNK, limit + 1))
        if len(data) == _CHUNK:  # sysfs attributes fit in one page; regular files in an fsroot may not
            parts = [data]
            size = len(data)
            while size <= limit and (chunk := os.read(fd, min(_CHUNK, limit + 1 - size))):
                parts.append(chunk)
                size += len(chunk)
            data = b"".join(parts)
        if len(data) > limit:
            raise FileTooLarge(_too_large(path, limit))
    except OSError:
        return None
    finally:
        os.close(fd)
    return data


def _too_large(path: str, limit: int) -> str:
    return f"{path}: larger than {limit >> 20 or limit} {'MiB' if limit >> 20 else 'bytes'}; refusing to read it"


def read_document(path: str, what: str, error: type[AffrunError] = TopologyError, limit: int = DOCUMENT_LIMIT) -> bytes:
    """A whole document (XML, JSON, YAML) the user named: ``error`` with one line when it cannot be read. A
    directory, or a regular file whose size is past ``limit``, is refused before any byte is read."""
    try:
        fd = os.open(path, _O_FLAGS)
    except OSError as exc:
        raise error(f"{path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{path}: is a directory (expected {what})")
    if stat.S_ISREG(st.st_mode) and st.st_size > limit:
        raise error(f"{_too_large(path, limit)} (expected {what})")
    try:
        data = read_bytes(path, limit)
    except TopologyError as exc:
        raise error(f"{exc} (expected {what})") from None
    if data is None:
        raise error(f"{path}: cannot read it (expected {what})")
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
    value = ascii_hex(text) if text[:2].lower() == "0x" else ascii_int(text)
    if value is None:
        raise TopologyError(f"{path}: expected an integer, found {short(text, 40)}")
    return value


def parse_cpus_file(path: str, text: str, *, is_list: bool) -> frozenset[int]:
    """Parse ``text`` read from ``path`` as a cpu list (``0-3,8``) or a hex mask; one-line error naming the file."""
    try:
        return parse_cpulist(text) if is_list else parse_hexmask(text)
    except ValueError as exc:
        kind = "cpu list" if is_list else "cpu mask"
        raise TopologyError(f"{path}: " + cpu_error(exc, f"not a {kind}: {short(text)}")) from None


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
    """One per-CPU attribute that the kernel spells several ways (``names``: ``(file name, is_list)``, preferred
    first), read under the first spelling found; one missing where a later one exists is not tried again."""

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


def numbered_entries(directory: str, prefix: str, kind: str | None = None) -> list[int]:
    """Sorted N of every ``<prefix>N`` entry in ``directory`` (``cpu12``, ``node33``); N is ASCII digits only.

    With ``kind`` (``"cpu"`` or ``"node"``), an N that is not a valid id of that kind is a :class:`TopologyError`
    naming the entry (a ``cpu99999999999`` directory would otherwise reach ``sched_setaffinity``).
    """
    try:
        names = listdir(directory)
    except (OSError, ValueError):
        return []
    plen = len(prefix)
    out: list[int] = []
    for name in names:
        if not name.startswith(prefix):
            continue
        number = ascii_uint(name[plen:])
        if number is None:
            continue
        if kind is not None:
            problem = id_problem(number, kind)
            if problem:
                raise TopologyError(f"{os.path.join(directory, name[:40])}: {problem}")
        out.append(number)
    out.sort()
    return out


def pci_location(path: str) -> tuple[str, tuple[str, ...]] | None:
    """(address, PCI path) of the PCI device directory ``path`` names (a ``sys/bus/pci/devices`` entry, a
    ``device`` link), its links kept inside the fsroot (:func:`launcher.base.pci.sysfs_pci_path`); ``None``
    when it does not resolve (absent, a loop) or is no PCI device under a host bridge."""
    real = machine_path(path)
    return None if real is None else sysfs_pci_path(real)


def machine_path(path: str) -> str | None:
    """The real path of ``path`` as the machine names it (``/sys/devices/...``), its links kept inside the
    fsroot; ``None`` when it does not resolve (missing, dangling, looping, leading out of the fsroot)."""
    real = realpath(path)
    if real is None:
        return None
    top = root_real()
    if top is not None:
        real = real[len(top):] if real.startswith(top.rstrip("/") + "/") else "/"
    return real
