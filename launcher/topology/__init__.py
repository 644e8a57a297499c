"""Topology: the machine model and the readers that build it (sysfs/fsroot, JSON snapshot, hwloc XML)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

from launcher.base.cpulist import cpu_error, format_cpulist, parse_cpulist
from launcher.base.errors import Opt, TopologyError
from launcher.base.untrusted import clip
from launcher.topology.model import GPU, Core, L3Group, NumaNode, Package, Topology

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = ["GPU", "Core", "L3Group", "NumaNode", "Package", "Topology", "load_topology"]


def check_sources(fsroot: str | None, topology_file: str | None, cpus: str | None) -> frozenset[int] | None:
    """What :func:`load_topology` can refuse without reading anything: two sources, or a ``cpus`` that is not a
    cpu list (the submitit executor checks its options with it before any task starts). Returns the CPUs of
    ``cpus``, ``None`` when it is not given."""
    if fsroot and topology_file:
        raise TopologyError(Opt("fsroot"), " and ", Opt("topology_file"), " name two sources: give only one")
    if not cpus:
        return None
    try:
        return parse_cpulist(cpus)
    except ValueError as exc:
        raise TopologyError(Opt("cpus", clip(cpus), quoted=True),
                            ": " + cpu_error(exc, "not a cpu list (expected e.g. 0-7,64-71)")) from None


def tree_root(fsroot: str | None, topology_file: str | None, environ: Mapping[str, str]) -> str | None:
    """The sysfs tree :func:`load_topology` reads: ``fsroot``, else ``$AFFRUN_FSROOT`` unless a topology file is
    given; ``None``: the live machine or the file."""
    return fsroot or (None if topology_file else environ.get("AFFRUN_FSROOT") or None)


def load_topology(
    *,
    fsroot: str | None = None,
    topology_file: str | None = None,
    cpus: str | None = None,
    environ: Mapping[str, str] | None = None,
    nvml: bool = False,
    gpus: bool = True,
    cpu_identity: bool = False,
) -> Topology:
    """Build the topology from the one source asked for, then narrow it by ``--cpus``.

    ``gpus=False`` (a CPU-only plan, ``--no-gpu``) leaves GPUs out: no PCI scan, no visibility variables.

    Precedence: ``topology_file``, then ``fsroot``, then ``$AFFRUN_FSROOT``, then the live machine
    (whose allowed set is this process's affinity mask). ``environ`` gives the GPU visibility variables.
    ``nvml`` adds GPU UUIDs from NVML and cross-checks the GPU list (a no-op where NVML is unavailable).
    ``cpu_identity`` adds the CPU's vendor, model and binding flags of the machine described (``Topology.cpu``).
    """
    env = os.environ if environ is None else environ
    wanted = check_sources(fsroot, topology_file, cpus)
    fsroot = tree_root(fsroot, topology_file, env)
    document = None  # the --topology file, parsed
    if topology_file:
        topo, document = _load_file(topology_file)
    else:
        from launcher.topology.sysfs import read_sysfs

        if fsroot:
            if not os.path.isdir(fsroot):
                raise TopologyError(f"{clip(fsroot, 200)}: fsroot is not a directory")
            topo = read_sysfs(fsroot, gpus=gpus)
        else:
            topo = _read_live(env, gpus)
        topo = _with_cpu_quota(topo, fsroot or "/")
    if not gpus and topo.gpus:
        topo = replace(topo, gpus=(), visible=None)
    if nvml:
        from launcher.topology.nvml import with_nvml

        topo = with_nvml(topo)
    if topo.gpus:
        from launcher.topology.gpus import resolve_visible

        resolved = resolve_visible(topo.gpus, env)
        topo = replace(topo, visible=resolved.visible)
        if resolved.warning:
            topo = topo.with_warnings(resolved.warning)
    if wanted is not None:
        narrowed = topo.allowed & wanted
        if not narrowed:
            raise TopologyError(Opt("cpus", cpus),
                                f": none of these CPUs is allowed here (allowed: {format_cpulist(topo.allowed)})")
        topo = topo.restrict(wanted)
    if cpu_identity:
        from launcher.topology.cpu_identity import identify

        found, warning = identify(fsroot or "/", document, topology_file or "")
        topo = replace(topo, cpu=found)
        topo = topo.with_warnings(warning) if warning else topo
    return topo


def _read_live(env: Mapping[str, str], gpus: bool) -> Topology:
    """The live machine. Inside a Slurm step that bound this task to part of the step's CPUs, every task plans
    over the same set (the step's cpuset), so that all tasks of a node compute the same plan."""
    from launcher.base.slurm_step import in_slurm_step, step_cpus_for_planning
    from launcher.topology.cgroup import find_cpuset
    from launcher.topology.sysfs import read_sysfs

    allowed = frozenset(os.sched_getaffinity(0))
    note = None
    if in_slurm_step(env):
        cpuset = find_cpuset("/")
        allowed, note = step_cpus_for_planning(env, allowed, cpuset.cpus if cpuset else None)
    topo = read_sysfs("/", allowed=allowed, gpus=gpus)
    return topo.with_warnings(note) if note else topo


def _with_cpu_quota(topo: Topology, root: str) -> Topology:
    """The CFS quota of "self" (cgroup ``cpu.max`` or ``cpu.cfs_quota_us``) under ``root``, into the model."""
    from launcher.topology.cgroup import find_cpu_quota

    quota = find_cpu_quota(root)
    return topo if quota is None else replace(topo, cpu_quota=quota.cpus, cpu_quota_source=quota.source)


def _load_file(path: str) -> tuple[Topology, Any]:
    """A ``--topology`` file, read bounded (:func:`document_topology`)."""
    from launcher.topology._files import read_document

    return document_topology(read_document(path, "an affrun JSON snapshot or an hwloc XML export"), path)


def document_topology(data: bytes, path: str) -> tuple[Topology, Any]:
    """The contents ``data`` of a ``--topology`` file ``path``: hwloc XML (``.xml``, or any document starting with
    ``<``) or an affrun JSON snapshot; and the document as parsed (where the CPU's identity is read, when asked)."""
    if path.lower().endswith(".xml") or data[:64].lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"<"):
        from launcher.topology.hwloc_xml import parse_hwloc_xml, xml_topology

        top = parse_hwloc_xml(data, path)
        return xml_topology(top, path), top
    from launcher.topology.snapshot import from_snapshot, parse_snapshot

    document = parse_snapshot(data, path)
    return replace(from_snapshot(document, path), loaded_from=f"snapshot {path}"), document
