"""The doctor's one pipeline, topology -> facts -> checks, for every front end that audits an environment:
``affrun doctor`` (:mod:`launcher.cli.doctor_cmd`), ``ensure_affinity()`` (:mod:`launcher.ensure`) and the pytest
plugin (:mod:`launcher.pytest_plugin`). Each says where its topology comes from and what it knows of the runtimes;
the order of the work and the checks run are decided here and in :mod:`launcher.doctor.checks`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.doctor.checks import check_environment
from launcher.doctor.facts import Facts, gather_facts
from launcher.doctor.findings import Finding
from launcher.topology.model import Topology


@dataclass(frozen=True)
class Audited:
    """The machine an audit judges: its topology, whether it is this machine, and the root its files are read under."""

    topology: Topology
    live: bool
    fsroot: str = "/"


def audited_machine(fsroot: str | None = None, topology_file: str | None = None, cpus: str | None = None,
                    environ: Mapping[str, str] | None = None, cpu_identity: bool = False) -> Audited:
    """The machine that ``--fsroot``/``--topology``/``--cpus`` name (``$AFFRUN_FSROOT`` too), else this one.
    ``cpu_identity``: with the CPU's identity (``affrun doctor``); on this machine, from py-cpuinfo (once, about
    1 s) where ``/proc/cpuinfo`` gives none."""
    import os

    from launcher.topology import load_topology, tree_root

    root = tree_root(fsroot, topology_file, os.environ if environ is None else environ)
    topo = load_topology(fsroot=fsroot, topology_file=topology_file, cpus=cpus, environ=environ,
                         cpu_identity=cpu_identity)
    live = not root and not topology_file
    if cpu_identity and live and topo.cpu is None:
        from dataclasses import replace

        from launcher.topology.cpu_identity import live_identity_from_py_cpuinfo

        topo = replace(topo, cpu=live_identity_from_py_cpuinfo())
    return Audited(topo, live=live, fsroot=root or "/")


def diagnose(
    environ: Mapping[str, str],
    machine: Audited,
    *,
    nproc: int | None = None,
    openmp: Sequence[str] | None = None,
    openmp_source: str = "",
    probe_host: bool = True,
    process_cpus: frozenset[int] | None = None,
    host: bool = True,
) -> tuple[Facts, list[Finding]]:
    """The facts about ``environ`` on ``machine`` and every finding of the checks (``host=False``: the
    per-process ones only). The keywords are :func:`launcher.doctor.facts.gather_facts`'s."""
    facts = gather_facts(environ, machine.topology, live=machine.live, nproc=nproc, openmp=openmp,
                         openmp_source=openmp_source, probe_host=probe_host, fsroot=machine.fsroot,
                         process_cpus=process_cpus)
    return facts, check_environment(environ, machine.topology, facts, host=host)
