"""OpenMP's affinity syntax, both ways: writing a rank's ``OMP_PLACES``, and reading the values users set
(``OMP_PLACES``, ``KMP_AFFINITY`` proclists, ``GOMP_CPU_AFFINITY``, thread counts) as the runtimes do. Pure.
The grammars: docs/runtimes.md, "The syntax affrun reads".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.base.choices import OmpBind
from launcher.base.cpulist import MAX_CPU_ID, CpuIdTooLarge, check_cpu_id
from launcher.base.untrusted import ascii_uint
from launcher.plan.planner import RankPlan
from launcher.plan.threads import working_cpus

if TYPE_CHECKING:
    from collections.abc import Sequence
ABSTRACT_PLACES = ("threads", "cores", "sockets", "ll_caches", "numa_domains")
PROC_BIND_VALUES = ("true", "false", "close", "spread", "primary", "master")
KMP_TYPES = ("compact", "scatter", "balanced", "explicit", "none", "disabled", "logical", "physical")
KMP_MODIFIERS = ("verbose", "noverbose", "warnings", "nowarnings", "respect", "norespect", "duplicates",
                 "noduplicates", "reset", "noreset")
# The most CPU ids an OMP_PLACES list may spell out in all places together: ``{0:65536}:65536`` is refused.
MAX_PLACE_IDS = 16 * (MAX_CPU_ID + 1)


def omp_places(rank: RankPlan, bind: OmpBind = "rank", smt: bool = False) -> str:
    """``OMP_PLACES`` in explicit OS CPU ids: first the main thread's place (the rank's working CPUs, or its main
    core), then the other threads' (``rank``: the compute set, ``{0,1,2,3,4},{0:4},...``; ``core``: one place per
    core or PU, ``{0,1,2,3},{1},{2},{3}``)."""
    if rank.main_cpus:
        return _main_core_places(rank, bind, smt)
    working = working_cpus(rank)
    whole = _explicit_place(working)
    if bind == "core":
        units = [(p,) for core in rank.compute_cores for p in core] if smt else list(rank.compute_cores)
        return ",".join([whole, *(_explicit_place(unit) for unit in units[1:])])
    if set(rank.compute_cpus) == set(working):
        return whole
    return ",".join([whole, *[_interval_place(rank.compute_cpus)] * (rank.threads - 1)])


def _main_core_places(rank: RankPlan, bind: OmpBind, smt: bool) -> str:
    """``OMP_PLACES`` of a rank with a main core: that core, then the team's places on the other compute cores."""
    main = set(rank.main_cpus)
    others = [core for core in rank.compute_cores if main.isdisjoint(core)]
    first = _explicit_place(sorted(main))
    if not others:
        return first
    if bind == "core":
        units = [(p,) for core in others for p in core] if smt else others
        return ",".join([first, *(_explicit_place(unit) for unit in units)])
    return ",".join([first, *[_interval_place([p for core in others for p in core])] * (rank.threads - 1)])


def _explicit_place(cpus: Sequence[int]) -> str:
    return "{" + ",".join(map(str, cpus)) + "}"


def _interval_place(cpus: Sequence[int]) -> str:
    """A place as OpenMP resource intervals (``{0:4,64:4}``): short enough to repeat once per thread."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][0] + runs[-1][1]:
            runs[-1][1] += 1
        else:
            runs.append([cpu, 1])
    return "{" + ",".join(f"{lo}:{n}" if n > 1 else str(lo) for lo, n in runs) + "}"


def parse_gomp_cpu_affinity(value: str) -> list[int] | None:
    """The CPUs of a ``GOMP_CPU_AFFINITY`` list (``0 2-5 8-15:2``) in the order libgomp binds threads to them;
    ``None`` if malformed."""
    out: list[int] = []
    for item in value.replace(",", " ").split():
        span, _, stride_text = item.partition(":")
        lo_text, dash, hi_text = span.partition("-")
        lo = ascii_uint(lo_text)
        hi = ascii_uint(hi_text) if dash else lo
        stride = ascii_uint(stride_text) if stride_text else 1
        if lo is None or hi is None or stride is None or hi < lo or stride < 1 or hi > MAX_CPU_ID:
            return None
        out.extend(range(lo, hi + 1, stride))
    return out or None


def thread_count(value: str | None) -> int | None:
    """A thread-count variable's value (``"8"``, or ``"8,4"`` for nested levels): the first level, if valid."""
    if value is None:
        return None
    first = ascii_uint(value.split(",")[0].strip())
    return first if first is not None and first >= 1 else None


def kmp_type(value: str) -> str | None:
    """The affinity type named in a ``KMP_AFFINITY`` value (``compact``, ``none``...), if any."""
    text = value.lower()
    if "proclist=" in text:
        start = text.index("proclist=")
        end = text.find("]", start)
        text = text[:start] + (text[end + 1 :] if end >= 0 else "")
    return next((t.strip() for t in text.split(",") if t.strip() in KMP_TYPES), None)


def parse_places(value: str) -> list[frozenset[int]] | None:
    """The places of an explicit ``OMP_PLACES`` list, in OS CPU ids; ``None`` when the runtimes reject it (or it
    names more than :data:`MAX_PLACE_IDS` ids, refused before anything is expanded)."""
    try:
        return place_list(Tokens(value))
    except ValueError:
        return None


def parse_proclist(value: str) -> list[frozenset[int]] | None:
    """The places of a ``KMP_AFFINITY`` ``proclist=[...]`` (the text inside the brackets); ``None`` if malformed."""
    try:
        return read_proclist(Tokens(value))
    except ValueError:
        return None


def read_proclist(tokens: Tokens) -> list[frozenset[int]]:
    places: list[frozenset[int]] = []
    while True:
        if tokens.take("{"):
            ids = {_cpu_id(tokens.number())}
            while tokens.take(","):
                ids.add(_cpu_id(tokens.number()))
            tokens.expect("}")
            places.append(frozenset(ids))
        else:
            lo = _cpu_id(tokens.number())
            if tokens.take("-"):
                hi = _cpu_id(tokens.number())
                stride = tokens.number(signed=True) if tokens.take(":") else 1
                if stride == 0 or (hi - lo) * stride < 0:
                    raise ValueError("empty range")
                places.extend(frozenset({c}) for c in range(lo, hi + (1 if stride > 0 else -1), stride))
            else:
                places.append(frozenset({lo}))
        if len(places) > MAX_PLACE_IDS:
            raise CpuIdTooLarge(f"more than {MAX_PLACE_IDS} CPU ids")
        if not tokens.take(","):
            break
    tokens.expect("")
    return places


class Tokens:
    """A cursor over a place list: single-character tokens and integers, with blanks allowed between them."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def peek(self) -> str:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def take(self, char: str) -> bool:
        if self.peek() == char:
            self.pos += 1
            return True
        return False

    def expect(self, char: str) -> None:
        """The next token is ``char`` (``""``: the end of the text)."""
        if self.peek() != char:
            raise ValueError(f"expected {char or 'the end'} at {self.pos}")
        self.pos += len(char)

    def number(self, *, signed: bool = False) -> int:
        self.peek()
        start = self.pos
        if self.pos < len(self.text) and self.text[self.pos] in ("+-" if signed else "+"):
            self.pos += 1
        digits = self.pos
        while self.pos < len(self.text) and "0" <= self.text[self.pos] <= "9":
            self.pos += 1
        if self.pos == digits:
            raise ValueError(f"expected a number at {start}")
        return int(self.text[start : self.pos])

    def interval(self) -> tuple[int, int]:
        """An optional ``:len[:stride]``; ``(1, 1)`` when absent."""
        if not self.take(":"):
            return 1, 1
        length = self.number()
        stride = self.number(signed=True) if self.take(":") else 1
        if length < 1:
            raise ValueError("an interval of no element")
        if length > MAX_CPU_ID + 1:
            raise CpuIdTooLarge(f"an interval of {length} is longer than the {MAX_CPU_ID + 1} CPU ids affrun accepts")
        return length, stride


def place_list(tokens: Tokens) -> list[frozenset[int]]:
    places: list[frozenset[int]] = []
    total = 0
    while True:
        if tokens.take("!"):
            places.remove(_place(tokens))  # ValueError when that place is not listed (libgomp rejects it too)
        else:
            place = _place(tokens)
            length, stride = tokens.interval()
            total += len(place) * length
            if total > MAX_PLACE_IDS:
                raise CpuIdTooLarge(f"the places name more than {MAX_PLACE_IDS} CPU ids in all")
            _shifted(frozenset({min(place), max(place)}), (length - 1) * stride)  # the extremes, before expanding
            places.extend(_shifted(place, i * stride) for i in range(length))
        if not tokens.take(","):
            break
    tokens.expect("")
    return places


def _place(tokens: Tokens) -> frozenset[int]:
    """``{resources}`` or one CPU id."""
    if not tokens.take("{"):
        return frozenset({_cpu_id(tokens.number())})
    ids: set[int] = set()
    while True:
        if tokens.take("!"):
            cpu = tokens.number()
            if cpu not in ids:
                raise ValueError(f"excluded CPU {cpu} is not in the place")
            ids.discard(cpu)
        else:
            first = _cpu_id(tokens.number())
            length, stride = tokens.interval()
            _cpu_id(first + (length - 1) * stride)  # the last one, before expanding
            ids.update(_cpu_id(first + i * stride) for i in range(length))
        if not tokens.take(","):
            break
    tokens.expect("}")
    if not ids:
        raise ValueError("an empty place")
    return frozenset(ids)


def _shifted(place: frozenset[int], offset: int) -> frozenset[int]:
    return frozenset(_cpu_id(p + offset) for p in place)


def _cpu_id(cpu: int) -> int:
    if cpu < 0:
        raise ValueError("a negative CPU id")  # libgomp: "Logical CPU number 0+-1 out of range"
    return check_cpu_id(cpu)
