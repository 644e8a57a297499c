"""Parse and format Linux CPU lists (``0-7,64-71``) and hex CPU masks (``0000,00000033``).

Pure functions, standard library only: this module sits on the ``affrun exec`` fast path.
"""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse ``"0-3,8,10-11"`` (also ``"0-15:4"`` strides) into a set of CPU ids.

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
        stride = 1
        if ":" in part:
            part, stride_text = part.split(":", 1)
            stride = int(stride_text)
            if stride < 1:
                raise ValueError(f"bad stride in cpu list: {text!r}")
        if "-" in part:
            lo_text, hi_text = part.split("-", 1)
            lo, hi = int(lo_text), int(hi_text)
            if lo < 0 or hi < lo:
                raise ValueError(f"bad range {part!r} in cpu list {text!r}")
            out.update(range(lo, hi + 1, stride))
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
