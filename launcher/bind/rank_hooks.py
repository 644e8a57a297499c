"""The one fit inside a rank: the thread plan of the live rank (:func:`live_plan`), and the rank's thread hooks
(``--rank-hooks auto``), installed once a bound rank's ``import torch`` completes: each DataLoader worker fitted to
its home (:func:`fit_home`), the pin-memory thread, the inter-op pool, the main thread. A failure is one warning
line, never the script's. What each hook does and why: docs/threads.md.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from typing import TYPE_CHECKING

from launcher.base.siblings import live_cores
from launcher.bind import comm_threads
from launcher.bind.inherited import MAY_NOT_RUN, cpuset_cpus
from launcher.bind.pools import Fit, fit_worker, pin_thread, refit, say, size_interop
from launcher.bind.readback import read_binding
from launcher.context.run_role import affrun_process, multiprocessing_child
from launcher.env.variables import MAIN_VARIABLE
from launcher.plan.threads import ThreadPlan, thread_plan

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from launcher.bind.readback import TaskBinding

WORKER_MODULE = "torch.utils.data._utils.worker"
PIN_MODULE = "torch.utils.data._utils.pin_memory"
# Set on torch's worker module in a worker the hook has fitted (its pid): worker_init_fn then fits it again quietly.
FITTED = "_affrun_fitted"


def live_plan(environ: Mapping[str, str], workers: int = 0, usable: frozenset[int] | None = None) -> ThreadPlan:
    """The thread plan of the rank whose ``AFFRUN_*`` values ``environ`` holds, read by the one strict reader on
    ``usable`` CPUs (``ValueError`` naming the variable; ``LookupError`` without ``AFFRUN_CPUS``)."""
    rank = read_binding(environ, usable, MAY_NOT_RUN)
    if rank is None:
        raise LookupError("AFFRUN_CPUS is not set")
    return thread_plan(rank, workers, live_cores(rank.cpus) if workers else ())


def install(torch: Any) -> None:
    """Run by the startup hook once ``import torch`` has completed in a process bound by affrun. ``AFFRUN_*`` values
    that cannot be its binding here are one warning line, and nothing is patched."""
    argv = getattr(sys, "orig_argv", sys.argv)
    if affrun_process(argv):
        return
    child = multiprocessing_child(argv)  # a spawned worker, or the forkserver: its worker loop fits it
    # Judged on the mask it started with; a multiprocessing child's or an unread one: the cpuset's (docs/threads.md)
    start = getattr(sys.modules.get("_affrun_startup"), "start_mask", None)
    try:
        rank = read_binding(os.environ, start if start and not child else cpuset_cpus(), MAY_NOT_RUN)
    except ValueError as exc:
        if not child:  # a spawned worker's or the forkserver's parent read the same values, and said it
            say(f"the rank's thread hooks are off: {exc}")
        return
    if rank is None:
        return  # not a rank's process after all: nothing to fit
    worker, pin = sys.modules.get(WORKER_MODULE), sys.modules.get(PIN_MODULE)  # `import torch` imported both
    if worker is not None:
        patch_worker_loop(worker, rank)
    if child:
        return
    plan = thread_plan(rank, 0)
    if pin is not None:
        patch_pin_memory_loop(pin, plan.pin_memory.cpus)
    size_interop(torch, plan.interop.threads)
    comm_threads.install(torch, plan.nccl_proxy.cpus, rank.cpus)
    main = os.getpid()  # the main thread's id; unless the OpenMP runtime put it on its core at load:
    if plan.main.pinned and os.sched_getaffinity(main) != set(plan.main.cpus):
        pin_thread(main, plan.main.cpus, f"the main thread stays on the rank's CPUs, off its core ({MAIN_VARIABLE})")
    torch.get_num_threads()  # start the main thread's count now: docs/threads.md, "The pin-memory thread ..."


def patch_worker_loop(module: Any, rank: TaskBinding) -> None:
    """Wrap torch's ``_worker_loop`` so that each worker fits its home first. The wrapper keeps the original's
    module and name: spawn and forkserver pickle it by reference."""
    real = module._worker_loop
    if getattr(real, "__wrapped__", None) is not None:
        return
    signature = inspect.signature(real)

    @functools.wraps(real)
    def _worker_loop(*args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(*args, **kwargs)
            fit_this_worker(module, rank, bound.arguments)
            args, kwargs = bound.args, bound.kwargs
        except Exception as exc:  # the worker goes on, unfitted
            say(f"DataLoader worker not fitted to its thread plan: {type(exc).__name__}: {str(exc)[:200]}")
        real(*args, **kwargs)

    module._worker_loop = _worker_loop


def fit_this_worker(module: Any, rank: TaskBinding, arguments: dict[str, Any]) -> None:
    """Fit this worker to its home in the thread plan (:func:`fit_home`); a user's ``init_fn`` in
    ``_worker_loop``'s ``arguments`` is then followed by a check that it did not raise a pool again."""
    worker_id, workers = int(arguments["worker_id"]), int(arguments["num_workers"])
    home = thread_plan(rank, workers, live_cores(rank.cpus)).workers[worker_id].cpus
    fit = fit_home(home, worker_id, f"DataLoader worker {worker_id}")
    setattr(module, FITTED, os.getpid())
    user = arguments.get("init_fn")
    if fit is not None and user is not None:
        arguments["init_fn"] = _checked(user, fit, worker_id, worker_id == 0)


def fit_home(home: Sequence[int], worker_id: int, who: str) -> Fit | None:
    """Fit this DataLoader worker to ``home`` (:func:`launcher.bind.pools.fit_worker`), for the hook and for
    ``launcher.torch.worker_init_fn``: worker 0 says what went wrong, as ``who``, unless the hook fitted it."""
    fit = fit_worker(home, speak=worker_id == 0)
    hooked = getattr(sys.modules.get(WORKER_MODULE), FITTED, None) == os.getpid()
    if fit is not None and fit.notes and worker_id == 0 and not hooked:
        say(f"{who}: {'; '.join(fit.notes)}")
        fit.notes.clear()
    return fit


def _checked(user: Callable[[int], None], fit: Fit, worker_id: int, speak: bool) -> Callable[[int], None]:
    """``user`` (the script's ``worker_init_fn``), then the pools it raised above the worker's CPUs lowered again
    (named only under ``--env-policy keep``)."""

    def init(worker_id: int) -> None:
        user(worker_id)
        raised = refit(fit)
        if speak and (raised or fit.notes):
            kept = "kept (--env-policy keep)" if fit.policy == "keep" else f"lowered to {fit.count}"
            said = f"worker_init_fn raised {', '.join(raised)} above the worker's {fit.count} CPU(s): {kept}"
            say(f"DataLoader worker {worker_id}: {'; '.join(([said] if raised else []) + fit.notes)}")

    return init


def patch_pin_memory_loop(module: Any, cpus: tuple[int, ...]) -> None:
    """Wrap torch's ``_pin_memory_loop`` (the pin-memory thread's target) so that the thread moves to ``cpus``
    when it starts (``sched_setaffinity`` of the calling thread only)."""
    real = module._pin_memory_loop
    if getattr(real, "__wrapped__", None) is not None or not cpus:
        return

    @functools.wraps(real)
    def _pin_memory_loop(*args: Any, **kwargs: Any) -> None:
        pin_thread(0, cpus, "the pin-memory thread stays where it started")
        real(*args, **kwargs)

    module._pin_memory_loop = _pin_memory_loop
