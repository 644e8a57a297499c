"""Apply a NUMA memory policy to this process before it execs the rank: ``set_mempolicy`` or numactl.

The policy set with ``set_mempolicy(2)`` survives ``execve(2)``, so no wrapper process is needed. When the
kernel refuses (EPERM in containers without CAP_SYS_NICE), fall back membind -> preferred -> none.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass

MODES = {"default": 0, "preferred": 1, "membind": 2, "interleave": 3}
# set_mempolicy syscall numbers by machine
SYSCALLS = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "ppc64": 261, "s390x": 270, "riscv64": 237}
FALLBACK = {"membind": "preferred", "interleave": "preferred", "preferred": "none"}


@dataclass(frozen=True)
class MemResult:
    policy: str  # what is in effect: membind | preferred | interleave | none
    nodes: tuple[int, ...]
    wrapper: list[str]  # argv prefix to exec through (numactl), or []
    warnings: tuple[str, ...]


def set_mempolicy(policy: str, nodes: tuple[int, ...]) -> int:
    """Call set_mempolicy(2); return 0 or the errno."""
    import ctypes

    number = SYSCALLS.get(platform.machine())
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
        rc = libc.syscall(number, MODES[policy], mask, ctypes.c_ulong(maxnode))
    return 0 if rc == 0 else ctypes.get_errno()


def _numactl_works(numactl: str, policy: str, nodes: tuple[int, ...]) -> bool:
    args = _numactl_args(numactl, policy, nodes)
    try:
        return subprocess.run([*args, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _numactl_args(numactl: str, policy: str, nodes: tuple[int, ...]) -> list[str]:
    joined = ",".join(map(str, nodes))
    flag = {"membind": f"--membind={joined}", "preferred": f"--preferred={nodes[0]}",
            "interleave": f"--interleave={joined}"}[policy]
    return [numactl, flag, "--"]


def apply_mempolicy(policy: str, nodes: tuple[int, ...], backend: str = "auto") -> MemResult:
    """Apply ``policy`` on ``nodes`` for this process (and what it execs).

    ``backend``: ``syscall`` uses set_mempolicy alone; ``numactl`` execs through numactl (an error when it is
    not installed); ``auto`` execs through numactl when it is installed, else relies on the syscall. The policy is probed first: when it is
    blocked the next weaker one is tried, with a warning, and the rank is never failed for it.
    """
    if policy == "none" or not nodes:
        return MemResult("none", (), [], ())
    numactl = shutil.which("numactl") if backend in ("auto", "numactl") else None
    if backend == "numactl" and numactl is None:
        from launcher.errors import LaunchError

        raise LaunchError("--mem-backend numactl: numactl is not installed (apt-get install numactl), "
                          "or use --mem-backend syscall")
    warnings: list[str] = []
    current = policy
    while current != "none":
        rc = set_mempolicy(current, nodes)
        if rc == 0 or (rc == -1 and numactl and _numactl_works(numactl, current, nodes)):
            wrapper = _numactl_args(numactl, current, nodes) if numactl else []
            return MemResult(current, nodes, wrapper, tuple(warnings))
        reason = os.strerror(rc) if rc > 0 else "no set_mempolicy on this machine and numactl unavailable"
        nxt = FALLBACK[current]
        warnings.append(f"memory policy {current} is blocked ({reason}); falling back to {nxt}")
        current = nxt
    return MemResult("none", (), [], tuple(warnings))
