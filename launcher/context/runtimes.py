"""Which OpenMP/BLAS runtimes a process has loaded, and how many threads each one runs.

Another process: its ``/proc/PID/maps`` named by :data:`RUNTIMES`, counted from its environment. This process:
threadpoolctl (:func:`controllers`), which asks each library and loads none.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from launcher.env.omp_syntax import thread_count

OPENMP = "openmp"
BLAS = "blas"


@dataclass(frozen=True)
class LoadedRuntime:
    """One runtime found in a process."""

    name: str  # a row of RUNTIMES: libgomp, libiomp5, libomp, openblas, mkl
    user_api: str  # "openmp" or "blas"
    path: str
    threads: int | None
    threads_from: str  # "runtime" (asked the library), a variable name, or "default (N CPUs)"
    detail: str = ""  # e.g. MKL's threading layer

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "user_api": self.user_api, "path": self.path, "threads": self.threads,
                "threads_from": self.threads_from, "detail": self.detail}


class Runtime(NamedTuple):
    """One row of :data:`RUNTIMES`."""

    name: str
    user_api: str
    pattern: re.Pattern[str]  # matched against the library's file name
    thread_variables: tuple[str, ...]  # read in this order; the first valid one wins
    variables: tuple[str, ...]  # every variable it reads (thread counts and binding)
    reads_at: str  # when it reads them: "load" or "first parallel region"
    setter: str  # the function that sets its count (threadpoolctl calls it), as bind_rank's report names it


_OMP = ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND", "OMP_WAIT_POLICY", "OMP_DYNAMIC", "OMP_DISPLAY_AFFINITY",
        "OMP_THREAD_LIMIT", "GOMP_CPU_AFFINITY")
_KMP = (*_OMP, "KMP_AFFINITY", "KMP_BLOCKTIME", "KMP_HW_SUBSET", "KMP_INIT_AT_FORK")
_OPENBLAS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
_COUNT = ("OMP_NUM_THREADS",)
RUNTIMES = (
    # GNU libgomp: PyTorch's Linux pip wheels bundle it as torch/lib/libgomp*.so.1.
    Runtime("libgomp", OPENMP, re.compile(r"^libgomp(-[0-9a-f]+)?\.so"), _COUNT, (*_OMP, "GOMP_SPINCOUNT"), "load",
            "omp_set_num_threads"),
    # Intel libiomp5, and LLVM libomp (not libomptarget): Intel's runtime under another name, the same variables.
    Runtime("libiomp5", OPENMP, re.compile(r"^libiomp5(md)?(-[0-9a-f]+)?\.so"), _COUNT, _KMP,
            "first parallel region", "omp_set_num_threads"),
    Runtime("libomp", OPENMP, re.compile(r"^libomp(-[0-9a-f]+)?\.so"), _COUNT, _KMP, "first parallel region",
            "omp_set_num_threads"),
    # OpenBLAS, numpy/scipy's libscipy_openblas64_ builds included; MKL through its one library libmkl_rt.
    Runtime("openblas", BLAS, re.compile(r"^lib(scipy_)?openblas"), _OPENBLAS, _OPENBLAS, "load",
            "openblas_set_num_threads"),
    Runtime("mkl", BLAS, re.compile(r"^libmkl_rt\.so"), ("MKL_NUM_THREADS", *_COUNT),
            ("MKL_NUM_THREADS", "MKL_THREADING_LAYER", "MKL_DYNAMIC", *_COUNT), "load", "MKL_Set_Num_Threads"),
)
BY_NAME = {row.name: row for row in RUNTIMES}
_MKL_LAYERS = re.compile(r"^libmkl_(intel_thread|gnu_thread|tbb_thread|pgi_thread|sequential)\.so")


def identify(paths: Iterable[str]) -> list[tuple[Runtime, str]]:
    """(row, path) for each library a row of :data:`RUNTIMES` names, one entry per path."""
    out: list[tuple[Runtime, str]] = []
    for path in paths:
        filename = os.path.basename(path)
        row = next((r for r in RUNTIMES if r.pattern.match(filename)), None)
        if row is not None:
            out.append((row, path))
    return out


def _detail(row: Runtime, paths: Sequence[str]) -> str:
    """MKL's threading layer, from the other libraries of the process."""
    layers = sorted({m.group(1) for p in paths if (m := _MKL_LAYERS.match(os.path.basename(p)))})
    return f"threading layer {', '.join(layers)}" if row.name == "mkl" and layers else ""


def runtimes_from_paths(paths: Sequence[str], environ: Mapping[str, str], cpus: int) -> list[LoadedRuntime]:
    """The runtimes among ``paths``, each with the count ``environ`` configures in a process of ``cpus`` CPUs."""
    out: list[LoadedRuntime] = []
    for row, path in identify(paths):
        found = ((count, name) for name in row.thread_variables if (count := thread_count(environ.get(name))))
        threads, source = next(found, (cpus, f"default ({cpus} CPUs)"))
        out.append(LoadedRuntime(row.name, row.user_api, path, threads, source, _detail(row, paths)))
    return out


def controllers() -> list[Any]:
    """threadpoolctl's controller of each BLAS or OpenMP library loaded in this process, its warnings silenced and
    the ``KMP_DUPLICATE_LIB_OK`` its import sets taken out again (docs/threads.md)."""
    import sys
    import warnings

    fresh = "threadpoolctl" not in sys.modules and "KMP_DUPLICATE_LIB_OK" not in os.environ
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from threadpoolctl import ThreadpoolController

        if fresh:
            os.environ.pop("KMP_DUPLICATE_LIB_OK", None)
        return list(ThreadpoolController().lib_controllers)


def in_process() -> list[tuple[LoadedRuntime, Any]]:
    """The runtimes of :data:`RUNTIMES` loaded in this process, each with its count asked from the library and its
    threadpoolctl controller, in the order ``/proc/self/maps`` lists them (as ``doctor --pid`` shows them)."""
    from launcher.base.procfs import libraries

    paths = libraries()
    order = {path: i for i, path in enumerate(paths)}
    out: list[tuple[LoadedRuntime, Any]] = []
    for lib in sorted(controllers(), key=lambda lib: order.get(lib.filepath, len(order))):
        key = lib.prefix if lib.internal_api == OPENMP else lib.internal_api  # threadpoolctl's libiomp: libiomp5
        row = BY_NAME.get("libiomp5" if key == "libiomp" else key)
        if row is not None:
            threads = lib.num_threads
            out.append((LoadedRuntime(row.name, row.user_api, lib.filepath, threads if threads else None, "runtime",
                                      _detail(row, paths)), lib))
    return out


def openmp_names(runtimes: Iterable[LoadedRuntime | Runtime]) -> tuple[str, ...]:
    """The OpenMP runtime names among ``runtimes`` (found, or rows of :data:`RUNTIMES`), without repeats, in order."""
    return tuple(dict.fromkeys(r.name for r in runtimes if r.user_api == OPENMP))
