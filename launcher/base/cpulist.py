"""Parse and format Linux CPU lists (``0-7,64-71``) and hex CPU masks (``0000,00000033``), and bound CPU and NUMA
node ids. Pure, standard library only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.base.untrusted import ascii_hex, ascii_uint

if TYPE_CHECKING:
    from collections.abc import Iterable

# The largest CPU id, CPU count and NUMA node id affrun accepts from any source (why: docs/design.md §6).
MAX_CPU_ID = (1 << 16) - 1
MAX_COUNT = MAX_CPU_ID + 1
MAX_NODE_ID = (1 << 10) - 1


class CpuIdTooLarge(ValueError):
    """A CPU id above :data:`MAX_CPU_ID`. The message names the id; callers prefix the option or file."""


def cpu_error(exc: ValueError, malformed: str, too_large: str = "{}") -> str:
    """The one message for a parse of CPU ids that raised ``exc``: ``too_large`` with :class:`CpuIdTooLarge`'s own
    message in its ``{}`` (it names the id), else ``malformed``, the caller's word for text of the wrong form.
    Callers catch ``ValueError`` once."""
    return too_large.replace("{}", str(exc)) if isinstance(exc, CpuIdTooLarge) else malformed


def check_cpu_id(cpu: int) -> int:
    """``cpu`` if it is at most :data:`MAX_CPU_ID`, else :class:`CpuIdTooLarge`."""
    if cpu > MAX_CPU_ID:
        raise CpuIdTooLarge(f"cpu id {id_text(cpu)} is above {MAX_CPU_ID}, the largest affrun accepts")
    return cpu


def id_problem(value: int, kind: str = "cpu") -> str | None:
    """Why ``value`` is not a valid CPU id (``kind="cpu"``) or NUMA node id (``"node"``); ``None`` when it is."""
    limit = MAX_CPU_ID if kind == "cpu" else MAX_NODE_ID
    if value < 0:
        return f"{kind} id {id_text(value)} is negative"
    if value > limit:
        return f"{kind} id {id_text(value)} is above {limit}, the largest affrun accepts"
    return None


def id_text(value: int) -> str:
    """An id for a message: the number itself, or its length when it is absurdly long."""
    return str(value) if value.bit_length() < 128 else f"of {len(str(abs(value)))} digits"


def _uint(text: str, whole: str) -> int:
    """A number of a cpu list: ASCII digits only (``int()`` would take ``'١'``, ``'1_0'`` and ``'+1'``)."""
    value = ascii_uint(text.strip())
    if value is None:
        raise ValueError(f"{text[:20]!r} is not a number in cpu list {whole[:60]!r}")
    return value


def parse_cpulist(text: str) -> frozenset[int]:
    """``"0-3,8,10-11"`` (and the kernel's groups, ``"0-1023:2/256"``; a trailing ``\\n\\0`` ignored) as CPU ids;
    ``""`` is none. ``ValueError`` on anything else, :class:`CpuIdTooLarge` above :data:`MAX_CPU_ID`."""
    text = text.replace("\0", "").strip()
    if not text:
        return frozenset()
    # a bit mask: one big-integer operation per part, however many CPUs it names
    out = 0
    for part in dict.fromkeys(p.strip() for p in text.split(",")):
        if not part:
            continue
        used = group = 0
        if ":" in part:
            part, groups_text = part.split(":", 1)
            used_text, slash, group_text = groups_text.partition("/")
            if not slash or "-" not in part:
                raise ValueError(f"bad group in cpu list {text[:60]!r} (expected e.g. 0-15:2/4)")
            used, group = _uint(used_text, text), _uint(group_text, text)
            if used < 1 or group < 1 or used > group:
                raise ValueError(f"bad group {groups_text[:20]!r} in cpu list {text[:60]!r}")
        if "-" in part:
            lo_text, hi_text = part.split("-", 1)
            lo, hi = _uint(lo_text, text), _uint(hi_text, text)
            if hi < lo:
                raise ValueError(f"bad range {part[:40]!r} in cpu list {text[:60]!r}")
            check_cpu_id(hi)
            width = hi - lo + 1
            if group:  # CPU lo + i when i % group < used: ``used`` ones repeated every ``group`` bits
                groups = -(-width // group)
                pattern = ((1 << used) - 1) * (((1 << (group * groups)) - 1) // ((1 << group) - 1))
                out |= (pattern & ((1 << width) - 1)) << lo
            else:
                out |= ((1 << width) - 1) << lo
        else:
            out |= 1 << check_cpu_id(_uint(part, text))
    return mask_ids(out)


def mask_ids(mask: int) -> frozenset[int]:
    """The ids of the set bits of ``mask`` (bit i: CPU i), one step per run of set bits."""
    bits = bin(mask)[:1:-1]  # bit i at index i
    ids: list[int] = []
    start = bits.find("1")
    while start >= 0:
        end = bits.find("0", start)
        end = len(bits) if end < 0 else end
        ids.extend(range(start, end))
        start = bits.find("1", end)
    return frozenset(ids)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format CPU ids as the shortest range list: ``{0,1,2,3,8}`` -> ``"0-3,8"``."""
    ids = sorted(set(cpus))
    if not ids:
        return ""
    parts: list[str] = []
    start = prev = ids[0]
    for cpu in ids[1:]:
        if cpu == prev + 1:
            prev = cpu
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def parse_hexmask(text: str) -> frozenset[int]:
    """A sysfs cpumask (``00000fff,ffffffff``) or hwloc's (``0xffffffff,0x00000fff``): 32-bit words, most significant
    first. ``ValueError`` on anything else, :class:`CpuIdTooLarge` for a set bit above :data:`MAX_CPU_ID`."""
    text = text.replace("\0", "").strip()
    if not text:
        return frozenset()
    words = []
    # a word may hold any number of digits (hwloc writes 0x8000...0 for CPU 127)
    for word in text.split(","):
        word = word.strip()
        number = ascii_hex(word, len(word)) if word not in ("", "0x", "0X") else 0
        if number is None:
            raise ValueError(f"{word[:20]!r} is not a hex word of a cpu mask")
        words.append(number)
    # The highest set bit, checked before any shifting (leading zero words are fine: NR_CPUS-wide masks).
    last = len(words) - 1
    top = max(((last - i) * 32 + number.bit_length() - 1 for i, number in enumerate(words) if number), default=-1)
    check_cpu_id(top)
    value = 0
    for number in words:
        value = (value << 32) | number
    return mask_ids(value)


def format_hexmask(cpus: Iterable[int]) -> str:
    """Format CPU ids as a ``0x``-prefixed hex mask (the form ``srun --cpu-bind=mask_cpu`` takes)."""
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    return hex(value)
