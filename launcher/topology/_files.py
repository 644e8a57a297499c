"""Small, safe readers for sysfs/procfs files under an fsroot.

Never follows links recursively (hwloc's tarballs contain ``cpuN/cpufreq -> .`` loops); each read opens one
path and returns ``None`` when it is absent, a dangling or looping link, or unreadable.
"""

from __future__ import annotations

import os

from launcher.cpulist import parse_cpulist, parse_hexmask
from launcher.errors import TopologyError


def read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:  # missing, ELOOP, EISDIR, EACCES, ENOTDIR ...
        return None
    return data.replace(b"\0", b"").decode("utf-8", "replace").strip()


def read_int(path: str) -> int | None:
    text = read_text(path)
    if text is None or text == "":
        return None
    try:
        return int(text, 0) if text.lower().startswith("0x") else int(text)
    except ValueError:
        raise TopologyError(f"{path}: expected an integer, found {text[:40]!r}") from None


def read_cpulist(path: str) -> frozenset[int] | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return parse_cpulist(text)
    except ValueError:
        raise TopologyError(f"{path}: not a cpu list: {text[:60]!r}") from None


def read_cpumask(path: str) -> frozenset[int] | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return parse_hexmask(text)
    except ValueError:
        raise TopologyError(f"{path}: not a cpu mask: {text[:60]!r}") from None


def read_cpus(list_path: str, mask_path: str) -> frozenset[int] | None:
    """Prefer the ``*_list`` form, fall back to the hex mask form."""
    cpus = read_cpulist(list_path)
    return cpus if cpus is not None else read_cpumask(mask_path)


def numbered_entries(directory: str, prefix: str) -> list[int]:
    """Sorted N of every ``<prefix>N`` entry in ``directory`` (``cpu12``, ``node33``)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    out = []
    plen = len(prefix)
    for name in names:
        if name.startswith(prefix) and name[plen:].isdigit():
            out.append(int(name[plen:]))
    out.sort()
    return out
