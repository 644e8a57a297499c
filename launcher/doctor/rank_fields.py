"""A rank's fields, as :func:`launcher.plan.threads.thread_plan` reads them, from the ``AFFRUN_*`` variables of an
environment the doctor audits, read by the one strict reader (:func:`launcher.bind.readback.read_binding`); values
that cannot be a binding made here are no plan (:func:`binding_problem` says why)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from launcher.bind.inherited import MACHINE_LACKS
from launcher.bind.readback import TaskBinding, read_binding
from launcher.env.variables import BOUND_VARIABLE


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


def _read(environ: Mapping[str, str], online: frozenset[int]) -> tuple[TaskBinding | None, str | None]:
    """The binding ``environ`` describes and why it cannot be one (each ``None`` when not)."""
    try:
        return read_binding(environ, online or None, MACHINE_LACKS), None
    except ValueError as exc:
        return None, str(exc)


def environ_fields(environ: Mapping[str, str], rank: int | None,
                   online: frozenset[int] = frozenset()) -> LiveFields | None:
    """The fields of a rank from its ``AFFRUN_*`` variables; ``None`` without ``AFFRUN_CPUS``, or where they
    cannot be a binding (:func:`binding_problem` says why). ``rank``: its local rank where ``AFFRUN_LOCAL_RANK``
    does not say."""
    binding, _ = _read(environ, online)
    if binding is None:
        return None
    local = binding.local_rank if environ.get(BOUND_VARIABLE) else rank or 0
    return LiveFields(local, sorted_cpus(binding.cpus), sorted_cpus(binding.compute_cpus),
                      sorted_cpus(binding.loader_cpus), sorted_cpus(binding.comm_cpus),
                      sorted_cpus(binding.main_cpus), binding.threads)


def binding_problem(environ: Mapping[str, str], online: frozenset[int]) -> str | None:
    """Why a process's ``AFFRUN_*`` variables cannot be the binding it runs under: malformed, not the shape of
    any plan, or naming a CPU that is not in ``online`` (where it is known), to which no mask can have been set
    here. ``None`` when they can be, or when ``AFFRUN_CPUS`` is unset."""
    return _read(environ, online)[1]
