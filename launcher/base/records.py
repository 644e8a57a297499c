"""Records to JSON and back: :func:`to_dict` writes a dataclass field by field, :func:`from_dict` reads one back
and checks every value by its field's annotation (an integer in its :class:`Range`, a string the environment can
hold, a ``Literal``'s member, a tuple, a frozenset (as a sorted list), a mapping, an optional, a nested record),
raising :class:`BadRecord` with one short line that names the field. Keys a record does not know are left: keys
are only ever added."""

from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

from launcher.base.untrusted import short

R = TypeVar("R")
_FLOAT_MAX = sys.float_info.max  # an integer beyond it cannot be a float; nan and inf are no value


class BadRecord(ValueError):
    """A field is missing or has the wrong type or value (the message names it)."""


@dataclass(frozen=True)
class Range:
    """The bounds of an integer, as ``Annotated[int, Range(low, high)]``."""

    low: int
    high: int


def to_dict(record: Any) -> dict[str, Any]:
    """``record``'s fields in their order, as JSON takes them: records as objects, tuples as lists."""
    return {f.name: _plain(getattr(record, f.name)) for f in dataclasses.fields(record)}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, frozenset):
        return sorted(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        found = {f.name: f.type for f in dataclasses.fields(cls)}
        if any(isinstance(tp, str) for tp in found.values()):  # postponed annotations: evaluated here
            found = typing.get_type_hints(cls, include_extras=True)
        _HINTS[cls] = found
    return _HINTS[cls]


def from_dict(cls: type[R], value: Any, what: str) -> R:
    """The ``cls`` record that the JSON object ``value`` holds, every field checked; ``what`` names it (``""``:
    the whole document, whose fields are named alone)."""
    if not isinstance(value, dict):
        raise BadRecord(f"{what} must be an object, not {short(value, 40)}")
    hints = _hints(cls)
    given: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in value:
            given[f.name] = _read(hints[f.name], value[f.name], f"{what}.{f.name}" if what else f.name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise BadRecord(f"{what}: missing \"{f.name}\"" if what else f"missing \"{f.name}\"")
    return cls(**given)


def environment_string(value: str) -> bool:
    """Whether ``value`` can go into the environment (``os.environ``, ``execve``): no NUL byte, and encodable
    (a lone surrogate that JSON's ``\\ud800`` made is not)."""
    if "\0" in value:
        return False
    try:
        os.fsencode(value)
    except UnicodeError:
        return False
    return True


def _read(tp: Any, value: Any, what: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        found = _read(args[0], value, what)
        for bound in args[1:]:
            if isinstance(bound, Range) and not bound.low <= found <= bound.high:
                raise BadRecord(f"{what} must be an integer from {bound.low} to {bound.high}, not {short(value, 40)}")
        return found
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return _read(next(a for a in args if a is not type(None)), value, what)
    if origin is typing.Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise BadRecord(f"{what} must be one of {', '.join(map(str, args))}, not {short(value, 40)}")
    if origin is tuple or origin is frozenset:
        if not isinstance(value, list):
            raise BadRecord(f"{what} must be a list, not {short(value, 40)}")
        return origin(_read(args[0], v, f"{what}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise BadRecord(f"{what} must be an object, not {short(value, 40)}")
        return {_read(args[0], k, f"{what} key"): _read(args[1], v, f"{what}[{short(k, 40)}]") for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_dict(tp, value, what)
    if tp is bool or tp is int:
        if isinstance(value, tp) and (tp is bool or not isinstance(value, bool)):
            return value
        raise BadRecord(f"{what} must be {'true or false' if tp is bool else 'an integer'}, not {short(value, 40)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < _FLOAT_MAX:
            return float(value)
        raise BadRecord(f"{what} must be a finite number, not {short(value, 40)}")
    if tp is str:
        if not isinstance(value, str):
            raise BadRecord(f"{what} must be a string, not {short(value, 40)}")
        if not environment_string(value):  # any string may reach the environment or an error line
            raise BadRecord(f"{what} holds a NUL byte or a character the environment cannot hold: {short(value, 40)}")
        return value
    raise TypeError(f"{what}: no reader for {tp!r}")
