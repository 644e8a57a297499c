"""The communication threads' home (``--comm-cores``): torch.distributed makes its process groups with the calling
thread on the rank's comm cores, so that every thread born inside starts there; the caller's mask is put back after.
What goes where and why: docs/nics.md ("Which threads go where").
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from typing import TYPE_CHECKING

from launcher.bind.pools import pin_thread

if TYPE_CHECKING:
    from collections.abc import Callable, Collection
    from typing import Any

C10D = "torch.distributed.distributed_c10d"
# The functions through which a process group and its threads come to be (a name this torch lacks is left out).
MAKERS = ("init_process_group", "new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group",
          "_new_process_group_helper")
MARK = "_affrun_comm_cpus"  # set on a wrapper: the CPUs it narrows to (a second install wraps nothing again)
_inside = threading.local()  # .depth: this thread is inside a wrapped call (the outermost one narrowed it)


def install(torch: Any, home: Collection[int], rank_cpus: Collection[int]) -> None:
    """Wrap torch.distributed's group makers so that they run on ``home`` (the thread plan's comm home) when it
    is narrower than the rank's CPUs; otherwise (no comm cores, no main core) nothing is wrapped."""
    cpus = frozenset(home)
    if not cpus or cpus >= frozenset(rank_cpus):
        return
    dist = getattr(torch, "distributed", None)
    c10d = sys.modules.get(C10D)
    if dist is None or c10d is None or not getattr(dist, "is_available", lambda: False)():
        return
    swaps = {}
    for name in MAKERS:
        real = getattr(c10d, name, None)
        if callable(real) and getattr(real, MARK, None) is None:
            swaps[name] = (real, on_cpus(real, cpus))
    # every torch.distributed module that took these names at `import torch` (device_mesh's split_group) too
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "torch.distributed" or module_name.startswith("torch.distributed.")):
            continue
        for name, (real, wrapped) in swaps.items():
            if getattr(module, name, None) is real:
                setattr(module, name, wrapped)


def on_cpus(real: Callable[..., Any], cpus: frozenset[int]) -> Callable[..., Any]:
    """``real`` run with the calling thread's mask set to ``cpus``, then put back; a nested call (``new_group``
    calls the helper) runs as it is. Where the mask cannot be set, ``real`` runs on the caller's, with one warning."""

    @functools.wraps(real)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "depth", 0):
            return real(*args, **kwargs)
        before = _mask()
        narrowed = (before is not None and before != cpus
                    and pin_thread(0, cpus, "torch.distributed's threads start on the caller's CPUs"))
        _inside.depth = 1
        try:
            return real(*args, **kwargs)
        finally:
            _inside.depth = 0
            if narrowed and before is not None:
                pin_thread(0, before, "the thread that made the process group stays on the comm cores")

    setattr(wrapper, MARK, cpus)
    return wrapper


def _mask() -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(0))
    except OSError:
        return None
