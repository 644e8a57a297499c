"""A rank's fields, as :func:`launcher.plan.threads.thread_plan` reads them, from the ``AFFRUN_*`` variables of an
environment it audits (a live rank's ``/proc/PID/environ``, or the environment ``affrun doctor`` runs in). Pure,
and tolerant: a malformed list reads as empty, as the audits judge what they find rather than fail."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from launcher.base.cpulist import MAX_COUNT, format_cpulist
from launcher.base.untrusted import ascii_uint, clip
from launcher.bind.readback import exported_cpus
from launcher.env.variables import BOUND_VARIABLE, MAIN_VARIABLE


@dataclass(frozen=True)
class LiveFields:
    """A live rank's fields, as :func:`launcher.plan.threads.thread_plan` reads them."""

    local_rank: int
    cpus: tuple[int, ...]
    compute_cpus: tuple[int, ...]
    loader_cpus: tuple[int, ...]
    comm_cpus: tuple[int, ...]
    main_cpus: tuple[int, ...]
    threads: int


def sorted_cpus(cpus: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(set(cpus)))


def environ_fields(environ: Mapping[str, str], rank: int | None) -> LiveFields | None:
    """The fields of a rank from its ``AFFRUN_*`` variables; ``None`` without a readable ``AFFRUN_CPUS``."""
    cpus = exported_cpus(environ)
    if not cpus:
        return None
    compute = exported_cpus(environ, "AFFRUN_COMPUTE_CPUS") & cpus or cpus
    local = ascii_uint(environ.get(BOUND_VARIABLE, "").strip())
    threads = ascii_uint(environ.get("AFFRUN_THREADS", "").strip()) or len(compute)
    threads = threads if threads <= MAX_COUNT else len(compute)  # no plan has more threads than CPU ids
    return LiveFields(local if local is not None else rank or 0, sorted_cpus(cpus), sorted_cpus(compute),
                      sorted_cpus(exported_cpus(environ, "AFFRUN_LOADER_CPUS") & cpus),
                      sorted_cpus(exported_cpus(environ, "AFFRUN_COMM_CPUS") & cpus),
                      sorted_cpus(exported_cpus(environ, MAIN_VARIABLE) & cpus), threads)


def binding_problem(environ: Mapping[str, str], online: frozenset[int]) -> str | None:
    """Why a process's ``AFFRUN_CPUS`` cannot be the binding it runs under: not a CPU list, or naming a CPU that
    is not in ``online`` (where it is known), to which no mask can have been set here. ``None`` when it can be, or
    is unset."""
    value = environ.get("AFFRUN_CPUS", "")
    if not value.strip():
        return None
    cpus = exported_cpus(environ)
    if not cpus:
        return f"AFFRUN_CPUS={clip(value, 60)} is not a CPU list"
    if online and not cpus <= online:
        return (f"AFFRUN_CPUS={clip(format_cpulist(cpus), 60)} names CPUs this machine lacks "
                f"({clip(format_cpulist(cpus - online), 60)}): no binding to them was made here")
    return None
