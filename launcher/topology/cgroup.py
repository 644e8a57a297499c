"""Find the cpuset (allowed CPUs and memory nodes) of "self" under an fsroot: cgroup v1, v2 and legacy cpuset fs."""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from launcher.topology._files import read_cpulist, read_text


class CgroupCpuset(NamedTuple):
    cpus: frozenset[int]
    mems: frozenset[int] | None  # None when the cpuset names no memory nodes
    cpus_file: str  # the file the CPUs were read from (as a path under the fsroot)
    description: str  # "cgroup2 /sys/fs/cgroup/job/step_0"


def _self_paths(root: str) -> tuple[str | None, str | None]:
    """(cgroup v2 path, cgroup v1 cpuset path) of the process, from ``proc/self/cgroup`` or ``proc/self/cpuset``."""
    v2: str | None = None
    v1: str | None = None
    text = read_text(os.path.join(root, "proc/self/cgroup"))
    if text:
        for line in text.splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            hid, controllers, path = parts
            if hid == "0" and controllers == "":
                v2 = path
            elif "cpuset" in controllers.split(","):
                v1 = path
    fallback = read_text(os.path.join(root, "proc/self/cpuset"))
    if fallback:
        v1 = v1 or fallback
        v2 = v2 or fallback
    return v2, v1


_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """``/proc/mounts`` writes a space in a mount point as ``\\040``."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field) if "\\" in field else field


def find_cpuset(root: str) -> CgroupCpuset | None:
    """The cpuset of "self" under ``root``, or ``None`` where none applies.

    The mount is taken from ``proc/mounts`` and the path from ``proc/self/cgroup`` (or ``proc/self/cpuset``).
    When the path is not there (a container that sees its own cgroup as the mount's root, or a cgroup v2
    child without the cpuset controller), the closest existing ancestor with cpuset files is used.
    """
    mounts = read_text(os.path.join(root, "proc/mounts"))
    if not mounts:
        return None
    v2_path, v1_path = _self_paths(root)
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mountpoint, fstype, options = _unescape(fields[1]), fields[2], fields[3].split(",")
        base = os.path.join(root, mountpoint.lstrip("/"))
        rel: str | None
        cpu_files: tuple[str, ...]
        mem_files: tuple[str, ...]
        if fstype == "cgroup2":
            # cpuset.cpus may be empty in v2 (it means "the parent's"); the effective file is always filled.
            rel, cpu_files, mem_files = v2_path, ("cpuset.cpus.effective",), ("cpuset.mems.effective",)
        elif fstype == "cgroup" and "cpuset" in options:
            # cgroup v1: cpuset.cpus is the configured set (what hwloc reports); "noprefix" mounts drop "cpuset."
            rel = v1_path
            cpu_files = ("cpuset.cpus", "cpus", "cpuset.effective_cpus")
            mem_files = ("cpuset.mems", "mems", "cpuset.effective_mems")
        elif fstype == "cpuset":  # the legacy cpuset filesystem (/dev/cpuset)
            rel, cpu_files, mem_files = v1_path, ("cpus",), ("mems",)
        else:
            continue
        if rel is None:
            continue
        found = _closest(base, os.path.join(base, rel.lstrip("/")), cpu_files)
        if found is None:
            continue
        directory, cpus_file, cpus = found
        mems = _first(directory, mem_files)
        where = os.path.join("/", os.path.relpath(directory, root))
        return CgroupCpuset(cpus, mems or None, cpus_file, f"{fstype} {where}")
    return None


def _closest(base: str, directory: str, names: tuple[str, ...]) -> tuple[str, str, frozenset[int]] | None:
    """Walk from ``directory`` up to ``base``; the first directory with a non-empty cpus file wins."""
    stop = os.path.normpath(base)
    directory = os.path.normpath(directory)
    if not (directory == stop or directory.startswith(stop + os.sep)):
        directory = stop  # a "../.." path must not escape the mount
    while True:
        for name in names:
            path = os.path.join(directory, name)
            value = read_cpulist(path)
            if value:
                return directory, path, value
        if directory == stop:
            return None
        directory = os.path.dirname(directory)


def _first(directory: str, names: tuple[str, ...]) -> frozenset[int] | None:
    for name in names:
        value = read_cpulist(os.path.join(directory, name))
        if value is not None:
            return value
    return None
