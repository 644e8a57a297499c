"""Which OpenMP/BLAS runtimes a process has loaded, and how many threads each one runs.

Written in the spirit of threadpoolctl: each runtime is a small registered controller (:func:`register`) that
knows its file names, the variables it reads and how to ask it for its thread count. The libraries are found
in ``/proc/PID/maps``, so any process can be inspected without loading anything into it.

Thread counts: in this process the library is asked directly (``omp_get_max_threads``,
``openblas_get_num_threads``, ``MKL_Get_Max_Threads``, through ``dlopen(RTLD_NOLOAD)``, which never loads a
library). Another process cannot be asked, so its count is the one its environment configures (the variable the
runtime reads first, else the runtime's default: one thread per CPU in the process's mask).

Standard library only (``ctypes`` is imported when a library is asked): ``launcher.ensure`` uses this module at
the top of training scripts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from launcher.env.omp_syntax import thread_count

OPENMP = "openmp"
BLAS = "blas"


@dataclass(frozen=True)
class LoadedRuntime:
    """One runtime found in a process."""

    name: str  # controller name: libgomp, libiomp5, libomp, openblas, mkl
    user_api: str  # "openmp" or "blas"
    path: str
    threads: int | None
    threads_from: str  # "runtime" (asked the library), a variable name, or "default (N CPUs)"
    detail: str = ""  # e.g. MKL's threading layer

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "user_api": self.user_api,
            "path": self.path,
            "threads": self.threads,
            "threads_from": self.threads_from,
            "detail": self.detail,
        }


class RuntimeController:
    """Base class of a runtime. Subclasses set the class attributes and may override the two hooks."""

    name: ClassVar[str]
    user_api: ClassVar[str]
    pattern: ClassVar[re.Pattern[str]]  # matched against the library's file name
    thread_variables: ClassVar[tuple[str, ...]]  # read in this order; the first valid one wins
    variables: ClassVar[tuple[str, ...]]  # every variable the runtime reads (thread counts and binding)
    reads_at: ClassVar[str]  # when it reads them: "load" or "first parallel region"
    count_symbols: ClassVar[tuple[str, ...]] = ()  # functions returning the thread count, tried in order
    set_symbols: ClassVar[tuple[str, ...]] = ()  # functions void(int) setting it (threadpoolctl's), tried in order

    @classmethod
    def matches(cls, filename: str) -> bool:
        return cls.pattern.match(filename) is not None

    @classmethod
    def reads(cls, variable: str) -> bool:
        return variable in cls.variables

    @classmethod
    def default_threads(cls, cpus: int) -> int:
        """Threads the runtime starts when no variable sets them (OpenMP: one per CPU of the mask)."""
        return cpus

    @classmethod
    def configured_threads(cls, environ: Mapping[str, str], cpus: int) -> tuple[int, str]:
        """The thread count ``environ`` gives this runtime in a process allowed ``cpus`` CPUs, and its source."""
        for name in cls.thread_variables:
            count = thread_count(environ.get(name))
            if count is not None:
                return count, name
        return cls.default_threads(cpus), f"default ({cpus} CPUs)"

    @classmethod
    def threads_in_process(cls, path: str) -> int | None:
        """Ask the library loaded in *this* process (never loads it). ``None`` when it cannot be asked."""
        func = _loaded_symbol(path, cls.count_symbols)
        if func is None:
            return None
        func.restype = _c_int()
        func.argtypes = []
        value = int(func())
        return value if value > 0 else None

    @classmethod
    def set_threads_in_process(cls, path: str, threads: int) -> bool:
        """Set the thread count of the library loaded in *this* process (never loads it); False when it cannot."""
        func = _loaded_symbol(path, cls.set_symbols)
        if func is None:
            return False
        func.restype = None
        func.argtypes = [_c_int()]
        func(threads)
        return True

    @classmethod
    def describe(cls, paths: Sequence[str]) -> str:
        """Extra detail from the other libraries of the process (MKL's threading layer)."""
        return ""


def _c_int() -> Any:
    import ctypes

    return ctypes.c_int


def _loaded_symbol(path: str, symbols: Sequence[str]) -> Any:
    """The first of ``symbols`` that the library at ``path``, already loaded in this process, exports; else None."""
    lib = _open_loaded(path)
    if lib is None:
        return None
    return next((f for f in (getattr(lib, s, None) for s in symbols) if f is not None), None)


def _open_loaded(path: str) -> Any:
    import ctypes

    try:
        return ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None


CONTROLLERS: list[type[RuntimeController]] = []


def register(cls: type[RuntimeController]) -> type[RuntimeController]:
    """Add a runtime controller (usable as a class decorator). Later registrations are tried first."""
    CONTROLLERS.insert(0, cls)
    return cls


OMP_VARIABLES = ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND", "OMP_WAIT_POLICY", "OMP_DYNAMIC",
                 "OMP_DISPLAY_AFFINITY", "OMP_THREAD_LIMIT")


@register
class GnuOpenMP(RuntimeController):
    """GNU libgomp: PyTorch's Linux pip wheels bundle it as ``torch/lib/libgomp*.so.1``."""

    name = "libgomp"
    user_api = OPENMP
    pattern = re.compile(r"^libgomp(-[0-9a-f]+)?\.so")
    thread_variables = ("OMP_NUM_THREADS",)
    variables = (*OMP_VARIABLES, "GOMP_CPU_AFFINITY", "GOMP_SPINCOUNT")
    reads_at = "load"
    count_symbols = ("omp_get_max_threads",)
    set_symbols = ("omp_set_num_threads",)


@register
class IntelOpenMP(RuntimeController):
    """Intel libiomp5 (the ``intel-openmp`` wheel, MKL's ``intel`` threading layer)."""

    name = "libiomp5"
    user_api = OPENMP
    pattern = re.compile(r"^libiomp5(md)?(-[0-9a-f]+)?\.so")
    thread_variables = ("OMP_NUM_THREADS",)
    variables = (*OMP_VARIABLES, "GOMP_CPU_AFFINITY", "KMP_AFFINITY", "KMP_BLOCKTIME", "KMP_HW_SUBSET",
                 "KMP_INIT_AT_FORK")
    reads_at = "first parallel region"
    count_symbols = ("omp_get_max_threads",)
    set_symbols = ("omp_set_num_threads",)


@register
class LLVMOpenMP(IntelOpenMP):
    """LLVM libomp (clang ``-fopenmp``, conda's ``llvm-openmp``): Intel's runtime under another name, which reads
    the same variables (``KMP_*`` included) at the same moment."""

    name = "libomp"
    pattern = re.compile(r"^libomp(-[0-9a-f]+)?\.so")  # not libomptarget


@register
class OpenBLAS(RuntimeController):
    """OpenBLAS, including numpy/scipy's ``libscipy_openblas64_`` builds (symbols with a prefix and suffix)."""

    name = "openblas"
    user_api = BLAS
    pattern = re.compile(r"^lib(scipy_)?openblas")
    thread_variables = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
    variables = thread_variables
    reads_at = "load"
    count_symbols = ("openblas_get_num_threads", "openblas_get_num_threads64_",
                     "scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads")
    set_symbols = tuple(s.replace("_get_", "_set_") for s in count_symbols)


_MKL_LAYERS = re.compile(r"^libmkl_(intel_thread|gnu_thread|tbb_thread|pgi_thread|sequential)\.so")


@register
class MKL(RuntimeController):
    """Intel MKL through its single dynamic library ``libmkl_rt`` (as threadpoolctl finds it)."""

    name = "mkl"
    user_api = BLAS
    pattern = re.compile(r"^libmkl_rt\.so")
    thread_variables = ("MKL_NUM_THREADS", "OMP_NUM_THREADS")
    variables = ("MKL_NUM_THREADS", "MKL_THREADING_LAYER", "MKL_DYNAMIC", "OMP_NUM_THREADS")
    reads_at = "load"
    count_symbols = ("MKL_Get_Max_Threads",)
    set_symbols = ("MKL_Set_Num_Threads",)

    @classmethod
    def describe(cls, paths: Sequence[str]) -> str:
        layers = sorted({m.group(1) for p in paths if (m := _MKL_LAYERS.match(os.path.basename(p)))})
        return f"threading layer {', '.join(layers)}" if layers else ""


def mapped_libraries(pid: int | None = None, proc: str = "/proc") -> list[str]:
    """Paths of the shared libraries mapped into ``pid`` (default: this process), in first-mapped order.

    Raises ``OSError`` (``FileNotFoundError`` for a process that is gone, ``PermissionError``) as the read does.
    """
    where = "self" if pid is None else str(pid)
    with open(os.path.join(proc, where, "maps"), encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    return libraries_in_maps(text)


def libraries_in_maps(text: str) -> list[str]:
    """The distinct ``.so`` paths in the text of a ``/proc/PID/maps`` file."""
    seen: dict[str, None] = {}
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        if path.startswith("/") and ".so" in os.path.basename(path):
            seen.setdefault(path, None)
    return list(seen)


def identify(paths: Iterable[str]) -> list[tuple[type[RuntimeController], str]]:
    """(controller, path) for each library a registered controller recognises, one entry per path."""
    out: list[tuple[type[RuntimeController], str]] = []
    for path in paths:
        filename = os.path.basename(path)
        for controller in CONTROLLERS:
            if controller.matches(filename):
                out.append((controller, path))
                break
    return out


def runtimes_from_paths(
    paths: Sequence[str],
    environ: Mapping[str, str],
    cpus: int,
    *,
    ask: Callable[[type[RuntimeController], str], int | None] | None = None,
) -> list[LoadedRuntime]:
    """The runtimes among ``paths``. ``ask`` queries a library for its thread count (in-process only);
    without it, or when it cannot answer, the count is the one ``environ`` configures for ``cpus`` CPUs."""
    out: list[LoadedRuntime] = []
    for controller, path in identify(paths):
        threads: int | None = None
        source = ""
        if ask is not None:
            threads = ask(controller, path)
            source = "runtime"
        if threads is None:
            threads, source = controller.configured_threads(environ, cpus)
        out.append(LoadedRuntime(controller.name, controller.user_api, path, threads, source,
                                 controller.describe(paths)))
    return out


def loaded_runtimes(
    pid: int | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cpus: int | None = None,
    proc: str = "/proc",
) -> list[LoadedRuntime]:
    """The OpenMP/BLAS runtimes loaded in ``pid`` (default: this process, whose libraries are asked directly).

    For another process, ``environ`` and ``cpus`` default to what ``/proc/PID/environ`` and its affinity say.
    """
    paths = mapped_libraries(pid, proc)
    if pid is None or pid == os.getpid():
        env = os.environ if environ is None else environ
        ncpu = len(os.sched_getaffinity(0)) if cpus is None else cpus
        return runtimes_from_paths(paths, env, ncpu, ask=lambda c, p: c.threads_in_process(p))
    env = read_environ(pid, proc) if environ is None else environ
    ncpu = len(os.sched_getaffinity(pid)) if cpus is None else cpus
    return runtimes_from_paths(paths, env, ncpu)


ENVIRON_LIMIT = 16 << 20  # as a command line: the kernel takes at most a quarter of the stack for both


def read_environ(pid: int, proc: str = "/proc") -> dict[str, str]:
    """The environment ``pid`` was started with (``/proc/PID/environ``; later ``setenv`` calls are not in it), at
    most :data:`ENVIRON_LIMIT` of it. A name given twice has its first value, as ``getenv`` finds; a byte that
    is not UTF-8 reads as U+FFFD."""
    with open(os.path.join(proc, str(pid), "environ"), "rb") as fh:
        data = fh.read(ENVIRON_LIMIT)
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        if b"=" in item:
            key, _, value = item.partition(b"=")
            env.setdefault(key.decode(errors="replace"), value.decode(errors="replace"))
    return env


def controller_named(name: str) -> type[RuntimeController] | None:
    for controller in CONTROLLERS:
        if controller.name == name:
            return controller
    return None


def openmp_names(runtimes: Iterable[LoadedRuntime]) -> tuple[str, ...]:
    """The OpenMP runtime names among ``runtimes``, without repeats, in order."""
    return tuple(dict.fromkeys(r.name for r in runtimes if r.user_api == OPENMP))
