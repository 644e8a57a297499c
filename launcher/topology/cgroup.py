"""Find the cpuset (allowed CPUs and memory nodes), the CPU quota and the throttling counters (``cpu.stat``) of a
process ("self" by default) under an fsroot: cgroup v1, v2 and the legacy cpuset fs for the cpuset; cgroup v2
``cpu.max`` and v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us`` for the quota."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from launcher.topology._files import read_cpulist, read_text
from launcher.topology.fsroot import isdir, within


@dataclass(frozen=True)
class CgroupCpuset:
    cpus: frozenset[int]
    mems: frozenset[int] | None  # None when the cpuset names no memory nodes
    cpus_file: str  # the file the CPUs were read from (as a path under the fsroot)
    description: str  # "cgroup2 /sys/fs/cgroup/job/step_0"


@dataclass(frozen=True)
class CpuQuota:
    cpus: float  # quota / period: how many CPUs' worth of time the cgroup may use
    source: str  # "cgroup2 /sys/fs/cgroup/pod/cpu.max: 800000 100000"


def _self_paths(root: str, controller: str = "cpuset", pid: str = "self") -> tuple[str | None, str | None]:
    """(cgroup v2 path, cgroup v1 path of ``controller``) of the process ``pid``, from ``proc/PID/cgroup`` or
    (cpuset only) ``proc/PID/cpuset``."""
    v2: str | None = None
    v1: str | None = None
    text = read_text(os.path.join(root, "proc", pid, "cgroup"))
    if text:
        for line in text.splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            hid, controllers, path = parts
            if hid == "0" and controllers == "":
                v2 = path
            elif controller in controllers.split(","):
                v1 = path
    if controller != "cpuset":
        return v2, v1
    fallback = read_text(os.path.join(root, "proc", pid, "cpuset"))
    if fallback:
        v1 = v1 or fallback
        v2 = v2 or fallback
    return v2, v1


def _unescape(field: str) -> str:
    """A field of ``/proc/mounts`` or ``/proc/self/mountinfo`` as the path it names: the kernel writes a space, tab,
    newline and backslash of a mount point as ``\\040``, ``\\011``, ``\\012`` and ``\\134`` (octal bytes). The bytes
    are decoded as the file system's names are (``os.fsdecode``)."""
    if "\\" not in field:
        return field
    raw = field.encode("utf-8", "surrogateescape")
    out = bytearray()
    i = 0
    while i < len(raw):
        digits = raw[i + 1:i + 4]
        if raw[i] == 0x5C and len(digits) == 3 and all(0x30 <= d <= 0x37 for d in digits) and digits[0] <= 0x33:
            out.append(int(digits, 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return os.fsdecode(bytes(out))


def shown(path: str) -> str:
    """``path`` for a message: characters that are not printable (a newline in a mount point) written back as the
    kernel's octal escapes, so that the message stays one line and still names the path exactly."""
    if path.isprintable():
        return path
    return "".join(c if c.isprintable() else "".join(f"\\{b:03o}" for b in c.encode("utf-8", "surrogateescape"))
                   for c in path)


def find_cpuset(root: str, pid: str = "self") -> CgroupCpuset | None:
    """The cpuset of the process ``pid`` ("self": this one) under ``root``, or ``None`` where none applies: its
    cgroup's, else the closest existing ancestor's with cpuset files (docs/design.md §6)."""
    with within(root):
        return _find_cpuset(root, pid)


# Each hierarchy's cpuset files, first found first. v2: cpuset.cpus may be empty ("the parent's"), the effective
# file never is; v1: cpuset.cpus is the configured set (what hwloc reports), "noprefix" mounts drop "cpuset.".
_CPUSET_FILES = {"cgroup2": (("cpuset.cpus.effective",), ("cpuset.mems.effective",)),
                 "cgroup": (("cpuset.cpus", "cpus", "cpuset.effective_cpus"), ("cpuset.mems", "mems", "cpuset.effective_mems")),
                 "cpuset": (("cpus",), ("mems",))}  # the legacy cpuset filesystem (/dev/cpuset)


def _hierarchies(root: str, controller: str, pid: str) -> Iterator[tuple[str, str, str]]:
    """(file system type, mount directory, the process's directory in it, kept inside the mount) of each hierarchy
    of ``controller`` in ``proc/mounts`` under ``root`` (v2 always; the legacy cpuset file system for cpuset)."""
    mounts = read_text(os.path.join(root, "proc/mounts"))
    if not mounts:
        return
    v2_path, v1_path = _self_paths(root, controller, pid)
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        fstype = fields[2]
        v1 = (fstype == "cgroup" and controller in fields[3].split(",")) or fstype == controller == "cpuset"
        rel = v2_path if fstype == "cgroup2" else v1_path if v1 else None
        if rel is None:
            continue
        base = os.path.normpath(os.path.join(root, _unescape(fields[1]).lstrip("/")))
        own = os.path.normpath(os.path.join(base, rel.lstrip("/")))
        yield fstype, base, own if own == base or own.startswith(base + os.sep) else base  # "../.." stays inside


def _upwards(base: str, directory: str) -> Iterator[str]:
    """``directory``, then each parent up to ``base``."""
    while True:
        yield directory
        if directory == base:
            return
        directory = os.path.dirname(directory)


def _find_cpuset(root: str, pid: str) -> CgroupCpuset | None:
    for fstype, base, own in _hierarchies(root, "cpuset", pid):
        cpu_files, mem_files = _CPUSET_FILES[fstype]
        found = next(((d, path, cpus) for d in _upwards(base, own) for path in (os.path.join(d, n) for n in cpu_files)
                      if (cpus := read_cpulist(path))), None)
        if found is None:
            continue
        directory, cpus_file, cpus = found
        where = os.path.join("/", os.path.relpath(directory, root))
        return CgroupCpuset(cpus, _first(directory, mem_files) or None, cpus_file, f"{fstype} {shown(where)}")
    return None


def _first(directory: str, names: tuple[str, ...]) -> frozenset[int] | None:
    for name in names:
        value = read_cpulist(os.path.join(directory, name))
        if value is not None:
            return value
    return None


def find_cpu_quota(root: str, pid: str = "self") -> CpuQuota | None:
    """The CFS bandwidth limit of the process ``pid`` under ``root`` in CPUs (v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``), the tightest up to the mount; ``None`` where none is set."""
    best: CpuQuota | None = None
    with within(root):
        for group in _cpu_cgroups(root, pid):
            found = _quota_in(group.directory, group.v2)
            if found is not None and (best is None or found[0] < best.cpus):
                best = CpuQuota(found[0], f"{group.shown}/{shown(found[1])}")
    return best


@dataclass(frozen=True)
class CpuCgroup:
    """One cgroup directory of the cpu controller that a process is in, or an ancestor of it."""

    directory: str  # the path under the fsroot
    v2: bool
    shown: str  # "cgroup /sys/fs/cgroup/cpu/job" (the path as the machine names it)


@dataclass(frozen=True)
class CpuStat:
    """The throttling counters of one ``cpu.stat``: quota periods with runnable tasks, periods in which the quota
    ran out, and the time throttled (v2 ``throttled_usec``, v1 ``throttled_time`` in ns), in ns."""

    periods: int
    throttled_periods: int
    throttled_ns: int


def cpu_cgroups(root: str, pid: str = "self") -> list[CpuCgroup]:
    """The cgroups of the cpu controller of the process ``pid`` under ``root``, its own first, then each parent
    up to the mount, for every hierarchy that has the controller (v2, v1). The cgroup is found as
    :func:`find_cpuset` finds it (a path that is not there starts at the mount); every read stays inside ``root``."""
    with within(root):
        return _cpu_cgroups(root, pid)


def _cpu_cgroups(root: str, pid: str) -> list[CpuCgroup]:
    out: list[CpuCgroup] = []
    for fstype, base, own in _hierarchies(root, "cpu", pid):
        for directory in _upwards(base, own if isdir(own) else base):
            where = os.path.join("/", os.path.relpath(directory, root))
            out.append(CpuCgroup(directory, fstype == "cgroup2", f"{fstype} {shown(where.rstrip('/') or '/')}"))
    return out


STAT_KEYS = {"nr_periods": 0, "nr_throttled": 1, "throttled_usec": 2, "throttled_time": 3}


def read_cpu_stat(group: CpuCgroup, root: str = "/") -> CpuStat | None:
    """The throttling counters of ``group``'s ``cpu.stat``, or ``None`` where it has none (no file, a v2 cgroup
    without the cpu controller, the root cgroup)."""
    with within(root):
        text = read_text(os.path.join(group.directory, "cpu.stat"))
    values: list[int | None] = [None] * 4
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key in STAT_KEYS:
            values[STAT_KEYS[key]] = _ascii_int(value.strip())
    periods, throttled, usec, ns = values
    if periods is None or throttled is None or (usec is None and ns is None):
        return None
    return CpuStat(periods, throttled, usec * 1000 if usec is not None else ns or 0)


def _quota_in(directory: str, v2: bool) -> tuple[float, str] | None:
    """(CPUs, "file: value") of one cgroup directory's limit, or ``None`` for no limit or unreadable files."""
    if v2:
        text = read_text(os.path.join(directory, "cpu.max"))
        parts = text.split() if text else []
        if len(parts) != 2 or parts[0] == "max":
            return None
        quota, period = _ascii_int(parts[0]), _ascii_int(parts[1])
        shown = f"cpu.max: {parts[0]} {parts[1]}"
    else:
        q_text = read_text(os.path.join(directory, "cpu.cfs_quota_us"))
        p_text = read_text(os.path.join(directory, "cpu.cfs_period_us"))
        if not q_text or not p_text:
            return None
        quota, period = _ascii_int(q_text.strip()), _ascii_int(p_text.strip())
        shown = f"cpu.cfs_quota_us: {q_text.strip()}, cpu.cfs_period_us: {p_text.strip()}"
    if quota is None or period is None or quota <= 0 or period <= 0:
        return None
    return quota / period, shown


def _ascii_int(text: str) -> int | None:
    """A decimal number of at most 19 ASCII digits (cgroup files hold 64-bit values), else ``None``."""
    return int(text) if 0 < len(text) <= 19 and text.isascii() and text.isdigit() else None
