"""What a NIC's name may be: read as it is when it is a name at all; given to a rank only when it is a plain word.

Every NIC source (sysfs, hwloc XML, a snapshot) reads a name exactly: a sysfs name that is not UTF-8 as
``os.listdir`` gives it (its odd bytes as surrogate escapes), one with spaces or escape sequences as it is. Text
output shows it escaped, JSON exact, and the plan measures the distance to it like any NIC. A rank is given it
(``AFFRUN_NIC``, ``UCX_NET_DEVICES``) only when its device string reads back as itself in UCX's device-list syntax
(:func:`device_problem`); otherwise the rank gets no NIC, with a warning. Why: docs/nics.md. Stdlib only.
"""

from __future__ import annotations

MAX_NAME = 255  # NAME_MAX: the longest name a sysfs entry can have; longer ones come from XML or JSON only
MAX_DEVICE = 31  # UCX keeps a device string (mlx5_0:1) in 32 bytes with its NUL (UCT_DEVICE_NAME_MAX)
PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def name_problem(name: str) -> str | None:
    """Why ``name`` is no device name at all (empty, longer than :data:`MAX_NAME`, or holding ``/`` or NUL, which
    no file name can hold), else ``None``. Anything else is a name, read as it is."""
    if not name:
        return "an empty name"
    if len(name) > MAX_NAME:
        return f"a name of {len(name)} characters, more than {MAX_NAME}"
    if "/" in name or "\0" in name:
        return "a name with '/' or NUL, which no device name can hold"
    return None


def device_problem(name: str, port: int | None) -> str | None:
    """Why the device string of NIC ``name`` (``name:port`` for an RDMA port, ``name`` for an interface) cannot be
    handed to a rank, else ``None``: a character other than ASCII letters, digits, ``_``, ``.`` and ``-`` (UCX reads
    ``,`` as a list separator, ``^`` as negation, ``[0-3]`` as a range, ``:`` as the port; a space, newline or
    escape sequence breaks the rank line and the environment), more than :data:`MAX_DEVICE` characters (UCX cuts
    it, and the cut name names no device), or ``all`` (UCX reads it as every device)."""
    device = name if port is None else f"{name}:{port}"
    if not name:
        return "an empty name"
    odd = next((c for c in name if c not in PLAIN), None)
    if odd is not None:
        return f"{odd!r} is not a letter, digit, '_', '.' or '-'"
    if len(device) > MAX_DEVICE:
        return f"{len(device)} characters, more than UCX's {MAX_DEVICE}"
    if name == "all":
        return "UCX reads 'all' as every device"
    return None
