"""Process check: the pool variables of one rank's environment (OpenCV's, Rayon's, numexpr's, BLIS's; OpenBLAS's
with a main core), judged as the env policy judges a user's value against the size the rank's thread plan gives
each pool, else against the rank's share of the cores (docs/doctor.md, "Pool variables")."""

from __future__ import annotations

from collections.abc import Mapping

from launcher.base.cpulist import format_cpulist
from launcher.base.untrusted import ascii_int, ascii_uint, short
from launcher.context.run_role import RUN_VARIABLE
from launcher.doctor.check_base import AFFRUN_FIX, rank_share
from launcher.doctor.facts import Facts
from launcher.doctor.findings import Finding
from launcher.doctor.rank_fields import environ_fields
from launcher.env.omp_syntax import thread_count
from launcher.env.policy import pool_sizes, variable_problem
from launcher.env.variables import MAIN_VARIABLE, POLICY_VARIABLE, POOL_OF, POOL_VARIABLES, USER_POOLS_VARIABLE
from launcher.plan.threads import thread_plan
from launcher.topology.model import Topology

# What a value that is not a number does, measured here (docs/doctor.md, "Pool variables"): the library fails.
GARBAGE = {
    "OPENCV_FOR_THREADS_NUM": "opencv-python-headless 5.1.0 raises cv2.error (stoull) at its first parallel call "
                              "(cv2.resize, cv2.cvtColor, cv2.setNumThreads...): every image op of the DataLoader "
                              "fails",
    "NUMEXPR_NUM_THREADS": "numexpr 2.14.2 raises ValueError at `import numexpr`",
}


def _crashes(name: str, value: str) -> bool:
    """OpenCV reads its count as an unsigned number, numexpr with Python's ``int()``: what neither reads fails."""
    if name == "OPENCV_FOR_THREADS_NUM":
        return ascii_uint(value) is None  # " 1" and "1\n" fail as "lots" does
    return name == "NUMEXPR_NUM_THREADS" and ascii_int(value.strip()) is None

def check_pool_variables(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    """A pool variable that is no positive whole number, or that sizes its pool above the plan's size."""
    if environ.get(RUN_VARIABLE) and not environ.get("AFFRUN_CPUS"):
        return []  # /proc/PID/environ of a rank under affrun run: what its hook set in-process is not there
    fields = environ_fields(environ, None)
    if fields is not None:
        plan = thread_plan(fields, 0)
        sizes = pool_sizes(plan)
        home = frozenset(plan.interop.cpus)  # the main thread's mask, which every pool but OpenMP's inherits
        names = [*POOL_VARIABLES] + (["OPENBLAS_NUM_THREADS"] if sizes["OPENBLAS_NUM_THREADS"]
                                     < sizes["OMP_NUM_THREADS"] else [])  # else omp-oversubscribed's
        main = frozenset(fields.main_cpus)
        rank = format_cpulist(fields.cpus)
        where = (f"the main thread's core, CPU(s) {format_cpulist(main)} ({MAIN_VARIABLE}) of the rank's CPUs {rank}"
                 if main else f"the rank's CPUs {rank}")
    else:
        share = rank_share(environ, topology, facts)
        sizes = {name: share.per_rank for name in POOL_OF}
        home, names, where = share.cpus, [*POOL_VARIABLES], share.where
    out: list[Finding] = []
    for name in names:
        value = environ.get(name)
        if value is None:
            continue
        problem = variable_problem(name, value, home, threads=sizes[name])
        if problem is None:
            continue
        if problem.code == "malformed":
            out.append(_invalid(name, value, sizes[name]))
        else:
            out.append(_oversubscribed(environ, name, value, sizes[name], where, planned=fields is not None))
    return out


def _invalid(name: str, value: str, size: int) -> Finding:
    crash, spaced = _crashes(name, value), bool(ascii_uint(value.strip()))
    return Finding(
        "omp-threads-invalid", "error" if crash else "warning",
        f"{name}={short(value)} " + ("has spaces around the number" if spaced else "is not a positive whole number"),
        GARBAGE[name] if crash else
        "Rayon reads the digits alone: with spaces it ignores the value and starts a thread per CPU" if spaced else
        "a pool count is one positive whole number: 0 gives OpenCV every CPU (and Rayon, by its documentation)",
        f"export {name}={size}, or unset it", env_fix={name: str(size)})


def _oversubscribed(environ: Mapping[str, str], name: str, value: str, size: int, where: str, *,
                    planned: bool) -> Finding:
    count = thread_count(value)
    pool = POOL_OF[name]
    mine = [n.strip() for n in environ.get(USER_POOLS_VARIABLE, "").split(",")]
    policy = environ.get(POLICY_VARIABLE, "")
    theirs = planned and name in mine
    if not planned:
        said, fix = f"above the {size} one rank takes ({where})", f"export {name}={size}, or {AFFRUN_FIX}"
    else:
        said = f"above the {size} its thread plan gives it (its threads inherit the main thread's mask: {where})"
        said += (f"; your value (AFFRUN_USER_POOLS), kept under --env-policy {policy or 'keep'}" if theirs else
                 f"; it is not a value affrun kept ({USER_POOLS_VARIABLE} does not name it): it was set after "
                 "the rank started")
        fix = f"export {name}={size} or unset it (affrun then sets it)" + (
            ", or drop --env-policy keep" if theirs and policy == "keep" else "")
    return Finding(
        "pool-oversubscribed", "warning",
        f"{name}={value.strip()} sizes the {pool} pool to {count} threads, {said}",  # a count: digits only
        "the pool starts more threads than its CPUs, which then take turns on them, and a parallel region ends "
        "with its slowest thread (4 DataLoader workers per GPU on 64 cores started 2,048 OpenCV threads and "
        "loaded about 4x slower: open-mmlab/mmdetection #6867)",
        fix, env_fix={name: str(size)})
