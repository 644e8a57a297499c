"""The attributes of an hwloc XML object as affrun reads them: bitmaps (``cpuset``, ``nodeset``), integers, and the
one error a file that is not what hwloc writes raises. Standard library only; the rules: docs/design.md §6."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.base.cpulist import cpu_error, parse_hexmask
from launcher.base.untrusted import ascii_int, clip, short

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET


class BadXML(Exception):
    """Something in the file is not what hwloc writes (message says what)."""


def mask(element: ET.Element, name: str) -> frozenset[int] | None:
    """A cpuset/nodeset attribute; ``None`` when absent or infinite (hwloc writes ``0xf...f``)."""
    text = element.get(name)
    if text is None or "..." in text:
        return None
    try:
        return parse_hexmask(text)
    except ValueError as exc:
        kind = kind_of(element)
        raise BadXML(cpu_error(exc, f"{name}={short(text)} on a {kind} object is not a bitmap",
                             f"{name} on a {kind} object: {{}}")) from None


def int_attr(element: ET.Element, name: str) -> int | None:
    text = element.get(name)
    if text is None:
        return None
    value = ascii_int(text.strip())
    if value is None:
        raise BadXML(f"{name}={short(text, 40)} on a {kind_of(element)} object is not an integer")
    return value


def kind_of(element: ET.Element) -> str:
    return clip(element.get("type") or "?", 20)


def narrowing(element: ET.Element) -> frozenset[int] | None:
    """An object's cpuset as it narrows the objects below it; ``None`` when absent, infinite or unreadable (the
    reader of that object's own set says what is wrong with it)."""
    try:
        return mask(element, "cpuset")
    except BadXML:
        return None


