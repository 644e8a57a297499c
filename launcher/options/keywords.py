"""affrun's options given as Python keyword arguments (``bind_rank(0, 2, loader_cores=1)``,
``AffinityExecutor(..., cpus=range(8))``): one check for every Python front end, driven by the option table.

Each option's kind (:attr:`launcher.options.table.OptionSpec.kind`) says what a caller may give besides the string
the command line takes: ``True``/``False`` for a flag, an ``int`` (never a ``bool``) for a count, one of the
choices, a path (``str`` or ``os.PathLike``), or, for CPU and GPU lists, an iterable of ints (a list, a tuple, a
``range``, a generator: read once, here). Anything else is one :class:`~launcher.errors.ConfigError` that names
the keyword as the caller wrote it (``loader_cores=1.5: ...``), before anything is planned or bound. Bytes are
refused: they iterate as ints (``b"0,1"`` would be CPUs 44,48-49). A count above :data:`MAX_COUNT` fits no machine,
and a CPU list given as a string is read here too. The Python front ends' own keywords (``quiet``, ``warn``,
``verbose``, ``policy``, the rank keywords) go through the same checks (:func:`check_argument`). Standard library only.
"""

from __future__ import annotations

import operator
import os
from itertools import islice
from typing import TYPE_CHECKING

from launcher.base.cpulist import MAX_COUNT, MAX_CPU_ID, CpuIdTooLarge, format_cpulist, id_problem, parse_cpulist
from launcher.base.untrusted import short
from launcher.errors import ConfigError
from launcher.options.table import BINDING_OPTIONS, OptionSpec

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, Literal

    Kind = Literal["flag", "count", "choice", "path", "cpus", "gpus", "cpu_map"]

# A CPU or GPU list holds at most one entry per CPU id affrun accepts (an endless generator is refused, not read).
MAX_ITEMS = MAX_CPU_ID + 1
_EXPECTED = {
    "flag": "True or False",
    "count": f"a whole number from 0 to {MAX_COUNT} (an int, not a bool)",
    "path": "a path (str or os.PathLike)",
    "cpus": "a cpu list string like '0,2-3' or an iterable of ints",
    "gpus": "a GPU list string like '0,1' or a sequence of ints",
    "cpu_map": "'LIST;LIST' or a sequence of per-rank cpu lists (strings or iterables of ints)",
}
BY_KEYWORD: dict[str, OptionSpec] = {o.name("python"): o for o in BINDING_OPTIONS}


_NO_RANK = object()


def check_rank_keywords(caller: str, nproc_per_node: object, local_rank: object = _NO_RANK) -> int:
    """The rank count (and, where given, the local rank) a Python caller passed: ints, not bools; at least one rank,
    in the planner's one wording of a count below 1; the rank one of them. Else one :class:`ConfigError` that names
    the keyword (``bind_rank: nproc_per_node=0 must be at least 1: ...``). Returns the count."""
    nproc = _integer(nproc_per_node)
    if nproc is None:
        raise ConfigError(f"{caller}: nproc_per_node={short(nproc_per_node)} is not an int")
    try:
        _at_most_count(nproc)
    except _Bad as exc:
        raise ConfigError(f"{caller}: nproc_per_node={short(nproc)}: {exc}") from None
    if nproc < 1:
        from launcher.errors import AffrunError
        from launcher.options.table import spell_error
        from launcher.plan.request import check_rank_count

        try:
            check_rank_count(nproc)
        except AffrunError as exc:
            raise ConfigError(f"{caller}: {spell_error(exc, 'python')}") from None
    if local_rank is not _NO_RANK:
        rank = _integer(local_rank)
        if rank is None:
            raise ConfigError(f"{caller}: local_rank={short(local_rank)} is not an int")
        if not 0 <= rank < nproc:
            raise ConfigError(f"{caller}: local_rank={rank} is not a rank of nproc_per_node={nproc} "
                              f"(0 to {nproc - 1})")
    return nproc


class _Bad(Exception):
    """A value of the wrong kind: the message says what to give instead."""


def check_keywords(values: Mapping[str, object], specs: Mapping[str, OptionSpec] = BY_KEYWORD) -> dict[str, Any]:
    """``values`` (keyed by the Python keyword: ``cpu_map``, ``topology``) as the option table's strings, ints and
    bools; ``None`` stays "not given". Raises one :class:`ConfigError` naming the first wrong keyword; a keyword
    that ``specs`` does not hold is the caller's to judge (it is returned as given)."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        spec = specs.get(name)
        out[name] = value if spec is None else check_keyword(spec, value)
    return out


def check_keyword(spec: OptionSpec, value: object) -> Any:
    """One keyword's value, normalised as the command line would give it (see :func:`check_keywords`)."""
    try:
        return _normalise(spec.kind, value, spec.choices or (), spec.dest)
    except _Bad as exc:
        raise ConfigError(f"{spec.name('python')}={short(value)}: {exc}") from None


def check_argument(caller: str | None, name: str, value: object, kind: Kind, choices: tuple[str, ...] = ()) -> Any:
    """A keyword of a Python front end that is no option of the table (``bind_rank``'s ``quiet``,
    ``ensure_affinity``'s ``warn`` and ``policy``, the executor's ``verbose``), checked by its kind with the table
    options' own check: one :class:`ConfigError` naming it (``bind_rank: quiet='no': expected True or False``)."""
    try:
        return _normalise(kind, value, choices, name)
    except _Bad as exc:
        where = f"{caller}: " if caller else ""
        raise ConfigError(f"{where}{name}={short(value)}: {exc}") from None


def _normalise(kind: str, value: object, choices: tuple[str, ...], dest: str) -> Any:
    if kind == "flag":
        if not isinstance(value, bool):
            raise _Bad("expected " + _EXPECTED[kind])
        return value
    if kind == "count":
        number = _integer(value)
        if number is not None:
            _at_most_count(number)
        if number is None or number < 0:
            raise _Bad("expected " + _EXPECTED[kind])
        return number
    if kind == "choice":
        if not isinstance(value, str) or value not in choices:
            raise _Bad(f"choose one of {', '.join(choices)}")
        return value
    if value is None:
        return None
    if kind == "path":
        if not isinstance(value, (str, os.PathLike)):
            raise _Bad("expected " + _EXPECTED[kind])
        path = os.fspath(value)
        if not isinstance(path, str) or not path or "\0" in path:
            raise _Bad("expected a path (a non-empty str without NUL)")
        return os.path.abspath(path)  # a task or a child may start in another directory
    if isinstance(value, str):
        if kind == "cpus":
            _cpu_list(value, required=dest == "cpus")
        return value  # the command line's own syntax (the planner checks the other lists, naming the keyword)
    if kind == "cpus":
        ids = _ints(value, _EXPECTED[kind], ordered=False)
        if not ids and dest == "cpus":
            raise _Bad("expected at least one CPU (an empty list would leave the ranks none)")
        return format_cpulist(ids)
    if kind == "gpus":
        return ",".join(map(str, _ints(value, _EXPECTED[kind], ordered=True)))
    if kind == "cpu_map":
        parts = _items(value, _EXPECTED[kind], ordered=True)
        lists = [p if isinstance(p, str) else format_cpulist(_ints(p, _EXPECTED[kind], ordered=False)) for p in parts]
        if not lists or any(not p.strip() for p in lists):
            raise _Bad("expected one non-empty cpu list per rank")
        if any(";" in p for p in lists):
            raise _Bad("expected one cpu list per item (';' separates ranks only in the string form)")
        return ";".join(lists)
    raise AssertionError(kind)  # pragma: no cover: every kind of the table is handled above


def _at_most_count(number: int) -> None:
    """The one bound of every count a Python caller gives (cores, ranks): what some machine could hold."""
    if number > MAX_COUNT:
        raise _Bad(f"more than any machine has: at most {MAX_COUNT}, one per CPU id affrun accepts")


def _cpu_list(text: str, required: bool) -> None:
    """A CPU list given as a string, read as the command line's is: ``required`` (``cpus``), it names a CPU."""
    try:
        ids = parse_cpulist(text)
    except CpuIdTooLarge as exc:
        raise _Bad(str(exc)) from None
    except ValueError:
        raise _Bad("not a cpu list (expected e.g. '0-7,64-71')") from None
    if required and not ids:
        raise _Bad("names no CPU (expected e.g. '0-7,64-71'; an empty list would leave the ranks none)")


def _items(value: object, expected: str, ordered: bool) -> list[object]:
    """The items of an iterable, read once and at most :data:`MAX_ITEMS` of them. Bytes and mappings are not lists;
    neither is a set where the order means something (GPU i is rank i's)."""
    if isinstance(value, (bytes, bytearray, memoryview, dict)) or not hasattr(value, "__iter__"):
        raise _Bad("expected " + expected)
    if ordered and isinstance(value, (set, frozenset)):
        raise _Bad("expected " + expected + " in rank order (not a set)")
    try:
        items = list(islice(value, MAX_ITEMS + 1))
    except TypeError:
        raise _Bad("expected " + expected) from None
    if len(items) > MAX_ITEMS:
        raise _Bad(f"expected at most {MAX_ITEMS} items")
    return items


def _ints(value: object, expected: str, ordered: bool) -> list[int]:
    ids: list[int] = []
    for item in _items(value, expected, ordered):
        number = _integer(item)
        if number is None:
            raise _Bad("expected " + expected)
        problem = id_problem(number)
        if problem:
            raise _Bad(f"expected ids from 0 to {MAX_CPU_ID} ({problem})")
        ids.append(number)
    return ids


def _integer(value: object) -> int | None:
    """``value`` as a plain int if it is an integer (``int``, numpy's integers: anything with ``__index__``) and
    not a bool (``True`` is no CPU and no count); else ``None``. Floats, strings and bytes are not integers."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:  # numpy's bool_ has __index__ and refuses it
        return None
