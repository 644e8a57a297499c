"""``affrun doctor --pid``: NCCL in a live rank: which version is loaded (its mapped library's name, else the
``NCCL version`` string in the file), and where NCCL's threads (named ``NCCL ...``) ran against the rank's OpenMP
team and DataLoader workers. docs/doctor.md."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.base import procfs
from launcher.base.cpulist import format_cpulist
from launcher.base.untrusted import printable_ascii
from launcher.bind.readback import exported_cpus
from launcher.doctor.findings import Finding

if TYPE_CHECKING:
    from launcher.doctor.live import JobAudit, ProcessRecord
    from launcher.topology.model import Topology

Version = tuple[int, int, int]
LEAKY = ((2, 29, 2), (2, 29, 7))  # the versions that leak the GPU-local mask into the caller (docs/doctor.md)
_NAMED = re.compile(r"libnccl\.so\.([0-9]{1,4})\.([0-9]{1,4})\.([0-9]{1,4})")
_STRING = re.compile(rb"NCCL version ([0-9]{1,4})\.([0-9]{1,4})\.([0-9]{1,4})")
SCAN_LIMIT = 1 << 30  # the most of a mapped file searched for the version string
NCCL_PREFIX = "NCCL "  # how every name NCCL gives its threads begins


@dataclass(frozen=True)
class LoadedNccl:
    """The NCCL library a process maps: its path as it is, its version, and whether it was deleted (or replaced)
    since it was loaded, so that the file now at the path is not the one loaded."""

    path: str
    version: Version | None
    deleted: bool = False


def is_nccl_library(name: str) -> bool:
    return name.startswith("libnccl.so")


def nccl_library(paths: Iterable[str]) -> str | None:
    """The first mapped ``libnccl.so*`` of a process's libraries."""
    return next((p for p in paths if is_nccl_library(os.path.basename(p))), None)


def version_in_name(path: str) -> Version | None:
    """The version a library's name gives (``libnccl.so.2.29.3``: ASCII digits, the whole name), else ``None``."""
    named = _NAMED.fullmatch(os.path.basename(path))
    return (int(named[1]), int(named[2]), int(named[3])) if named else None


def version_in_file(path: str) -> Version | None:
    """The ``NCCL version 2.X.Y`` string in the file (a regular file only, at most :data:`SCAN_LIMIT` bytes
    searched), else ``None``."""
    import mmap
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            return None
        with mmap.mmap(fd, min(info.st_size, SCAN_LIMIT), access=mmap.ACCESS_READ) as data:
            at = data.find(b"NCCL version ")
            found = _STRING.match(data[at : at + 40]) if at >= 0 else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def nccl_version(path: str) -> Version | None:
    """NCCL's version from the library's name (``libnccl.so.2.29.3``), else from the string in the file."""
    return version_in_name(path) or version_in_file(path)


def loaded_nccl(p: ProcessRecord, proc: str = "/proc") -> LoadedNccl | None:
    """The NCCL ``p`` maps now, else (the process has gone) the one among the libraries read while sampling; its
    version from the name, else from the mapped file (``map_files``), else from the file at the path if not
    deleted since."""
    mapped = procfs.mapped_file(p.pid, is_nccl_library, proc)
    if mapped is None:
        path = nccl_library(p.libraries)
        return None if path is None else LoadedNccl(path, nccl_version(path))
    version = version_in_name(mapped.path) or version_in_file(os.path.join(proc, str(p.pid), "map_files", mapped.span))
    if version is None and not mapped.deleted:
        version = version_in_file(mapped.path)
    return LoadedNccl(mapped.path, version, mapped.deleted)


def is_nccl_thread(name: str) -> bool:
    """A name NCCL gives its threads: ``NCCL `` and printable ASCII; anything else only imitates one
    (docs/doctor.md)."""
    return name.startswith(NCCL_PREFIX) and printable_ascii(name)


def _cores(cpus: Iterable[int], topology: Topology) -> dict[int, tuple[int, ...]]:
    """CPU -> its core's PUs (a CPU the topology does not know is a core of its own)."""
    pus = {p: c.pus for c in topology.cores for p in c.pus}
    return {cpu: pus.get(cpu, (cpu,)) for cpu in cpus}


def nccl_findings(audit: JobAudit, rank: ProcessRecord, topology: Topology,
                  version: Version | None = None, library: str | None = None, deleted: bool = False) -> list[Finding]:
    """The NCCL findings of one rank: its version (``version``, read from ``library``; ``deleted``: the file was
    deleted or replaced since it was loaded) and its threads."""
    out: list[Finding] = []
    if library is not None:
        shown = ".".join(map(str, version)) if version else "of unknown version"
        gone = ", deleted or replaced since it was loaded" if deleted else ""
        out.append(Finding("nccl-loaded", "info", f"NCCL {shown} is loaded ({library}{gone})",
                           "NCCL's version decides which of its variables it reads (NCCL_PROXY_CPUSET: 2.28.3 and "
                           "later) and which of its bugs apply", "nothing to do", rank.label()))
    if version is not None and LEAKY[0] <= version <= LEAKY[1]:
        out.append(Finding(
            "nccl-mask-leak", "warning",
            f"NCCL {'.'.join(map(str, version))} leaks the GPU-local CPU mask into the thread that creates a "
            "communicator (NVIDIA/nccl #2033, versions 2.29.2 to 2.29.7)",
            "after init the training thread (and every thread and DataLoader worker it starts later) keeps only the "
            "GPU's local CPUs: half the cores on a 2-socket node, and slower start-up in one report",
            "upgrade NCCL to 2.30 or later (pip install -U nvidia-nccl-cu12), or pin an earlier version",
            rank.label(),
        ))
    out.extend(_thread_findings(audit, rank, topology))
    return out


def _thread_findings(audit: JobAudit, rank: ProcessRecord, topology: Topology) -> list[Finding]:
    nccl = [t for t in rank.threads.values() if is_nccl_thread(t.comm)]
    if not nccl:
        return []
    ran = {cpu for t in nccl for cpu in t.seen}
    others = [t for t in rank.threads.values() if not is_nccl_thread(t.comm)]
    busy = [t for t in others if t.last_ticks > t.first_ticks] or others
    team = exported_cpus(rank.environ, "AFFRUN_COMPUTE_CPUS") or frozenset(c for t in busy for c in t.seen)
    loaders = exported_cpus(rank.environ, "AFFRUN_LOADER_CPUS") or frozenset(
        c for child in audit.children_of(rank) for t in child.threads.values() for c in t.seen)
    names = sorted({t.comm for t in nccl})
    what = f"{len(nccl)} NCCL thread(s) ({', '.join(names)})"
    core_of = _cores(ran | team | loaders, topology)
    shared = {role: sorted({c for c in ran if set(core_of[c]) & cpus})
              for role, cpus in (("the OpenMP team", team), ("the DataLoader workers", loaders))}
    shared = {role: cpus for role, cpus in shared.items() if cpus}
    proxy = rank.environ.get("NCCL_PROXY_CPUSET")
    where = f"ran on CPUs {format_cpulist(ran) or '?'}" + (f" (NCCL_PROXY_CPUSET={proxy})" if proxy else "")
    if not shared:
        return [Finding("nccl-threads", "info", f"{what} {where}, apart from the OpenMP team and the loaders",
                        "NCCL's proxy thread polls at 100%: on cores of its own it takes none from the rest",
                        "nothing to do", rank.label())]
    overlap = "; ".join(f"cores of CPUs {format_cpulist(cpus)} with {role}" for role, cpus in shared.items())
    return [Finding(
        "nccl-threads-shared", "warning", f"{what} {where}, sharing {overlap}",
        "NCCL's proxy thread busy-polls at 100% (NVIDIA/nccl #374): on a core of the OpenMP team it slows every "
        "parallel region, on a loader core it starves the DataLoader workers",
        "keep cores for NCCL: launch with `affrun torchrun` / `affrun exec` --comm-cores 1, which sets "
        "NCCL_PROXY_CPUSET (NCCL 2.28.3 and later) and leaves those cores out of the team and the loaders",
        rank.label(),
    )]


def rank_nccl_findings(audit: JobAudit, ranks: Sequence[ProcessRecord], topology: Topology) -> list[Finding]:
    """:func:`nccl_findings` of every rank, the version read from each rank's mapped ``libnccl`` (I/O)."""
    out: list[Finding] = []
    for rank in ranks:
        loaded = loaded_nccl(rank)
        out.extend(nccl_findings(audit, rank, topology, *((loaded.version, loaded.path, loaded.deleted) if loaded
                                                          else (None, None))))
    return out
