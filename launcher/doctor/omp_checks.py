"""Process checks: the environment one rank runs with (thread counts, OpenMP binding variables, ``KMP_*``
against the runtime in use), and where that environment binds the main thread."""

from __future__ import annotations

from collections.abc import Mapping

from launcher.base.choices import RANK_HOOKS
from launcher.base.cpulist import format_cpulist
from launcher.base.untrusted import ascii_uint, short
from launcher.bind.readback import exported_cpus
from launcher.doctor.check_base import (
    AFFRUN_FIX,
    INTEL_RUNTIMES,
    cores_in,
    gnu_only,
    gnu_possible,
    intel_possible,
    kmp_readers,
    rank_share,
    runtime_text,
)
from launcher.doctor.facts import Facts
from launcher.doctor.findings import Finding, Severity
from launcher.doctor.main_place import KMP_BINDING_TYPES, main_thread_place
from launcher.doctor.rank_fields import environ_fields
from launcher.env.omp_syntax import kmp_type, parse_places, thread_count
from launcher.env.policy import KMP_DEFAULT, kmp_affinity_problem, variable_problem
from launcher.env.variables import HOOKS_VARIABLE, MAIN_VARIABLE, PLACE_VARIABLES, THREAD_VARIABLES
from launcher.plan.kinds import plan_kinds, plural
from launcher.plan.threads import working_cpus
from launcher.topology.model import Topology


def check_kmp_affinity(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    """KMP_AFFINITY disabled, empty, malformed or naming CPUs outside the rank (when libiomp5/libomp may read it)."""
    value = environ.get("KMP_AFFINITY")
    if value is None or not intel_possible(facts):
        return []  # under libgomp alone the value is ignored: kmp-ignored-by-libgomp says so
    problem = kmp_affinity_problem(value, set(facts.rank_cpus))
    if problem is None:
        return []
    fix_env = {"KMP_AFFINITY": KMP_DEFAULT}
    runtime = kmp_readers(facts)
    if not value.strip():
        return [Finding(
            "kmp-affinity-empty", "warning", f"KMP_AFFINITY is set but empty ({runtime})",
            "libiomp5 warns and ignores it, so the binding the job script meant to set is silently missing",
            "unset KMP_AFFINITY, or give it a value (affrun uses KMP_AFFINITY=granularity=fine)", env_fix=fix_env)]
    if problem.code == "disabled":
        why = ("libiomp5/libomp threads are not bound: they migrate between cores and onto other ranks' cores; "
               "nothing fails, the job is only slow")
        version = facts.intel_openmp_version
        if version and _major(version) >= 2025:
            why += (f". intel-openmp {version} also aborts forked children with this value (OMP: Error #13: "
                    "Assertion failure), so DataLoader workers die with 'worker killed by signal: Aborted'")
        return [Finding(
            "kmp-affinity-disabled", "error", f"KMP_AFFINITY={value} ({runtime})", why,
            "unset KMP_AFFINITY or export KMP_AFFINITY=granularity=fine (affrun's value); to turn binding off "
            "use KMP_AFFINITY=none, never 'disabled'", env_fix=fix_env)]
    if problem.code == "outside":
        return [Finding(
            "kmp-proclist-outside", "error", f"KMP_AFFINITY={value}: {problem} ({format_cpulist(facts.rank_cpus)})",
            "libiomp5 drops the CPUs it may not use, and the remaining threads pile onto the CPUs left in the list",
            "list only the rank's CPUs in proclist, or drop proclist and " + AFFRUN_FIX, env_fix=fix_env)]
    return [Finding(
        "kmp-affinity-malformed", "warning", f"KMP_AFFINITY={value}: {problem} ({runtime})",
        "libiomp5 prints a warning and ignores the value: the intended binding does not happen",
        "fix the value (e.g. KMP_AFFINITY=granularity=fine,compact) or unset it and " + AFFRUN_FIX, env_fix=fix_env)]


def _major(version: str) -> int:
    head = version.split(".")[0]
    return ascii_uint(head) or 0


def check_thread_counts(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    """OMP/MKL/OPENBLAS thread counts: invalid, oversubscribing, unset with shared CPUs, or 1 on a big rank."""
    out: list[Finding] = []
    share = rank_share(environ, topology, facts)
    cpus, n_cores, sharing, per_rank = share.cpus, share.cores, share.sharing, share.per_rank
    cores_each, under_quota, where = share.cores_each, share.under_quota, share.where
    n_cpus = len(cpus)
    # affrun's own count for this rank: above the cores only with --smt (a thread per hardware thread, asked for)
    planned = ascii_uint(environ.get("AFFRUN_THREADS", "").strip()) if environ.get("AFFRUN_CPUS") else None
    for name in THREAD_VARIABLES:
        value = environ.get(name)
        if value is None:
            continue
        threads = thread_count(value)
        if threads is None:
            out.append(Finding(
                "omp-threads-invalid", "warning", f"{name}={short(value)} is not a positive integer",
                "the runtimes ignore it (some with a warning) and start one thread per CPU",
                f"export {name}={per_rank}", env_fix={name: str(per_rank)}))
            continue
        total = threads * sharing
        if total > n_cpus or total > n_cores:
            smt = total <= n_cpus and sharing == 1 and planned is not None and threads <= planned
            severity: Severity = "error" if total > n_cpus else "info" if smt else "warning"
            what = f"{name}={threads}" + (f" × {sharing} ranks = {total} threads" if sharing > 1 else " threads")
            limit = f"{n_cpus} CPUs" if total > n_cpus else f"{n_cores} cores ({n_cpus} hardware threads)"
            if smt:
                limit += f", as affrun planned (AFFRUN_THREADS={planned}: --smt gives a thread per hardware thread)"
            out.append(Finding(
                "omp-oversubscribed", severity, f"{what} on {limit}: {where}",
                "waiting OpenMP threads spin, so oversubscription costs far more than the ratio (2 ranks × 2 threads "
                "on 2 cores ran 12× to 50× slower than 1 thread each in affrun's measurements)"
                if severity == "error" else "two threads per core compete for one core's execution units",
                f"export {name}={per_rank}, or {AFFRUN_FIX}", env_fix={name: str(per_rank)}))
        elif name == "OMP_NUM_THREADS" and threads == 1 and per_rank >= 2:
            by = ("torchrun sets OMP_NUM_THREADS=1 when it is unset" if "TORCHELASTIC_RUN_ID" in environ
                  else "a launcher, job script or container hook set it")
            out.append(Finding(
                "omp-threads-one", "warning" if per_rank >= 4 else "info",
                f"OMP_NUM_THREADS=1 on a rank that owns {cores_each} cores ({where}); {by}",
                f"intra-op CPU work (preprocessing, CPU ops, optimizer steps on CPU) uses 1 of the {cores_each} cores",
                f"export OMP_NUM_THREADS={per_rank}{under_quota} before launching (torchrun keeps a value that is "
                "set), or " + AFFRUN_FIX, env_fix={name: str(per_rank)}))
    if "OMP_NUM_THREADS" not in environ and sharing > 1:
        out.append(Finding(
            "omp-threads-unset", "warning",
            f"OMP_NUM_THREADS is unset and {where}: each rank's OpenMP/BLAS runtimes start {n_cpus} threads, "
            f"{n_cpus * sharing} in all",
            "the ranks' threads oversubscribe the cores and spin against each other (torchrun sets 1 when it is "
            "unset; srun, mpirun and hand-written launchers do not)",
            f"export OMP_NUM_THREADS={per_rank}{under_quota}, or {AFFRUN_FIX}",
            env_fix={"OMP_NUM_THREADS": str(per_rank)}))
    return out


def check_binding_values(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    """OMP_PLACES / OMP_PROC_BIND / GOMP_CPU_AFFINITY that are malformed or name CPUs outside the rank."""
    out: list[Finding] = []
    for name in PLACE_VARIABLES:
        value = environ.get(name)
        if value is None or (name == "GOMP_CPU_AFFINITY" and not gnu_possible(facts)):
            continue
        problem = variable_problem(name, value, facts.rank_cpus)
        if problem is None or problem.code == "collapse":
            continue  # the collapse is judged by check_collapse_risk
        if problem.code == "outside":
            out.append(Finding(
                "places-outside-mask", "error", f"{name}={value}: {problem} ({format_cpulist(facts.rank_cpus)})",
                "the runtime drops places it may not use (libgomp: 'None of the places contain usable logical "
                "CPUs' when none remain); the threads of dropped places share the remaining CPUs",
                f"unset {name} and {AFFRUN_FIX}", env_fix={name: None}))
        else:
            out.append(Finding(
                "omp-binding-malformed", "warning", f"{name}={value}: {problem}",
                "the runtime warns and ignores it, so the intended binding does not happen",
                f"fix or unset {name}; {AFFRUN_FIX}", env_fix={name: None}))
    return out


def check_collapse_risk(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    """An OpenMP binding variable pins the main thread to a place narrower than the rank's CPUs (docs/design.md §2)."""
    found = main_thread_place(environ, facts.rank_cpus, topology, facts)
    if found is None:
        return []
    cause, place = found
    fields = environ_fields(environ, None)  # the comm cores, its own and its sharers': the CPUs of no OpenMP place
    comm = frozenset(fields.cpus) - frozenset(working_cpus(fields)) if fields else frozenset()
    if place >= facts.rank_cpus - comm:
        return []  # one place holding all the CPUs the rank computes on (affrun's; every comm core apart)
    when, inherits = _binding_runtime(cause, facts)
    main = exported_cpus(environ, MAIN_VARIABLE) & facts.rank_cpus
    if main and place <= main:
        return _main_core_risk(environ, cause, place, when)
    place_text = format_cpulist(place)
    fix_env: dict[str, str | None] = {n: None for n in PLACE_VARIABLES
                                      if n in environ}
    kmp = environ.get("KMP_AFFINITY")
    if kmp and kmp_type(kmp) in KMP_BINDING_TYPES:
        fix_env["KMP_AFFINITY"] = KMP_DEFAULT
    why = f"{inherits}: data loading runs on one core and starves the GPU, without any error"
    if facts.ranks_sharing > 1:
        return [Finding(
            "collapse-risk", "error",
            f"{cause} without a per-rank CPU mask: all {facts.ranks_sharing} local ranks pin their main thread to "
            f"CPU {place_text} {when}",
            "the ranks' main threads and all their workers share that place; " + why,
            "launch with `affrun torchrun` / `affrun exec` (a per-rank mask and one place holding all the rank's "
            f"CPUs), or unset {', '.join(fix_env)}", env_fix=fix_env)]
    planned_loaders = environ.get("AFFRUN_LOADER_CPUS", "")
    core_mode = environ.get("AFFRUN_OMP_BIND") == "core"
    severity: Severity = "info" if planned_loaders or core_mode else "warning"
    return [Finding(
        "collapse-risk", severity,
        f"{cause} pins the main thread to CPU {place_text} of the rank's CPUs {format_cpulist(facts.rank_cpus)} "
        f"{when}",
        why,
        "start DataLoader workers with worker_init_fn=launcher.torch.worker_init_fn (or affrun --loader-cores)"
        if core_mode or planned_loaders else
        f"unset {', '.join(fix_env)} and launch with `affrun torchrun` / `affrun exec` (one place per rank), or "
        "pass worker_init_fn=launcher.torch.worker_init_fn to the DataLoader",
        env_fix={} if core_mode or planned_loaders else fix_env)]


def _binding_runtime(cause: str, facts: Facts) -> tuple[str, str]:
    """(when the runtime that reads ``cause`` binds the main thread, what the processes started afterwards
    inherit), as measured with torch 2.13 (docs/doctor.md, docs/design.md §3)."""
    libgomp = ("at `import torch`", "DataLoader workers, multiprocessing children and subprocesses started "
               "afterwards inherit that single place (libgomp)")
    iomp5 = ("at its first parallel region", "subprocesses and spawn or forkserver workers started afterwards "
             "inherit that single place; libiomp5 gives a fork()ed child (a DataLoader's default worker) its full "
             "mask back (KMP_INIT_AT_FORK), so forked workers escape it, but the main thread stays on it")
    llvm = ("when it starts (under torch: at `import torch`)", "every process started afterwards inherits that "
            "single place, forked DataLoader workers too (LLVM libomp 14 and 16 under torch)")
    if cause.startswith("KMP_AFFINITY"):  # read by libiomp5 and libomp only
        return llvm if "libomp" in facts.openmp and "libiomp5" not in facts.openmp else iomp5
    if gnu_possible(facts):
        return libgomp  # torch's libgomp binds at its load, before any other runtime's first region
    return llvm if "libomp" in facts.openmp and "libiomp5" not in facts.openmp else iomp5


def _main_core_risk(environ: Mapping[str, str], cause: str, place: frozenset[int], when: str) -> list[Finding]:
    """The first place is the rank's main core (``AFFRUN_MAIN_CPUS``): the plan, a risk only where the rank's hooks
    do not re-home its workers (``AFFRUN_RANK_HOOKS`` other than auto)."""
    hooks = environ.get(HOOKS_VARIABLE) or "auto"
    if hooks == "auto":
        return []
    hooks = hooks if hooks in RANK_HOOKS else short(hooks, 20)
    return [Finding(
        "collapse-risk", "warning",
        f"{cause} pins the main thread to its own core, CPU {format_cpulist(place)} ({MAIN_VARIABLE}, "
        f"--main-thread) {when}, and with {HOOKS_VARIABLE}={hooks} nothing moves the DataLoader workers "
        "forked after it off that core",
        "forked workers (and the pin-memory thread) start on the main thread's core: data loading then shares the "
        "one core that launches the GPU's kernels, and slows both, without any error",
        "pass worker_init_fn=launcher.torch.worker_init_fn to each DataLoader (it moves every worker to its home "
        "off the main core), or launch with --rank-hooks auto (the default), whose hooks do it")]


# KMP_* variables that change nothing about binding or threads (diagnostics, fork behaviour, duplicate-library guard)
KMP_HARMLESS = ("KMP_DUPLICATE_LIB_OK", "KMP_WARNINGS", "KMP_SETTINGS", "KMP_VERSION", "KMP_INIT_AT_FORK")
KMP_COUNTERPARTS = {
    "KMP_AFFINITY": (("OMP_PLACES", "OMP_PROC_BIND"), "bind with a process mask and OMP_PLACES/OMP_PROC_BIND, "
                     "which libgomp reads: " + AFFRUN_FIX.replace("set it", "do both")),
    "KMP_BLOCKTIME": (("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"), "use OMP_WAIT_POLICY=PASSIVE (for KMP_BLOCKTIME=0) "
                      "or GOMP_SPINCOUNT"),
    "KMP_HW_SUBSET": ((), "restrict the CPUs with the process mask instead (affrun --cpus, taskset)"),
}


def check_kmp_ignored(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    """KMP_* variables that do something in libiomp5, while the only OpenMP runtime is libgomp."""
    if not gnu_only(facts):
        return []
    ignored: list[str] = []
    uncovered: list[str] = []
    fixes: list[str] = []
    for name in sorted(environ):
        if not name.startswith("KMP_") or name in KMP_HARMLESS:
            continue
        value = environ[name]
        if name == "KMP_AFFINITY" and value.strip() and kmp_type(value) is None and "proclist" not in value.lower():
            continue  # only a granularity (affrun's own value): nothing to ignore
        ignored.append(f"{name}={value}")
        counterparts, fix = KMP_COUNTERPARTS.get(name, ((), f"find {name}'s OMP_*/GOMP_* counterpart"))
        if not any(environ.get(c) for c in counterparts):
            uncovered.append(name)
        fixes.append(fix)
    if not ignored:
        return []
    return [Finding(
        "kmp-ignored-by-libgomp", "warning" if uncovered else "info",
        f"{', '.join(ignored)} set, but {runtime_text(facts)} ignores KMP_* variables",
        "the setting does nothing (no error, no warning): the threads are not bound or tuned as intended"
        + ("" if uncovered else "; the OMP_* variables that are set do the job")
        + ". It still counts for anything here that loads another runtime: numpy or MKL builds linked to libiomp5 "
          "(conda's), the intel-openmp wheel's libiomp5 (MKL's intel threading layer), and LLVM libomp (clang "
          "-fopenmp, conda's llvm-openmp) all read KMP_*",
        "; ".join(dict.fromkeys(fixes)))]


def check_mixed_runtimes(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    if not ("libgomp" in facts.openmp and any(r in INTEL_RUNTIMES for r in facts.openmp)):
        return []
    return [Finding(
        "openmp-runtimes-mixed", "warning", f"two OpenMP runtimes in one process: {runtime_text(facts)}",
        "each runtime keeps its own thread pool, so the process runs twice the threads it was given; with binding "
        "variables libgomp pins the main thread first and libiomp5 then sees one CPU for all its threads",
        "use one runtime: drop the LD_PRELOAD of libiomp5 for torch (its wheels use libgomp), or set "
        "MKL_THREADING_LAYER=GNU for MKL")]


def check_core_kinds_mixed(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    """On a hybrid CPU, a team that must span core kinds: more threads than the fastest kind's cores in the rank's
    CPUs, or places past the main thread's on two kinds (docs/planner.md "Core kinds")."""
    planned = plan_kinds(topology)  # the planner's kinds: none where they are priority classes (SST-BF)
    kinds = planned.restricted(facts.rank_cpus) if planned else None
    if kinds is None or not kinds.hybrid:
        return []
    fast = kinds.kinds[0]
    sharing = max(facts.ranks_sharing, 1)
    per_rank = max(1, cores_in(fast.cpus, topology) // sharing)
    named = f"{fast.name} CPUs {format_cpulist(fast.cpus)}"
    fix = (f"export OMP_NUM_THREADS={per_rank} and bind the team to the {named}, or {AFFRUN_FIX} (one kind per "
           "team, slower cores for DataLoader workers)")
    why = "an OpenMP parallel region ends when its slowest thread does: the slower cores gate every region"
    value = environ.get("OMP_NUM_THREADS")
    threads = len(facts.rank_cpus) if value is None else thread_count(value)
    out: list[Finding] = []
    if threads is not None and threads > per_rank:
        what = f"OMP_NUM_THREADS={value}" if value is not None else f"OMP_NUM_THREADS unset ({threads} threads)"
        out.append(Finding(
            "core-kinds-mixed", "warning",
            f"{what} on a rank whose CPUs {format_cpulist(facts.rank_cpus)} hold {plural(per_rank, fast.name)} per rank "
            f"({', '.join(f'{k.name} {format_cpulist(k.cpus)}' for k in kinds.kinds)}): the team spans core kinds",
            why, fix, env_fix={"OMP_NUM_THREADS": str(per_rank)}))
    places = parse_places(environ.get("OMP_PLACES", "")) if "OMP_PLACES" in environ else None
    team = places[1:(threads or len(places))] if places and len(places) > 1 else places or []
    used = {k.name for place in team for cpu in place if (k := kinds.kind_of(cpu))}
    if len(used) > 1 and not out:
        out.append(Finding(
            "core-kinds-mixed", "warning",
            f"OMP_PLACES puts the team's threads on {' and '.join(sorted(used))} CPUs: the team spans core kinds",
            why, fix, env_fix={"OMP_NUM_THREADS": str(per_rank)}))
    return out
