"""Find the cpuset (allowed CPUs and memory nodes) of "self" under an fsroot: cgroup v1, v2 and legacy cpuset fs."""

from __future__ import annotations

import os

from launcher.topology._files import read_cpulist, read_text


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


def find_cpuset(root: str) -> tuple[frozenset[int] | None, frozenset[int] | None, str | None]:
    """Return ``(cpus, mems, description)`` of the cpuset under ``root``; ``None`` where none applies."""
    mounts = read_text(os.path.join(root, "proc/mounts"))
    if not mounts:
        return None, None, None
    v2_path, v1_path = _self_paths(root)
    # cgroup v1: cpuset.cpus is the configured set (what hwloc reports); effective_* can lag behind hotplug.
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mountpoint, fstype, options = fields[1], fields[2], fields[3].split(",")
        base = os.path.join(root, mountpoint.lstrip("/"))
        candidates: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []
        if fstype == "cgroup2" and v2_path is not None:
            candidates.append((v2_path, ("cpuset.cpus.effective", "cpuset.cpus"), ("cpuset.mems.effective", "cpuset.mems")))
        elif fstype == "cgroup" and "cpuset" in options and v1_path is not None:
            candidates.append((v1_path, ("cpuset.cpus", "cpus", "cpuset.effective_cpus"), ("cpuset.mems", "mems", "cpuset.effective_mems")))
        elif fstype == "cpuset" and v1_path is not None:
            candidates.append((v1_path, ("cpus",), ("mems",)))
        for rel, cpu_files, mem_files in candidates:
            directory = os.path.join(base, rel.lstrip("/"))
            # In cgroup v2 a child without the cpuset controller has no files: walk up to the closest ancestor.
            while True:
                cpus = _first(directory, cpu_files)
                if cpus is not None or os.path.normpath(directory) == os.path.normpath(base):
                    break
                directory = os.path.dirname(directory)
            if cpus is None or not cpus:
                continue
            mems = _first(directory, mem_files)
            where = os.path.join("/", os.path.relpath(directory, root))
            return cpus, (mems or None), f"{fstype} {where}"
    return None, None, None


def _first(directory: str, names: tuple[str, ...]) -> frozenset[int] | None:
    for name in names:
        value = read_cpulist(os.path.join(directory, name))
        if value is not None:
            return value
    return None
