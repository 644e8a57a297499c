"""Where an OpenMP environment binds a process's main thread: the first place of ``KMP_AFFINITY``, ``OMP_PLACES``
with ``OMP_PROC_BIND``, or ``GOMP_CPU_AFFINITY``, as each runtime reads them. Pure; the rules: docs/design.md §2."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from launcher.doctor.check_base import INTEL_RUNTIMES, gnu_possible, intel_in_process
from launcher.doctor.facts import Facts
from launcher.env.omp_syntax import (
    ABSTRACT_PLACES,
    KMP_TYPES,
    kmp_type,
    parse_gomp_cpu_affinity,
    parse_places,
    parse_proclist,
)
from launcher.topology.model import Topology

# every KMP_AFFINITY type binds the threads but these two (logical and physical are old names of compact)
KMP_BINDING_TYPES = tuple(t for t in KMP_TYPES if t not in ("none", "disabled"))


def pinning_variables(environ: Mapping[str, str], runtimes: Collection[str]) -> list[tuple[str, str]]:
    """(name, value) of the binding variables a loaded OpenMP runtime (``runtimes``: their names) acts on:
    ``OMP_PLACES``/``OMP_PROC_BIND`` unless it is false, ``GOMP_CPU_AFFINITY`` (libgomp, without
    ``OMP_PROC_BIND``), ``KMP_AFFINITY`` with a binding type (libiomp5, libomp)."""
    bind = environ.get("OMP_PROC_BIND", "").strip().lower()
    out = [(n, environ[n]) for n in ("OMP_PLACES", "OMP_PROC_BIND")
           if environ.get(n) and {"libgomp", *INTEL_RUNTIMES} & set(runtimes) and bind.split(",")[0] != "false"]
    if "libgomp" in runtimes and environ.get("GOMP_CPU_AFFINITY") and not bind:
        out.append(("GOMP_CPU_AFFINITY", environ["GOMP_CPU_AFFINITY"]))
    kmp = environ.get("KMP_AFFINITY", "")
    if kmp and kmp_type(kmp) in KMP_BINDING_TYPES and set(INTEL_RUNTIMES) & set(runtimes):
        out.append(("KMP_AFFINITY", kmp))
    return out


def kmp_tokens(value: str) -> list[str]:
    text = re.sub(r"proclist=\[[^\]]*\]", "", value, flags=re.IGNORECASE)
    return [t.strip().lower() for t in text.split(",") if t.strip()]


def abstract_places(name: str, cpus: frozenset[int], topology: Topology) -> list[frozenset[int]]:
    """The places an abstract ``OMP_PLACES`` name makes inside ``cpus``, in CPU order."""
    groups: list[frozenset[int]]
    if name == "cores":
        groups = [frozenset(core.pus) for core in topology.cores]
    elif name == "sockets":
        groups = [p.cpus for p in topology.packages]
    elif name == "numa_domains":
        groups = [n.cpus for n in topology.numa_nodes]
    elif name == "ll_caches":
        groups = [g.cpus for g in topology.l3_groups] or [p.cpus for p in topology.packages]
    else:
        groups = []
    places = [g & cpus for g in groups if g & cpus]
    covered = {c for g in places for c in g}
    places.extend(frozenset([c]) for c in cpus - covered)  # threads, or CPUs the topology does not place
    return sorted(places, key=min)


def main_thread_place(
    environ: Mapping[str, str], cpus: frozenset[int], topology: Topology, facts: Facts
) -> tuple[str, frozenset[int]] | None:
    """The variables that bind the initial thread, and the CPUs of the first place it is bound to (``None``:
    unbound), by each runtime's precedence (docs/design.md §2)."""
    if not cpus:
        return None
    gnu, intel = gnu_possible(facts), intel_in_process(facts)
    kmp = environ.get("KMP_AFFINITY")
    ktype = kmp_type(kmp) if kmp else None
    if intel and kmp and ktype in KMP_BINDING_TYPES:
        place = _kmp_first_place(kmp, cpus, topology)
        if place:
            return f"KMP_AFFINITY={kmp}", place
    if intel and not gnu and ktype in ("none", "disabled"):
        return None  # the KMP type wins over OMP_PLACES/OMP_PROC_BIND in these runtimes
    bind = environ.get("OMP_PROC_BIND", "").strip().lower()
    first_bind = bind.split(",")[0] if bind else ""
    if first_bind == "false":
        return None
    places = environ.get("OMP_PLACES", "").strip()
    cause = " ".join(f"{n}={environ[n]}" for n in ("OMP_PLACES", "OMP_PROC_BIND") if environ.get(n))
    if places:
        base = places.split("(")[0].strip().lower()
        if base in ABSTRACT_PLACES:
            found = abstract_places(base, cpus, topology)
        else:
            parsed = parse_places(places)
            if parsed is None:
                # libgomp rejects the value and, with OMP_PROC_BIND set, binds one thread per CPU from the first.
                return (cause, frozenset([min(cpus)])) if first_bind else None
            found = [p & cpus for p in parsed if p & cpus]
        return (cause, found[0]) if found else None
    gomp = environ.get("GOMP_CPU_AFFINITY", "").strip()
    if gnu and gomp and not first_bind:
        listed = [c for c in parse_gomp_cpu_affinity(gomp) or [] if c in cpus]
        return (f"GOMP_CPU_AFFINITY={gomp}", frozenset(listed[:1])) if listed else None
    if first_bind in ("true", "close", "spread", "primary", "master"):
        first = min(cpus)
        if gnu:
            return cause, frozenset([first])
        core = next((frozenset(c.pus) & cpus for c in topology.cores if first in c.pus), frozenset([first]))
        return cause, core
    return None


def _kmp_first_place(value: str, cpus: frozenset[int], topology: Topology) -> frozenset[int]:
    match = re.search(r"proclist=\[([^\]]*)\]", value, flags=re.IGNORECASE)
    if match and kmp_type(value) == "explicit":
        parsed = parse_proclist(match.group(1))
        first = [p & cpus for p in parsed or [] if p & cpus]
        return first[0] if first else frozenset()
    tokens = kmp_tokens(value)
    granularity = next((t.split("=", 1)[1] for t in tokens if t.startswith("granularity=")), "core")
    lowest = min(cpus)
    if granularity in ("fine", "thread"):
        return frozenset([lowest])
    return next((frozenset(c.pus) & cpus for c in topology.cores if lowest in c.pus), frozenset([lowest]))
