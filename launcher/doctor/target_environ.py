"""A live target's environment as ``affrun doctor --pid`` reads it, each value whose ranges span more than
:data:`SPAN_LIMIT` CPU ids replaced by a note, so that no parser expands it. docs/doctor.md ("Hostile targets")."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache

from launcher.base import procfs
from launcher.base.cpulist import MAX_COUNT

SPAN_LIMIT = 2 * MAX_COUNT
# A range "a-b" (CPU lists, GOMP_CPU_AFFINITY, proclists: b - a ids) or "a:b" (OMP_PLACES' interval of b ids, or a
# stride b), from the first digit of a number on: the look-behind keeps the scan linear in a long run of digits.
_RANGE = re.compile(r"(?<![0-9])([0-9]+)[ \t]*([-:])[ \t]*([0-9]+)")
_DIGITS = 6  # a number of more digits is past any CPU id: counted as a span of MAX_COUNT


def span(value: str) -> int:
    """The CPU ids the ranges of ``value`` span (each range counted up to :data:`MAX_COUNT`), stopping past
    :data:`SPAN_LIMIT`."""
    total = 0
    for match in _RANGE.finditer(value):
        a, mark, b = match.groups()
        if max(len(a), len(b)) > _DIGITS:
            total += MAX_COUNT
        else:
            total += min(abs(int(b) - int(a)) if mark == "-" else int(b), MAX_COUNT)
        if total > SPAN_LIMIT:
            break
    return total


def too_many_ids(value: str) -> str:
    """The note that stands for a value whose ranges span more than :data:`SPAN_LIMIT` CPU ids."""
    return f"(a value of {len(value):,} characters whose ranges span over {SPAN_LIMIT:,} CPU ids: not read)"


@lru_cache(maxsize=512)
def _too_many(value: str) -> bool:
    """Whether ``value`` spans more than :data:`SPAN_LIMIT` CPU ids; remembered, as a job's processes inherit the
    same environment."""
    return span(value) > SPAN_LIMIT


def screened(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with every value whose ranges span more than :data:`SPAN_LIMIT` CPU ids replaced by its note."""
    return {key: too_many_ids(value) if len(value) > 8 and _too_many(value) else value
            for key, value in environ.items()}


def read_target_environ(pid: int, proc: str = "/proc") -> dict[str, str]:
    """:func:`screened` :func:`launcher.base.procfs.environ` of ``pid``. Raises ``OSError`` as it does."""
    return screened(procfs.environ(pid, proc))
