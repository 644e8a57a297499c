"""Fit a process's threads to the CPUs it has: every thread pinned, every pool sized (the pool variables set for
what it loads later, the pools already loaded lowered and read back). A user's value (``AFFRUN_USER_POOLS``) is
never raised. Once loaded it imports only the standard library and threadpoolctl. Why: docs/threads.md.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.base.choices import ENV_POLICIES
from launcher.base.cpulist import format_cpulist
from launcher.base.untrusted import ascii_uint, short
from launcher.env.variables import (
    PLACE_VARIABLES,
    POLICY_VARIABLE,
    POOL_VARIABLES,
    THREAD_VARIABLES,
    USER_POOLS_VARIABLE,
)

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, MutableMapping, Sequence

VARIABLES = (*THREAD_VARIABLES, *POOL_VARIABLES)
# The variable whose size each library threadpoolctl finds takes, by its ``internal_api`` (MKL's threads are
# OpenMP's; FlexiBLAS forwards to a BLAS of its own choice).
CONTROLLED = {"openmp": "OMP_NUM_THREADS", "mkl": "MKL_NUM_THREADS", "openblas": "OPENBLAS_NUM_THREADS",
              "blis": "BLIS_NUM_THREADS", "flexiblas": "OPENBLAS_NUM_THREADS"}

_said = False


def _new_process() -> None:
    global _said
    _said = False


os.register_at_fork(after_in_child=_new_process)  # a forked worker is a process of its own, with its own line


def say(text: str) -> None:
    """One ``affrun: warning:`` line per process, on file descriptor 2; later ones are dropped."""
    global _said
    if _said:
        return
    _said = True
    try:
        os.write(2, f"affrun: warning: {text}"[:600].encode("utf-8", "replace") + b"\n")
    except OSError:
        pass


@dataclass
class Fit:
    """What :func:`fit_worker` did: the CPUs and how many the process has (``count``), each pool variable's size
    (``None``: the user's, kept), the env policy, whether its libraries came by fork, what it could not do, and the
    ``torch.set_num_threads`` calls it fitted since (``asked``)."""

    cpus: tuple[int, ...]
    count: int
    sizes: dict[str, int | None]
    policy: str
    inherited: bool
    notes: list[str]
    asked: list[str] = field(default_factory=list)


_fit: Fit | None = None  # this worker's fit, which torch.set_num_threads (wrapped by fit_worker) keeps to


def pool_sizes(count: int, environ: Mapping[str, str]) -> tuple[dict[str, int | None], str, list[str]]:
    """The size of each pool variable in a process of ``count`` CPUs, the env policy, and the notes on malformed
    values. A variable ``AFFRUN_USER_POOLS`` names keeps the user's smaller value (``safe``), or any (``keep``:
    ``None``)."""
    notes: list[str] = []
    policy = environ.get(POLICY_VARIABLE) or "safe"
    if policy not in ENV_POLICIES:
        notes.append(f"{POLICY_VARIABLE}={short(policy)} is not one of {', '.join(ENV_POLICIES)}: safe is assumed")
        policy = "safe"
    users: set[str] = set()
    for word in (environ.get(USER_POOLS_VARIABLE) or "").split(","):
        name = word.strip()
        if name in VARIABLES:
            users.add(name)
        elif name:
            notes.append(f"{USER_POOLS_VARIABLE} names {short(name)}, which is no pool variable: ignored")
    sizes: dict[str, int | None] = {}
    for name in VARIABLES:
        if name not in users or name not in environ or policy == "override":
            sizes[name] = count
            continue
        value = _count(name, environ.get(name, ""))
        if not value:
            notes.append(f"{name}={short(environ.get(name, ''))} is not a thread count: {count} is used")
            sizes[name] = count
        else:
            sizes[name] = None if policy == "keep" else min(value, count)
    return sizes, policy, notes


def _count(name: str, text: str) -> int | None:
    """A count variable's value as the env policy reads it (``launcher.env.policy``): one whole number, and for
    OpenMP's, MKL's and OpenBLAS's variables the first of a list of nesting levels (``8,4``)."""
    return ascii_uint((text.split(",")[0] if name in THREAD_VARIABLES else text).strip())


def pin_threads(cpus: Sequence[int]) -> tuple[int, dict[int, str]]:
    """Every thread of this process onto ``cpus``, the main thread first: (the threads pinned, the error of each
    thread that was not, by thread id; 0: the calling thread)."""
    me = os.getpid()
    try:
        tids = [me, *sorted(int(t) for t in os.listdir("/proc/self/task") if t.isdigit() and int(t) != me)]
    except OSError:
        tids = [0]
    failed: dict[int, str] = {}
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError as exc:  # a thread that has ended, or none of the CPUs allowed (the cpuset moved)
            failed[tid] = exc.strerror or str(exc)
    return len(tids) - len(failed), failed


def pin_thread(tid: int, cpus: Collection[int], otherwise: str) -> bool:
    """Thread ``tid`` (0: the calling thread) onto ``cpus``; where the kernel refuses, one warning line saying
    ``otherwise``, and ``False``."""
    try:
        os.sched_setaffinity(tid, cpus)
    except OSError as exc:
        say(f"{otherwise}: CPU(s) {format_cpulist(cpus)}: {exc.strerror or exc}")
        return False
    return True


def spawned() -> bool:
    """This interpreter was started by ``multiprocessing``'s spawn method: the libraries it has loaded are its own,
    not inherited by fork (with pools whose threads it does not have)."""
    return "--multiprocessing-fork" in getattr(sys, "orig_argv", ())


def fit_worker(cpus: Sequence[int], environ: MutableMapping[str, str] | None = None,
               inherited: bool | None = None, speak: bool = True) -> Fit | None:
    """Pin every thread of this process (a DataLoader worker) to ``cpus`` and size every pool to them; idempotent.
    ``inherited``: its loaded libraries came by fork (default: unless :func:`spawned`). ``speak``: this worker
    says what goes wrong later (worker 0). ``None`` without CPUs."""
    global _fit
    env = os.environ if environ is None else environ
    home = tuple(sorted(set(cpus)))
    if not home:
        return None
    notes: list[str] = []
    if not pin_threads(home)[0]:
        notes.append(f"none of CPU(s) {','.join(map(str, home))} is allowed here: the worker keeps the CPUs it has")
    try:
        count = min(len(home), len(os.sched_getaffinity(0)))
    except OSError:
        count = len(home)
    sizes, policy, more = pool_sizes(count, env)
    fit = Fit(home, count, sizes, policy, not spawned() if inherited is None else inherited, notes + more)
    for name, size in sizes.items():
        if size is not None:
            env[name] = str(size)
    for name in PLACE_VARIABLES:  # they name the rank's CPUs: a runtime loaded later would bind to those
        env.pop(name, None)
    fit.notes.extend(size_loaded(fit, lower=True)[1])
    torch = sys.modules.get("torch")
    if torch is not None:
        _fit = fit
        keep_torch_count(torch)
        if int(torch.get_num_interop_threads()) > count:
            size_interop(torch, count, speak=speak, quiet=True)
    return fit


def refit(fit: Fit, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """The pools found above their size since :func:`fit_worker` (a ``worker_init_fn`` raised them), lowered again
    and read back unless the policy is ``keep`` (then only named); what could not be done goes to ``fit.notes``."""
    env = os.environ if environ is None else environ
    lower = fit.policy != "keep"
    raised: list[str] = []
    for name, size in fit.sizes.items():
        value = _count(name, env.get(name, ""))
        if size is not None and value is not None and value > size:
            raised.append(f"{name}={value}")
            if lower:
                env[name] = str(size)
    found, problems = size_loaded(fit, lower)
    fit.notes.extend(problems)
    asked = [] if any(p.startswith("torch:") for p in problems) else fit.asked[:]  # else the problem says it
    fit.asked.clear()
    return asked + raised + found


# The libraries sized through their own calls, in this order, then the runtimes threadpoolctl finds: (the name a
# problem is said under, the module, its pool variable, its count's getter and setter). Why: docs/threads.md.
LIBRARIES = (("torch", "torch", "OMP_NUM_THREADS", "get_num_threads", "set_num_threads"),
             ("opencv", "cv2", "OPENCV_FOR_THREADS_NUM", "getNumThreads", "setNumThreads"),
             ("numexpr", "numexpr", "NUMEXPR_NUM_THREADS", "get_num_threads", "set_num_threads"))


def size_loaded(fit: Fit, lower: bool) -> tuple[list[str], list[str]]:
    """Size the pools of the libraries this process has loaded to ``fit.sizes`` (``lower`` false: only name those
    above it): (the pools found above their size, in words; the problems). Each library on its own: one that
    fails leaves the others sized."""
    found: list[str] = []
    problems: list[str] = []
    for name, *library in (*LIBRARIES, ("runtimes",)):
        try:
            found.extend(_library(fit, lower, *library) if library else _runtimes(fit, lower))
        except Exception as exc:  # a broken or half-installed library: the worker goes on
            problems.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
    return found, problems


def _library(fit: Fit, lower: bool, name: str, variable: str, getter: str, setter: str) -> list[str]:
    """One library's count, when it is loaded and above its size: lowered through its own setter (torch's own,
    not affrun's wrapper; a forked OpenCV's parallel loops turned off) and read back."""
    module = sys.modules.get(name)
    size = fit.sizes[variable]
    if module is None or size is None:
        return []
    what = f"{name}.{getter}()"
    before = int(getattr(module, getter)())
    if before <= size:
        return []
    if lower:
        set_count = getattr(module, setter)
        getattr(set_count, "__wrapped__", set_count)(0 if name == "cv2" and fit.inherited else size)
        after = int(getattr(module, getter)())
        if after > size:  # a pool is said to be lowered only when it reads back at its size
            raise RuntimeError(f"{what} is {after} after lowering to {size}")
    return [f"{what}={before}"]


def _runtimes(fit: Fit, lower: bool) -> list[str]:
    """The BLAS and OpenMP runtimes this process has loaded, found and sized by threadpoolctl."""
    from launcher.context.runtimes import controllers

    found: list[str] = []
    stuck: list[str] = []
    for lib in controllers():
        name = CONTROLLED.get(lib.internal_api)
        size = fit.sizes.get(name) if name else None
        before = int(lib.num_threads)
        if size is None or before <= size:
            continue
        if lower:
            lib.set_num_threads(size)
            after = int(lib.get_num_threads())
            if after > size:
                stuck.append(f"{lib.internal_api} has {after} threads after lowering to {size}")
                continue
        found.append(f"{lib.internal_api} {before} threads")
    if stuck:
        raise RuntimeError("; ".join(stuck))
    return found


def keep_torch_count(torch: Any) -> None:
    """Wrap ``torch.set_num_threads`` in this worker so that a count above the fit's size is set at the size (the
    policy ``keep``: as asked), and remembered for :func:`refit` to name (docs/threads.md, "torch's count")."""
    if getattr(torch.set_num_threads, "_affrun_fitted", False):
        return
    real = torch.set_num_threads

    @functools.wraps(real)
    def set_num_threads(count: int) -> None:
        fit = _fit
        size = fit.sizes["OMP_NUM_THREADS"] if fit is not None else None
        if fit is None or size is None or isinstance(count, bool) or not isinstance(count, int) or count <= size:
            real(count)
            return
        fit.asked.append(f"torch.set_num_threads({count})")
        real(count if fit.policy == "keep" else size)

    set_num_threads._affrun_fitted = True  # type: ignore[attr-defined]
    torch.set_num_threads = set_num_threads


def size_interop(torch: Any, threads: int, *, speak: bool = True, quiet: bool = False) -> None:
    """``torch.set_num_interop_threads(threads)`` before the pool starts; a refusal is one warning line unless
    ``quiet``. A later call of the script's is one warning line (when ``speak``), not torch's ``RuntimeError``."""
    real = getattr(torch.set_num_interop_threads, "__wrapped__", torch.set_num_interop_threads)
    try:
        real(threads)
    except RuntimeError as exc:  # the pool exists already, the script set it first, or a fork inherited it
        if not quiet:
            say(f"torch's inter-op pool is not sized to {threads} thread(s): {str(exc)[:200]}")
        return

    @functools.wraps(real)
    def set_num_interop_threads(count: int) -> None:
        try:
            real(count)
        except RuntimeError:
            if not isinstance(count, int) or count <= 0:
                raise
            if speak:
                say(f"torch.set_num_interop_threads({count}) comes after affrun sized the inter-op pool to "
                    f"{threads} (the thread plan, docs/threads.md); torch takes one call: it stays at {threads}. "
                    "--rank-hooks none leaves it to the script")

    torch.set_num_interop_threads = set_num_interop_threads
