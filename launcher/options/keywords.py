"""affrun's options given as Python keyword arguments (``bind_rank(0, 2, loader_cores=1)``), each read by its
option's kind: a wrong one is one :class:`~launcher.errors.ConfigError` naming the keyword as the caller wrote it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.base.errors import ConfigError
from launcher.base.untrusted import short
from launcher.options.table import BINDING_OPTIONS, OptionSpec
from launcher.options.values import BadValue, integer, read

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

BY_KEYWORD: dict[str, OptionSpec] = {o.name("python"): o for o in BINDING_OPTIONS}
_NO_RANK = object()


def check_rank_keywords(caller: str, nproc_per_node: object, local_rank: object = _NO_RANK) -> int:
    """The rank count a Python caller passed (and the local rank, where given, one of them), checked; else one
    :class:`ConfigError` that names the keyword (``bind_rank: nproc_per_node=0 must be at least 1: ...``)."""
    nproc = integer(nproc_per_node)
    if nproc is None:
        raise ConfigError(f"{caller}: nproc_per_node={short(nproc_per_node)} is not an int")
    try:
        read("count", max(nproc, 0), "python")  # the one bound of every count: what some machine could hold
    except BadValue as exc:
        raise ConfigError(f"{caller}: nproc_per_node={short(nproc)}: {exc}") from None
    if nproc < 1:
        from launcher.base.errors import AffrunError
        from launcher.options.table import spell_error
        from launcher.plan.request import check_rank_count

        try:
            check_rank_count(nproc)
        except AffrunError as exc:
            raise ConfigError(f"{caller}: {spell_error(exc, 'python')}") from None
    if local_rank is not _NO_RANK:
        rank = integer(local_rank)
        if rank is None:
            raise ConfigError(f"{caller}: local_rank={short(local_rank)} is not an int")
        if not 0 <= rank < nproc:
            raise ConfigError(f"{caller}: local_rank={rank} is not a rank of nproc_per_node={nproc} "
                              f"(0 to {nproc - 1})")
    return nproc


def check_keywords(values: Mapping[str, object], specs: Mapping[str, OptionSpec] = BY_KEYWORD) -> dict[str, Any]:
    """``values`` (by Python keyword) as the option table's strings, ints and bools; one not in ``specs`` is
    returned as given. Raises one :class:`ConfigError` naming the first wrong keyword."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        spec = specs.get(name)
        out[name] = value if spec is None else check_keyword(spec, value)
    return out


def check_keyword(spec: OptionSpec, value: object) -> Any:
    """One keyword's value, normalised as the command line would give it (see :func:`check_keywords`)."""
    try:
        return spec.read(value, "python")
    except BadValue as exc:
        raise ConfigError(f"{spec.name('python')}={short(value)}: {exc}") from None


def check_argument(caller: str | None, name: str, value: object, kind: str, choices: tuple[str, ...] = ()) -> Any:
    """A keyword of a Python front end that is no option of the table (``bind_rank``'s ``quiet``), read by its
    kind: one :class:`ConfigError` naming it (``bind_rank: quiet='no': expected True or False``)."""
    try:
        return read(kind, value, "python", choices, name)
    except BadValue as exc:
        where = f"{caller}: " if caller else ""
        raise ConfigError(f"{where}{name}={short(value)}: {exc}") from None
