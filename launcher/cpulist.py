"""Parse and format Linux CPU lists (``0-7,64-71``) and hex CPU masks (``0000,00000033``).

Pure functions, standard library only: this module sits on the ``affrun exec`` fast path.
"""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse ``"0-3,8,10-11"`` into a set of CPU ids, with the kernel's group syntax ``"0-1023:2/256"``
    (in each group of 256 CPUs from 0 to 1023, the first 2).

    Tolerates the trailing ``\\n\\0`` that some sysfs files carry. An empty string is the empty set.
    Raises ``ValueError`` on anything else.
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
            if group:
                out.update(c for c in range(lo, hi + 1) if (c - lo) % group < used)
            else:
                out.update(range(lo, hi + 1))
        else:
            value = int(part)
            if value < 0:
                raise ValueError(f"negative cpu id in {text!r}")
            out.add(value)
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
    32-bit words, most significant first.
    """
    text = text.replace("\0", "").strip()
    if not text:
        return frozenset()
    words = [w.strip() for w in text.split(",")]
    value = 0
    for word in words:
        if word.lower().startswith("0x"):
            word = word[2:]
        if not word:
            word = "0"
        value = (value << 32) | int(word, 16)
    out: set[int] = set()
    bit = 0
    while value:
        if value & 1:
            out.add(bit)
        value >>= 1
        bit += 1
    return frozenset(out)


def format_hexmask(cpus: Iterable[int]) -> str:
    """Format CPU ids as a ``0x``-prefixed hex mask (the form ``srun --cpu-bind=mask_cpu`` takes)."""
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    return hex(value)
