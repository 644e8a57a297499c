"""The typed readers of a plan's JSON fields (``AFFRUN_PLAN``, read by :mod:`launcher.bind.wire`): each checks one
value's type and range and raises :class:`BadPlan` naming the field. Standard library only: a rank imports it."""

from __future__ import annotations

import os

from launcher.base.untrusted import short

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a rank imports this module (docs/design.md §11)
if TYPE_CHECKING:
    from typing import Any, TypeVar

    C = TypeVar("C", bound=str)


class BadPlan(ValueError):
    """A field of a plan is missing or has the wrong type or value (the message names it)."""


def get_field(d: dict[str, Any], key: str, what: str) -> Any:
    if key not in d:
        raise BadPlan(f"{what}: missing \"{key}\"")
    return d[key]


def obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadPlan(f"{what} must be an object, not {short(value, 40)}")
    return value


def integer(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadPlan(f"{what} must be an integer from {low} to {high}, not {short(value, 40)}")
    return value


def boolean(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise BadPlan(f"{what} must be true or false, not {short(value, 40)}")
    return value


def environment_string(value: str) -> bool:
    """Whether ``value`` can go into the environment (``os.environ``, ``execve``): no NUL byte, and encodable
    (a lone surrogate that JSON's ``\\ud800`` made is not)."""
    if "\0" in value:
        return False
    try:
        os.fsencode(value)  # what os.environ does with it
    except UnicodeError:
        return False
    return True


def string(value: Any, what: str) -> str:
    """A string of the plan. Any of them may reach the environment or an error line: none may hold NUL."""
    if not isinstance(value, str):
        raise BadPlan(f"{what} must be a string, not {short(value, 40)}")
    if not environment_string(value):
        raise BadPlan(f"{what} holds a NUL byte or a character the environment cannot hold: {short(value, 40)}")
    return value


def choice(value: Any, what: str, choices: tuple[C, ...]) -> C:
    """``value`` as the member of ``choices`` it equals (typed as their Literal); :class:`BadPlan` otherwise."""
    for member in choices:
        if isinstance(value, str) and value == member:
            return member
    raise BadPlan(f"{what} must be one of {', '.join(choices)}, not {short(value, 40)}")


def items(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise BadPlan(f"{what} must be a list, not {short(value, 40)}")
    return value


def ids(value: Any, what: str, high: int) -> tuple[int, ...]:
    found = tuple(integer(v, f"{what}[]", 0, high) for v in items(value, what))
    if len(set(found)) != len(found):
        raise BadPlan(f"{what} lists an id twice")
    return found


def strings(value: Any, what: str) -> tuple[str, ...]:
    return tuple(string(v, f"{what}[]") for v in items(value, what))


def string_map(value: Any, what: str, names: tuple[str, ...] | None = None) -> dict[str, str]:
    """An object of environment variables: every name one of ``names`` (when given), and a valid variable name
    (not empty, no ``=``, no NUL); every value a string the environment can hold."""
    d = obj(value, what)
    for k, v in d.items():
        if not k or "=" in k or not environment_string(k) or (names is not None and k not in names):
            raise BadPlan(f"{what}: {short(k, 40)} is not " + ("one of the variables affrun sets" if names is not None
                                                               else "an environment variable name"))
        string(v, f"{what}[{short(k, 40)}]")
    return dict(d)
