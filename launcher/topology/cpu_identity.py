"""The CPU's identity (vendor, model name, family, model, stepping, binding flags) of the machine a topology
describes: read from ``proc/cpuinfo`` under the fsroot, from an hwloc XML export's ``CPU*`` info attributes, or
(the live machine without a usable ``/proc/cpuinfo``) from py-cpuinfo. Off the rank path (docs/design.md §6)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from launcher.base.records import BadRecord, from_dict, to_dict
from launcher.base.untrusted import ascii_hex, ascii_uint, clip, short
from launcher.topology.cpuinfo_file import field_text, parse_entry, read_cpuinfo

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET
    from collections.abc import Mapping

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
        return to_dict(self)

    def line(self) -> str:
        """One line for people: ``GenuineIntel 13th Gen Intel(R) Core(TM) i7-1370P (family 6 model 186 ...)``."""
        numbers = " ".join(f"{k} {v}" for k, v in (("family", self.family), ("model", self.model),
                                                    ("stepping", self.stepping)) if v is not None)
        flags = "flags ?" if self.flags is None else f"flags {' '.join(self.flags) or '(none of ' + ', '.join(BINDING_FLAGS) + ')'}"
        name = " ".join(s for s in (self.vendor, self.model_name) if s) or "unknown CPU"
        return f"{name} ({', '.join(s for s in (numbers, flags) if s)})"


def _text(value: str | None, name: str, problems: list[str]) -> str | None:
    """``value`` as :func:`field_text` keeps it; what it refuses is said in ``problems``, the value escaped."""
    text, why = field_text(value)
    if why:
        problems.append(f"{name} {short(value, 40)} ignored: {why}")
    return text


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


def _first_text(fields: Mapping[str, str], problems: list[str], *keys: str) -> str | None:
    """The value of the first of ``keys`` that ``fields`` has, as :func:`_text` keeps it."""
    key = next((k for k in keys if fields.get(k)), keys[0])
    return _text(fields.get(key), key, problems)


def identity_from_fields(fields: Mapping[str, str]) -> tuple[CpuIdentity | None, list[str]]:
    """The identity in the fields of ``/proc/cpuinfo``'s first entry (x86, Arm, POWER; keys of any case), and
    each value refused, said; ``None`` when nothing in it is recognised."""
    lower: dict[str, str] = {}
    for key, value in fields.items():
        lower.setdefault(key.lower(), value)
    problems: list[str] = []
    vendor = _first_text(lower, problems, "vendor_id", "cpu implementer")
    name = _first_text(lower, problems, "model name", "cpu")
    family = _number(lower.get("cpu family"))
    model = _number(lower.get("model") if "model" in lower else lower.get("cpu part"))
    stepping = _number(lower.get("stepping") if "stepping" in lower else lower.get("cpu revision"))
    flags = _binding_flags(lower.get("flags") if "flags" in lower else lower.get("features"))
    if vendor is None and name is None and family is None and model is None:
        return None, problems
    return CpuIdentity(vendor, name, family, model, stepping, flags, "proc/cpuinfo"), problems


def parse_cpuinfo(text: str) -> CpuIdentity | None:
    """The first processor's identity in ``/proc/cpuinfo`` text; ``None`` when nothing in it is recognised."""
    return identity_from_fields(parse_entry(text.split("\n\n", 1)[0]))[0]


def read_cpu_identity(fsroot: str) -> tuple[CpuIdentity | None, str | None]:
    """``proc/cpuinfo`` under ``fsroot`` (:func:`launcher.topology.cpuinfo_file.read_cpuinfo`): the identity, and
    a warning when the file is there but unreadable as one, or a value in it was refused. No file, no warning (an
    fsroot of sysfs alone)."""
    info = read_cpuinfo(fsroot)
    path = clip(info.path, 120)
    if not info.present:
        return None, f"CPU identity not read: {path}: {info.problem}" if info.problem else None
    found, problems = identity_from_fields(info.fields)
    if info.problem:
        problems.insert(0, info.problem)
    if found is None:
        problems.insert(0, "no CPU identity in it (no vendor_id, model name or family)")
    return found, f"{path}: {'; '.join(problems)}" if problems else None


def identity_from_hwloc_info(info: dict[str, str], problems: list[str] | None = None) -> CpuIdentity | None:
    """From hwloc's ``CPUVendor``, ``CPUModel``, ``CPUFamilyNumber``, ``CPUModelNumber``, ``CPUStepping`` (x86)
    or ``CPUImplementer``, ``CPUPart``, ``CPURevision`` (Arm) info attributes; hwloc records no flags. A value
    refused is said in ``problems``."""
    said = [] if problems is None else problems
    vendor = _first_text(info, said, "CPUVendor", "CPUImplementer")
    name = _text(info.get("CPUModel"), "CPUModel", said)
    family = _number(info.get("CPUFamilyNumber"))
    model = _number(info.get("CPUModelNumber") or info.get("CPUPart"))
    stepping = _number(info.get("CPUStepping") or info.get("CPURevision"))
    if vendor is None and name is None and family is None and model is None:
        return None
    return CpuIdentity(vendor, name, family, model, stepping, None, "hwloc-xml")


def identity_from_json(value: Any) -> tuple[CpuIdentity | None, str | None]:
    """A snapshot's ``cpu`` (``to_dict`` of :class:`CpuIdentity`) back; a warning (and no identity) when it is
    malformed."""
    if value is None:
        return None, None
    try:
        found = from_dict(CpuIdentity, {**dict.fromkeys(("vendor", "model_name", "family", "model", "stepping", "flags")),
                                        **value, "source": value.get("source") if value.get("source") in SOURCES
                                        else "snapshot"}, "cpu")
    except (BadRecord, TypeError, AttributeError):  # not an object
        found = None
    if found is None or any(t is not None and field_text(t)[0] != t for t in (found.vendor, found.model_name)) or any(
            n is not None and n < 0 for n in (found.family, found.model, found.stepping)) or not set(
            found.flags or ()) <= set(BINDING_FLAGS):
        return None, "snapshot: cpu is not an object of vendor, model_name, family, model, stepping, flags; ignored"
    return replace(found, flags=None if found.flags is None else tuple(f for f in BINDING_FLAGS if f in found.flags)), None


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
    ignored: list[str] = []
    return CpuIdentity(_text(info.get("vendor_id_raw"), "vendor", ignored),
                       _text(info.get("brand_raw"), "brand", ignored), family, model, stepping,
                       _binding_flags(" ".join(map(str, flags))) if isinstance(flags, list) else None, "py-cpuinfo")


def identify(fsroot: str, document: ET.Element | dict[str, Any] | None = None, path: str = ""
             ) -> tuple[CpuIdentity | None, str | None]:
    """The identity of the machine a topology describes: its ``--topology`` file's ``document`` as parsed (an hwloc
    XML root's first ``CPU*`` info attributes, a snapshot's ``cpu``), else ``proc/cpuinfo`` under ``fsroot``
    (``/`` for this machine); and a warning for any problem."""
    if document is None:
        return read_cpu_identity(fsroot)
    if isinstance(document, dict):
        return identity_from_json(document.get("cpu"))
    for obj in document.iter("object"):
        info = {i.get("name", ""): i.get("value", "") for i in obj.findall("info")}
        if any(k.startswith("CPU") and k != "CPUType" for k in info):
            problems: list[str] = []
            found = identity_from_hwloc_info(info, problems)
            return found, f"{clip(path, 120)}: {'; '.join(problems)}" if problems else None
    return None, None
