"""One reader per kind of option value (:attr:`launcher.options.table.OptionSpec.kind`), for every vocabulary a
value arrives in: ``cli``, ``python`` (keyword arguments), ``tuned`` and ``profile`` (a YAML site profile). :func:`read`
returns the value as the front ends hold it, or raises :class:`BadValue` for each to frame (docs/design.md §14).
"""

from __future__ import annotations

import operator
import os
from itertools import islice
from typing import TYPE_CHECKING

from launcher.base.cpulist import MAX_COUNT, MAX_CPU_ID, CpuIdTooLarge, format_cpulist, id_problem, parse_cpulist
from launcher.base.untrusted import ascii_uint, short

if TYPE_CHECKING:
    from typing import Any, Literal

    Reader = Literal["cli", "python", "tuned", "profile"]

# A CPU or GPU list holds at most one entry per CPU id affrun accepts (an endless generator is refused, not read).
MAX_ITEMS = MAX_CPU_ID + 1
_LISTS = {
    "cpus": "a cpu list string like '0,2-3' or an iterable of ints",
    "gpus": "a GPU list string like '0,1' or a sequence of ints",
    "cpu_map": "'LIST;LIST' or a sequence of per-rank cpu lists (strings or iterables of ints)",
}


class BadValue(ValueError):
    """A value its option does not take: ``expected`` names what it takes (``a whole number from 0 to 65536``);
    ``why``, where given, says what is wrong instead (the text is ``why``, else ``expected ...``)."""

    def __init__(self, expected: str, why: str = "") -> None:
        super().__init__(why or f"expected {expected}")
        self.expected = expected

    def is_not(self, value: object) -> str:
        """``'x' is not a whole number from 0 to 65536``: the command line's and a tuned file's wording."""
        return f"{short(value)} is not {self.expected}" if self.expected else str(self)


def read(kind: str, value: object, vocabulary: Reader, choices: tuple[str, ...] = (), dest: str = "", low: float = 0,
         high: int | None = MAX_COUNT, over: bool = False) -> Any:
    """``value`` of an option of ``kind`` (``dest``, ``low`` and ``over`` are the option's; ``high``: a count's
    bound), given in ``vocabulary``, as the front ends hold it (``None``: not given). Raises :class:`BadValue`."""
    python = vocabulary == "python"
    if vocabulary == "profile":
        _writable(value)
    if kind == "flag":
        if not isinstance(value, bool):
            raise BadValue("True or False" if python else "true or false")
        return value
    if kind == "count":
        number = integer(value) if python or not isinstance(value, str) else ascii_uint(value)
        expected = (f"a whole number from {low:g} to {high}" if high is not None else f"a whole number >= {low:g}") \
            + (" (an int, not a bool)" if python else "")
        if python and number is not None and number > MAX_COUNT:
            raise BadValue(expected, f"more than any machine has: at most {MAX_COUNT}, one per CPU id affrun accepts")
        if number is None or number < low or (high is not None and number > high):
            raise BadValue(expected)
        return number
    if kind == "choice":
        if not isinstance(value, str) or value not in choices:
            raise BadValue(f"one of {', '.join(choices)}", f"choose one of {', '.join(choices)}" if python else "")
        return value
    if kind in ("int", "port"):
        high = 65535 if kind == "port" else None
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadValue("an integer")
        if value < 1 or (high is not None and value > high):
            raise BadValue("an integer from 1" + (f" to {high}" if high else ""))
        return value
    if kind == "seconds":
        from launcher.base.untrusted import seconds

        try:
            return seconds(str(value), low, inclusive=not over)
        except ValueError as exc:
            raise BadValue("", str(exc)) from None
    if kind == "lines":
        if isinstance(value, str):
            return [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise BadValue("a string or a list of strings")
        return list(value)
    if value is None and python:
        return None
    if python and kind != "str":
        return _python(kind, value, dest)
    if kind in ("strint", "cpus", "gpus", "cpu_map") and vocabulary != "cli" and isinstance(value, int) \
            and not isinstance(value, bool):
        value = str(value)  # YAML reads gpus: 0 and reserve: 0 as numbers
    if not isinstance(value, str):
        raise BadValue("a string or a number" if kind == "strint" else "a string",
                       'expected a string in quotes, such as "1:00:00" or "60" (YAML reads 1:00:00 as the number '
                       '3600)' if kind == "time" else "")
    return value.strip() if vocabulary != "cli" and kind in ("strint", "gpus") else value


def _writable(value: object) -> None:
    """What a site profile or ``affrun sbatch`` writes into a script: no control character, no huge number."""
    from launcher.base.untrusted import unwritable

    if isinstance(value, int) and value.bit_length() > 63:
        raise BadValue("", "expected a smaller number")  # beyond any count, port or size sbatch takes
    for text in value if isinstance(value, (list, tuple)) else [value]:
        bad = unwritable(text) if isinstance(text, str) else None
        if bad is not None:
            raise BadValue("", f"cannot contain {bad}")


def _python(kind: str, value: object, dest: str) -> Any:
    """A path, or a CPU or GPU list, as a Python caller may give it."""
    if kind == "path":
        if not isinstance(value, (str, os.PathLike)):
            raise BadValue("a path (str or os.PathLike)")
        path = os.fspath(value)
        if not isinstance(path, str) or not path or "\0" in path:
            raise BadValue("a path (a non-empty str without NUL)")
        return os.path.abspath(path)  # a task or a child may start in another directory
    if isinstance(value, str):
        if kind == "cpus":
            _cpu_list(value, required=dest == "cpus")
        return value  # the command line's own syntax (the planner checks the other lists, naming the keyword)
    expected = _LISTS[kind]
    if kind == "cpus":
        ids = _ints(value, expected, ordered=False)
        if not ids and dest == "cpus":
            raise BadValue(expected, "expected at least one CPU (an empty list would leave the ranks none)")
        return format_cpulist(ids)
    if kind == "gpus":
        return ",".join(map(str, _ints(value, expected, ordered=True)))
    parts = _items(value, expected, ordered=True)
    lists = [p if isinstance(p, str) else format_cpulist(_ints(p, expected, ordered=False)) for p in parts]
    if not lists or any(not p.strip() for p in lists):
        raise BadValue(expected, "expected one non-empty cpu list per rank")
    if any(";" in p for p in lists):
        raise BadValue(expected, "expected one cpu list per item (';' separates ranks only in the string form)")
    return ";".join(lists)


def _cpu_list(text: str, required: bool) -> None:
    """A CPU list given as a string, read as the command line's is: ``required`` (``cpus``), it names a CPU."""
    try:
        ids = parse_cpulist(text)
    except CpuIdTooLarge as exc:
        raise BadValue("", str(exc)) from None
    except ValueError:
        raise BadValue("", "not a cpu list (expected e.g. '0-7,64-71')") from None
    if required and not ids:
        raise BadValue("", "names no CPU (expected e.g. '0-7,64-71'; an empty list would leave the ranks none)")


def _items(value: object, expected: str, ordered: bool) -> list[object]:
    """The items of an iterable, read once and at most :data:`MAX_ITEMS` of them. Bytes and mappings are not lists;
    neither is a set where the order means something (GPU i is rank i's)."""
    if isinstance(value, (bytes, bytearray, memoryview, dict)) or not hasattr(value, "__iter__"):
        raise BadValue(expected)
    if ordered and isinstance(value, (set, frozenset)):
        raise BadValue(expected, f"expected {expected} in rank order (not a set)")
    try:
        items = list(islice(value, MAX_ITEMS + 1))
    except TypeError:
        raise BadValue(expected) from None
    if len(items) > MAX_ITEMS:
        raise BadValue(expected, f"expected at most {MAX_ITEMS} items")
    return items


def _ints(value: object, expected: str, ordered: bool) -> list[int]:
    ids: list[int] = []
    for item in _items(value, expected, ordered):
        number = integer(item)
        if number is None:
            raise BadValue(expected)
        problem = id_problem(number)
        if problem:
            raise BadValue(expected, f"expected ids from 0 to {MAX_CPU_ID} ({problem})")
        ids.append(number)
    return ids


def integer(value: object) -> int | None:
    """``value`` as a plain int if it is an integer (anything with ``__index__``, numpy's included) and not a bool;
    else ``None``."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:  # numpy's bool_ has __index__ and refuses it
        return None
