"""Apply a NUMA memory policy to this process before it execs the rank: ``set_mempolicy(2)`` (it survives
``execve``), or numactl, falling back membind/interleave -> preferred -> none where the kernel refuses. Why:
docs/design.md §7.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# The kernel's MPOL_* mode numbers (linux/mempolicy.h).
MPOL_NUMBERS = {"default": 0, "preferred": 1, "membind": 2, "interleave": 3}
# set_mempolicy syscall numbers by machine
SYSCALLS = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "ppc64": 261, "s390x": 270, "riscv64": 237}
FALLBACK = {"membind": "preferred", "interleave": "preferred", "preferred": "none"}
ONLINE_NODES = "/sys/devices/system/node/online"


def missing_nodes(nodes: tuple[int, ...], online_file: str = ONLINE_NODES) -> tuple[int, ...]:
    """The nodes of ``nodes`` that this machine does not have (not in ``online_file``); ``()`` when it cannot
    tell (no such file: a kernel without NUMA)."""
    from launcher.base.cpulist import parse_cpulist

    try:
        with open(online_file, encoding="ascii") as fh:
            online = parse_cpulist(fh.read().strip())
    except (OSError, ValueError):
        return ()
    return tuple(n for n in nodes if n not in online)


@dataclass
class MemResult:
    """The memory policy in effect after :func:`apply_mempolicy`."""

    policy: str  # what is in effect: membind | preferred | interleave | none
    nodes: tuple[int, ...]
    wrapper: list[str]  # argv prefix to exec through (numactl), or []
    warnings: tuple[str, ...]


def set_mempolicy(policy: str, nodes: tuple[int, ...]) -> int:
    """Call set_mempolicy(2); return 0 or the errno."""
    import ctypes

    number = SYSCALLS.get(os.uname().machine)
    if number is None:
        return -1
    libc = ctypes.CDLL(None, use_errno=True)
    width = 64
    words = (max(nodes) // width + 1) if nodes else 1
    mask = (ctypes.c_ulong * words)()
    for n in nodes:
        mask[n // width] |= 1 << (n % width)
    maxnode = words * width + 1
    if policy == "default":
        rc = libc.syscall(number, 0, None, 0)
    else:
        rc = libc.syscall(number, MPOL_NUMBERS[policy], mask, ctypes.c_ulong(maxnode))
    return 0 if rc == 0 else ctypes.get_errno()


def _numactl_works(numactl: str, policy: str, nodes: tuple[int, ...]) -> bool:
    import subprocess  # only here: the exec path does not pay for it

    args = _numactl_args(numactl, policy, nodes)
    try:
        return subprocess.run([*args, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _numactl_args(numactl: str, policy: str, nodes: tuple[int, ...]) -> list[str]:
    from launcher.env.policy import numactl_memory_args

    return [numactl, *numactl_memory_args(policy, nodes), "--"]


def apply_mempolicy(policy: str, nodes: tuple[int, ...], backend: str = "auto") -> MemResult:
    """Apply ``policy`` on ``nodes`` to this process, for the program it execs next. ``backend``: ``auto`` (the
    system call; numactl only where this machine has no known call number), ``syscall``, or ``numactl`` (always;
    :class:`LaunchError` when not installed). A refused policy falls back to a weaker one, with a warning."""
    if policy == "none" or not nodes:
        return MemResult("none", (), [], ())
    import shutil  # not at the top: with no memory policy (one NUMA node) affrun exec does without it

    numactl = shutil.which("numactl") if backend in ("auto", "numactl") else None
    if backend == "numactl" and numactl is None:
        from launcher.base.errors import LaunchError

        raise LaunchError("--mem-backend numactl: numactl is not installed (apt-get install numactl), "
                          "or use --mem-backend syscall")
    warnings: list[str] = []
    current = policy
    while current != "none":
        rc = set_mempolicy(current, nodes)
        if rc == -1 and numactl and _numactl_works(numactl, current, nodes):
            return MemResult(current, nodes, _numactl_args(numactl, current, nodes), tuple(warnings))
        if rc == 0:
            wrapper = _numactl_args(numactl, current, nodes) if backend == "numactl" and numactl else []
            return MemResult(current, nodes, wrapper, tuple(warnings))
        reason = (os.strerror(rc) if rc > 0 else "no set_mempolicy system call number for this machine"
                  + ("" if backend == "syscall" else ", and numactl is missing or fails"))
        nxt = FALLBACK[current]
        warnings.append(f"memory policy {current} is blocked ({reason}); falling back to {nxt}")
        current = nxt
    return MemResult("none", (), [], tuple(warnings))
