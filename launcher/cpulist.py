"""Parse and format Linux CPU lists (``0-7,64-71``) and hex CPU masks (``0000,00000033``).

Pure functions, standard library only: this module sits on the ``affrun exec`` fast path.
"""

from __future__ import annotations

from collections.abc import Iterable

# The largest CPU id accepted anywhere a CPU list, mask or OpenMP place is parsed. Linux's NR_CPUS is at most
# 8192 (x86_64 MAXSMP, powerpc, arm64 4096), so 65535 leaves room while keeping a typo such as ``0-99999999``
# from building a set of 100 million ids (minutes of CPU and gigabytes of memory) before anything can fail.
MAX_CPU_ID = (1 << 16) - 1


class CpuIdTooLarge(ValueError):
    """A CPU id above :data:`MAX_CPU_ID`. The message names the id; callers prefix the option or file."""


def check_cpu_id(cpu: int) -> int:
    """``cpu`` if it is at most :data:`MAX_CPU_ID`, else :class:`CpuIdTooLarge`."""
    if cpu > MAX_CPU_ID:
        raise CpuIdTooLarge(f"cpu id {cpu} is above {MAX_CPU_ID}, the largest affrun accepts")
    return cpu


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse ``"0-3,8,10-11"`` into a set of CPU ids, with the kernel's group syntax ``"0-1023:2/256"``
    (in each group of 256 CPUs from 0 to 1023, the first 2).

    Tolerates the trailing ``\\n\\0`` that some sysfs files carry. An empty string is the empty set.
    Raises ``ValueError`` on anything else, and :class:`CpuIdTooLarge` for an id above :data:`MAX_CPU_ID`.
    """
    text = text.replace("\0", "").strip()
    out: set[int] = set()
    if not text:
        return frozenset()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        used = group = 0
        if ":" in part:
            part, groups_text = part.split(":", 1)
            used_text, slash, group_text = groups_text.partition("/")
            if not slash or "-" not in part:
                raise ValueError(f"bad group in cpu list {text!r} (expected e.g. 0-15:2/4)")
            used, group = int(used_text), int(group_text)
            if used < 1 or group < 1 or used > group:
                raise ValueError(f"bad group {groups_text!r} in cpu list {text!r}")
        if "-" in part:
            lo_text, hi_text = part.split("-", 1)
            lo, hi = int(lo_text), int(hi_text)
            if lo < 0 or hi < lo:
                raise ValueError(f"bad range {part!r} in cpu list {text!r}")
            check_cpu_id(hi)
            if group:
                out.update(c for c in range(lo, hi + 1) if (c - lo) % group < used)
            else:
                out.update(range(lo, hi + 1))
        else:
            value = int(part)
            if value < 0:
                raise ValueError(f"negative cpu id in {text!r}")
            out.add(check_cpu_id(value))
    return frozenset(out)


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
    """Parse a sysfs cpumask (``"0000,00000033"``, most significant word first) or hwloc's ``0x...``.

    hwloc XML writes ``0xffffffff,0x00000fff``; sysfs writes ``00000fff,ffffffff``. Both are comma-separated
    32-bit words, most significant first. A set bit above :data:`MAX_CPU_ID` raises :class:`CpuIdTooLarge`.
    """
    text = text.replace("\0", "").strip()
    if not text:
        return frozenset()
    words = []
    for word in text.split(","):
        word = word.strip()
        if word.lower().startswith("0x"):
            word = word[2:]
        words.append(int(word or "0", 16))
    # The highest set bit, checked before any shifting (leading zero words are fine: NR_CPUS-wide masks).
    last = len(words) - 1
    top = max(((last - i) * 32 + number.bit_length() - 1 for i, number in enumerate(words) if number), default=-1)
    check_cpu_id(top)
    value = 0
    for number in words:
        value = (value << 32) | number
    bits = bin(value)[:1:-1]  # least significant bit first
    return frozenset(i for i, bit in enumerate(bits) if bit == "1")


def format_hexmask(cpus: Iterable[int]) -> str:
    """Format CPU ids as a ``0x``-prefixed hex mask (the form ``srun --cpu-bind=mask_cpu`` takes)."""
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    return hex(value)
