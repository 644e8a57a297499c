"""The CPU's identity (vendor, model name, family, model, stepping, binding flags) of the machine a topology
describes: read from ``proc/cpuinfo`` under the fsroot, from an hwloc XML export's ``CPU*`` info attributes, or
(the live machine without a usable ``/proc/cpuinfo``) from py-cpuinfo. Off the rank path (docs/design.md §6)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from launcher.base.untrusted import BadJSON, ascii_hex, ascii_uint, clip, load_json, unwritable
from launcher.errors import AffrunError
from launcher.topology._files import read_document, read_text

# The flags that matter to binding (kernel spellings): a hybrid CPU has core kinds; AVX-512 and AMX units are
# per core, so their throughput scales with whole cores, and AMX tiles are per-thread state.
BINDING_FLAGS = ("hybrid_cpu", "avx512f", "amx_tile", "amx_bf16", "amx_int8")
IdentitySource = Literal["proc/cpuinfo", "hwloc-xml", "py-cpuinfo", "snapshot"]
SOURCES: tuple[IdentitySource, ...] = ("proc/cpuinfo", "hwloc-xml", "py-cpuinfo", "snapshot")


@dataclass(frozen=True)
class CpuIdentity:
    vendor: str | None  # vendor_id (GenuineIntel, AuthenticAMD) or an Arm "CPU implementer" (0x41)
    model_name: str | None  # "model name" (x86), "cpu" (POWER); None on Arm, whose /proc/cpuinfo has none
    family: int | None
    model: int | None  # x86 "model"; Arm "CPU part"
    stepping: int | None  # x86 "stepping"; Arm "CPU revision"
    flags: tuple[str, ...] | None  # those of BINDING_FLAGS the CPU has; None when the source lists no flags
    source: IdentitySource

    def to_json(self) -> dict[str, Any]:
        return {"vendor": self.vendor, "model_name": self.model_name, "family": self.family, "model": self.model,
                "stepping": self.stepping, "flags": None if self.flags is None else list(self.flags),
                "source": self.source}

    def line(self) -> str:
        """One line for people: ``GenuineIntel 13th Gen Intel(R) Core(TM) i7-1370P (family 6 model 186 ...)``."""
        numbers = " ".join(f"{k} {v}" for k, v in (("family", self.family), ("model", self.model),
                                                    ("stepping", self.stepping)) if v is not None)
        flags = "flags ?" if self.flags is None else f"flags {' '.join(self.flags) or '(none of ' + ', '.join(BINDING_FLAGS) + ')'}"
        name = " ".join(s for s in (self.vendor, self.model_name) if s) or "unknown CPU"
        return f"{name} ({', '.join(s for s in (numbers, flags) if s)})"


def _text(value: str | None) -> str | None:
    if value is None:
        return None
    value = " ".join(value.split())
    return clip(value, 100) if value and unwritable(value) is None else None


def _number(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip()
    return ascii_hex(value[2:]) if value.lower().startswith("0x") else ascii_uint(value)


def _binding_flags(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    have = set(value.split())
    return tuple(f for f in BINDING_FLAGS if f in have)


def parse_cpuinfo(text: str) -> CpuIdentity | None:
    """The first processor's identity in ``/proc/cpuinfo`` text (x86, Arm, POWER); ``None`` when nothing in it
    is recognised."""
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines()[:200]:
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    vendor = _text(fields.get("vendor_id") or fields.get("cpu implementer"))
    name = _text(fields.get("model name") or fields.get("cpu"))
    family = _number(fields.get("cpu family"))
    model = _number(fields.get("model") if "model" in fields else fields.get("cpu part"))
    stepping = _number(fields.get("stepping") if "stepping" in fields else fields.get("cpu revision"))
    flags = _binding_flags(fields.get("flags") if "flags" in fields else fields.get("features"))
    if vendor is None and name is None and family is None and model is None:
        return None
    return CpuIdentity(vendor, name, family, model, stepping, flags, "proc/cpuinfo")


def read_cpu_identity(fsroot: str) -> tuple[CpuIdentity | None, str | None]:
    """``proc/cpuinfo`` under ``fsroot``: the identity, and a warning when the file is there but unreadable as
    one. No file, no warning (an fsroot of sysfs alone)."""
    path = os.path.join(fsroot, "proc/cpuinfo")
    try:
        text = read_text(path)
    except AffrunError as exc:  # too large, or not a regular file: the identity is a nicety, never fatal
        return None, f"CPU identity not read: {exc}"
    if text is None:
        return None, None
    found = parse_cpuinfo(text)
    return found, None if found else f"{clip(path, 120)}: no CPU identity in it (no vendor_id, model name or family)"


def identity_from_hwloc_info(info: dict[str, str]) -> CpuIdentity | None:
    """From hwloc's ``CPUVendor``, ``CPUModel``, ``CPUFamilyNumber``, ``CPUModelNumber``, ``CPUStepping`` (x86)
    or ``CPUImplementer``, ``CPUPart``, ``CPURevision`` (Arm) info attributes; hwloc records no flags."""
    vendor = _text(info.get("CPUVendor") or info.get("CPUImplementer"))
    name = _text(info.get("CPUModel"))
    family = _number(info.get("CPUFamilyNumber"))
    model = _number(info.get("CPUModelNumber") or info.get("CPUPart"))
    stepping = _number(info.get("CPUStepping") or info.get("CPURevision"))
    if vendor is None and name is None and family is None and model is None:
        return None
    return CpuIdentity(vendor, name, family, model, stepping, None, "hwloc-xml")


def identity_from_json(value: Any) -> tuple[CpuIdentity | None, str | None]:
    """A snapshot's ``cpu`` object back into the model; a warning (and no identity) when it is malformed."""
    if value is None:
        return None, None
    try:
        if not isinstance(value, dict):
            raise TypeError
        texts = [value.get(k) for k in ("vendor", "model_name")]
        numbers = [value.get(k) for k in ("family", "model", "stepping")]
        flags = value.get("flags")
        if any(t is not None and (not isinstance(t, str) or _text(t) != t) for t in texts) or any(
                n is not None and (type(n) is not int or n < 0) for n in numbers):
            raise TypeError
        if flags is not None and not (isinstance(flags, list) and all(f in BINDING_FLAGS for f in flags)):
            raise TypeError
        source = value.get("source")
        return CpuIdentity(texts[0], texts[1], numbers[0], numbers[1], numbers[2],
                           None if flags is None else tuple(f for f in BINDING_FLAGS if f in flags),
                           source if source in SOURCES else "snapshot"), None
    except TypeError:
        return None, "snapshot: cpu is not an object of vendor, model_name, family, model, stepping, flags; ignored"


def live_identity_from_py_cpuinfo() -> CpuIdentity | None:
    """py-cpuinfo's ``get_cpu_info()`` (CPUID on x86, else its own probes): about 1 s, as it times the clock in a
    child process. For the live machine only, where ``/proc/cpuinfo`` said nothing (docs/design.md §6)."""
    try:
        import cpuinfo

        info = cpuinfo.get_cpu_info()
    except Exception:  # py-cpuinfo fails in odd ways (no /proc, no multiprocessing): the identity is a nicety
        return None
    flags = info.get("flags")
    family, model, stepping = (n if type(n) is int else None for n in (info.get(k) for k in ("family", "model", "stepping")))
    return CpuIdentity(_text(info.get("vendor_id_raw")), _text(info.get("brand_raw")), family, model, stepping,
                       _binding_flags(" ".join(map(str, flags))) if isinstance(flags, list) else None, "py-cpuinfo")


def _from_file(path: str) -> tuple[CpuIdentity | None, str | None]:
    """A ``--topology`` file's identity: hwloc XML's first ``CPU*`` info attributes, or a snapshot's ``cpu``."""
    try:
        data = read_document(path, "a topology file")
    except AffrunError as exc:
        return None, f"CPU identity not read: {exc}"
    if data[:64].lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"<"):
        import xml.etree.ElementTree as ET

        try:
            root = ET.fromstring(data)
        except ET.ParseError:
            return None, None  # the topology reader has refused or warned about it already
        for obj in root.iter("object"):
            info = {i.get("name", ""): i.get("value", "") for i in obj.findall("info")}
            if any(k.startswith("CPU") and k != "CPUType" for k in info):
                return identity_from_hwloc_info(info), None
        return None, None
    try:
        document = load_json(data)
    except BadJSON:
        return None, None
    return identity_from_json(document.get("cpu")) if isinstance(document, dict) else (None, None)


def identify(fsroot: str, topology_file: str | None) -> tuple[CpuIdentity | None, str | None]:
    """The identity of the machine a topology describes: the ``--topology`` file's, else ``proc/cpuinfo`` under
    ``fsroot`` (``/`` for this machine); and a warning for any problem."""
    return _from_file(topology_file) if topology_file else read_cpu_identity(fsroot)
