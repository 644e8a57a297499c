"""Apply a rank's binding to this process: CPU mask and memory policy (both survive ``execve`` and are inherited
by children), then ``execvpe`` the rank's command. The last step of ``affrun exec`` and of the startup hook."""

from __future__ import annotations

import os
import sys

from launcher.base.cpulist import format_cpulist
from launcher.errors import LaunchError, error_line

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a rank imports this module (docs/design.md §11)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from launcher.bind.mempolicy import MemResult


def bind_process(cpus: Sequence[int], mem_policy: str, mem_nodes: tuple[int, ...], mem_backend: str) -> MemResult:
    """Set this process's CPU mask and memory policy (both survive ``execve`` and are inherited by children).

    The kernel takes a mask partly outside the process's cpuset and keeps only the part inside it, without an
    error. The plan starts from the real mask, so that happens only where the plan was made from another view
    of the machine (``--fsroot``, ``--topology``, a parent's plan) or the cpuset changed since: the rank is then
    told, on one line, which CPUs it really got. Memory nodes this machine does not have are refused first,
    before the mask: the kernel would refuse the policy (EINVAL) and the fallback would drop it."""
    from launcher.bind.mempolicy import apply_mempolicy, missing_nodes

    missing = missing_nodes(mem_nodes) if mem_policy != "none" else ()
    if missing:
        raise LaunchError(f"memory policy {mem_policy} names NUMA node(s) {','.join(map(str, missing))}, which this "
                          "machine does not have: the plan was made for another machine")
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        raise LaunchError(f"cannot bind to CPUs {format_cpulist(cpus)}: {exc.strerror} "
                          f"(allowed here: {format_cpulist(os.sched_getaffinity(0))})") from None
    got = os.sched_getaffinity(0)
    if got != set(cpus):
        print(f"affrun: warning: the kernel narrowed the CPUs {format_cpulist(cpus)} to "
              f"{format_cpulist(got)}: the plan was made for CPUs this process's cpuset does not allow",
              file=sys.stderr)
    return apply_mempolicy(mem_policy, mem_nodes, mem_backend)


def exec_or_status(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """``execvpe`` ``argv`` in place; when that fails, one ``affrun: error:`` line and the shell's status
    (127: not found, 126: not executable)."""
    try:
        os.execvpe(argv[0], list(argv), env)
    except FileNotFoundError:
        print(error_line(LaunchError(f"{argv[0]}: command not found")), file=sys.stderr)
        return 127
    except PermissionError:
        print(error_line(LaunchError(f"{argv[0]}: permission denied")), file=sys.stderr)
        return 126
    except OSError as exc:
        print(error_line(LaunchError(f"{argv[0]}: {exc.strerror}")), file=sys.stderr)
        return 126
    return 0  # pragma: no cover - execvpe does not return
