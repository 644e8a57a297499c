"""Plan entry -> environment for every OpenMP/BLAS runtime family, and numactl arguments. Pure.

Sets the thread and pool counts, ``OMP_PLACES``, ``OMP_PROC_BIND`` and ``KMP_AFFINITY``, and judges the values the
user set by ``policy`` (``safe``, ``override``, ``keep``): docs/how-it-decides.md, "Values you already set".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.base.choices import (
    BIND_MODES,
    ENV_POLICIES,
    NIC_ENVS,
    RANK_HOOKS,
    AppliedMemPolicy,
    EnvPolicy,
    MemPolicy,
    NicEnv,
    OmpBind,
    RankHooks,
)
from launcher.base.cpulist import cpu_error, format_cpulist, parse_cpulist
from launcher.base.records import to_dict
from launcher.base.untrusted import ascii_uint, short
from launcher.env.omp_syntax import (
    ABSTRACT_PLACES,
    KMP_MODIFIERS,
    KMP_TYPES,
    PROC_BIND_VALUES,
    Tokens,
    kmp_type,
    omp_places,
    parse_gomp_cpu_affinity,
    place_list,
    read_proclist,
    thread_count,
)
from launcher.env.variables import (
    COMM_VARIABLE,
    DIGITS_ONLY_VARIABLES,
    POOL_OF,
    POOL_VARIABLES,
    THREAD_VARIABLES,
    affrun_variables,
)
from launcher.plan.planner import Plan, RankPlan
from launcher.plan.threads import ThreadPlan, thread_plan

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, Literal

    ProblemCode = Literal["malformed", "empty", "oversubscribed", "outside", "collapse", "disabled"]
KMP_DEFAULT = "granularity=fine"


# Every count the env policy sets and judges: the OpenMP/BLAS thread counts, then the other pools' (POOL_OF).
COUNT_VARIABLES = (*THREAD_VARIABLES, *POOL_VARIABLES)


@dataclass(frozen=True)
class RankEnvironment:
    set: dict[str, str]
    unset: tuple[str, ...]
    notes: tuple[str, ...]
    user_pools: tuple[str, ...] = ()  # the counts (COUNT_VARIABLES) whose value is the user's: AFFRUN_USER_POOLS

    def apply_to(self, environ: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in environ.items() if k not in self.unset}
        env.update(self.set)
        return env


class Problem(str):
    """Why a user's value is dangerous: the text people read, with a ``code`` that callers branch on (``affrun
    doctor``'s finding id)."""

    code: ProblemCode

    def __new__(cls, code: ProblemCode, text: str) -> Problem:
        self = super().__new__(cls, text)
        self.code = code
        return self


def rank_environment(
    rank: RankPlan,
    *,
    local_world_size: int,
    user_env: Mapping[str, str],
    bind: OmpBind = "rank",
    smt: bool = False,
    policy: EnvPolicy = "safe",
    nic_env: NicEnv = "none",
    hooks: RankHooks = "auto",
) -> RankEnvironment:
    """The variables to set (and unset) for ``rank``, given what the user had set in ``user_env``; ``nic_env``
    adds the rank's NIC variables (:func:`nic_variables`, a user's value kept unless ``policy`` is ``override``).
    Raises ``ValueError`` for an unknown ``bind``, ``policy``, ``nic_env`` or ``hooks``."""
    if bind not in BIND_MODES:
        raise ValueError(f"unknown bind mode {bind!r}")
    if policy not in ENV_POLICIES:
        raise ValueError(f"unknown policy {policy!r}")
    if nic_env not in NIC_ENVS or hooks not in RANK_HOOKS:
        raise ValueError(f"unknown NIC export {nic_env!r} or rank hooks {hooks!r}")
    cpus = set(rank.cpus)
    compute = set(rank.compute_cpus)
    threads = thread_plan(rank, 0)
    sizes = pool_sizes(threads)
    ours: dict[str, str] = {name: str(size) for name, size in sizes.items()}
    ours["OMP_PLACES"] = omp_places(rank, bind, smt)
    ours["OMP_PROC_BIND"] = "close"
    ours["KMP_AFFINITY"] = KMP_DEFAULT
    if rank.comm_cpus or rank.main_cpus:  # NCCL starts its proxies on its caller's mask: the main core
        ours[COMM_VARIABLE] = format_cpulist(rank.comm_cpus or threads.nccl_proxy.cpus)
    out: dict[str, str] = {}
    notes: list[str] = []
    unset: list[str] = []
    if rank.main_cpus and hooks == "none":
        notes.append(f"the main thread is bound to CPU(s) {format_cpulist(rank.main_cpus)} at import torch: with "
                     "--rank-hooks none, DataLoader workers forked after it stay there unless the script passes "
                     "worker_init_fn=launcher.torch.worker_init_fn")
    for name, value in ours.items():
        user = user_env.get(name)
        if user is None or user == value or policy == "override":
            if user is not None and user != value:
                notes.append(f"{name}={user} replaced by {value} (--env-policy override)")
            out[name] = value
            continue
        problem = _problem(name, user, cpus, compute=compute, threads=sizes.get(name, rank.threads))
        if policy == "keep" or problem is None:
            why = f"; {problem}" if problem else ""
            if name == "KMP_AFFINITY" and kmp_type(user):
                why += "; libiomp5 ignores OMP_PLACES and OMP_PROC_BIND when KMP_AFFINITY has a type (warning #182)"
            notes.append(f"keeping {name}={user} set by the user (affrun would set {value}){why}")
            out[name] = user
        else:
            notes.append(f"{name}={user} replaced by {value}: {problem}")
            out[name] = value
    gomp = user_env.get("GOMP_CPU_AFFINITY")
    if gomp is not None:
        problem = _problem("GOMP_CPU_AFFINITY", gomp, cpus, compute=compute)
        if problem and policy != "keep":
            unset.append("GOMP_CPU_AFFINITY")
            notes.append(f"GOMP_CPU_AFFINITY={gomp} removed: {problem}")
    for name, value in nic_variables(rank, nic_env).items():
        user = user_env.get(name)
        if user is not None and user != value and policy != "override":
            notes.append(f"keeping {name}={user} set by the user (affrun would set {value})")
            value = user
        elif user is not None and user != value:
            notes.append(f"{name}={user} replaced by {value} (--env-policy override)")
        out[name] = value
    mine = tuple(n for n in COUNT_VARIABLES if n in user_env and out[n] == user_env[n])
    out.update(affrun_variables(rank, local_world_size, bind, policy=policy, hooks=hooks, user_pools=mine))
    return RankEnvironment(out, tuple(unset), tuple(notes), mine)


def pool_sizes(threads: ThreadPlan) -> dict[str, int]:
    """Each count variable (:data:`COUNT_VARIABLES`) and the size of its pool in the rank's thread plan."""
    return {name: threads.pools[POOL_OF[name]] for name in COUNT_VARIABLES}


def nic_variables(rank: RankPlan, nic_env: NicEnv) -> dict[str, str]:
    """``--nic-env``'s variables for ``rank``: ``ucx``: ``UCX_NET_DEVICES`` = its NIC, when it has one; ``mpich``:
    ``MPICH_OFI_NIC_POLICY=GPU``, when it has a GPU (docs/nics.md)."""
    if nic_env == "ucx" and rank.nic is not None:
        return {"UCX_NET_DEVICES": rank.nic.device}
    if nic_env == "mpich" and rank.gpu is not None:
        return {"MPICH_OFI_NIC_POLICY": "GPU"}
    return {}


def variable_problem(name: str, value: str, cpus: set[int] | frozenset[int], *,
                     threads: int | None = None) -> Problem | None:
    """Why ``name=value`` is dangerous for a rank owning ``cpus`` (``None``: safe), for ``affrun doctor``.
    ``threads``: for a count, the size the rank's thread plan gives it; without it, the count of ``cpus``."""
    return _problem(name, value, set(cpus), threads=threads)


def _problem(
    name: str,
    value: str,
    cpus: set[int],
    *,
    compute: set[int] | None = None,
    threads: int | None = None,
) -> Problem | None:
    """Why a user's value is dangerous for a rank owning ``cpus``; ``None`` when it is safe. ``threads``: the
    count's limit (the rank's threads, or its pool's size); without it, the number of ``compute`` CPUs (default:
    ``cpus``). The rules: docs/how-it-decides.md, "Values you already set"."""
    spaced = value != value.strip()
    value = value.strip()
    if name in COUNT_VARIABLES:
        count = thread_count(value) if name in THREAD_VARIABLES else ascii_uint(value)
        if count is None or count < 1:
            return Problem("malformed", "not a positive thread count")
        if spaced and name in DIGITS_ONLY_VARIABLES:
            return Problem("malformed", "spaces around the number: OpenCV refuses it, Rayon ignores it")
        if threads is not None:
            if count > threads:
                takes = "compute CPUs take" if POOL_OF[name] == "openmp" else f"thread plan sizes its {POOL_OF[name]} pool"
                return Problem("oversubscribed", f"{count} threads oversubscribe the rank: its {takes} {threads}")
            return None
        limit = len(cpus if compute is None else compute)
        if count > limit:
            return Problem("oversubscribed", f"{count} threads oversubscribe the rank's {limit} compute CPU(s)")
        return None
    if name == "OMP_PROC_BIND":
        items = [v.strip().lower() for v in value.split(",")]
        return None if items and all(v in PROC_BIND_VALUES for v in items) else Problem("malformed", "not a valid OMP_PROC_BIND value")
    if name == "OMP_PLACES":
        if not value:
            return Problem("empty", "empty OMP_PLACES")
        base = value.split("(")[0].strip().lower()
        collapse = Problem("collapse", "pins the main thread to one place at import, and forked DataLoader workers inherit it")
        if base in ABSTRACT_PLACES:
            return collapse
        try:
            places = place_list(Tokens(value))
        except ValueError as exc:
            return Problem("malformed", cpu_error(exc, "not a valid OMP_PLACES value", "not a valid OMP_PLACES value ({})"))
        outside = {p for place in places for p in place} - cpus
        if outside:
            return Problem("outside", f"CPUs {format_cpulist(outside)} are outside the rank's CPUs")
        # One place is a confinement the user chose; of several, a narrow first place pins the main thread apart.
        return None if len(places) == 1 or places[0] >= (cpus if compute is None else compute) else collapse
    if name == "GOMP_CPU_AFFINITY":
        listed = parse_gomp_cpu_affinity(value)
        if listed is None:
            return Problem("malformed", "not a valid CPU list")
        ids = set(listed)
        outside = ids - cpus
        if outside:
            return Problem("outside", f"CPUs {format_cpulist(outside)} are outside the rank's CPUs")
        if compute is not None and len(compute) > 1:
            # libiomp5/libomp read it as an explicit proclist (a type: OMP_PLACES is then ignored), one CPU a thread
            return Problem("collapse", f"libiomp5 and libomp pin the main thread to CPU {listed[0]} (a proclist that "
                           "overrides OMP_PLACES), and forked DataLoader workers inherit it")
        return None
    if name == "KMP_AFFINITY":
        return kmp_affinity_problem(value, cpus)
    if name == COMM_VARIABLE:
        return _cpuset_problem(value, cpus)
    return None


def _cpuset_problem(value: str, cpus: set[int]) -> Problem | None:
    """``NCCL_PROXY_CPUSET``: a cpulist (NCCL's syntax) inside the rank's CPUs."""
    try:
        listed = parse_cpulist(value)
    except ValueError as exc:
        return Problem("malformed", cpu_error(exc, "not a cpu list", "not a cpu list ({})"))
    if not listed:
        return Problem("empty", "empty NCCL_PROXY_CPUSET")
    outside = listed - cpus
    return Problem("outside", f"CPUs {format_cpulist(outside)} are outside the rank's CPUs") if outside else None


def kmp_affinity_problem(value: str, cpus: set[int] | None) -> Problem | None:
    """Check a ``KMP_AFFINITY`` value: ``disabled``, empty, malformed, or a proclist outside ``cpus``."""
    text = value.strip()
    if not text:
        return Problem("empty", "empty KMP_AFFINITY")
    proclist: set[int] | None = None
    lowered = text.lower()
    if "proclist=" in lowered:
        start = lowered.index("proclist=")
        open_bracket = text.find("[", start)
        close_bracket = text.find("]", open_bracket)
        if open_bracket < 0 or close_bracket < 0:
            return Problem("malformed", "malformed proclist")
        try:
            places = read_proclist(Tokens(text[open_bracket + 1 : close_bracket]))
        except ValueError as exc:
            return Problem("malformed", cpu_error(exc, "malformed proclist", "malformed proclist ({})"))
        proclist = {p for place in places for p in place}
        text = text[:start] + text[close_bracket + 1 :]
    tokens = [t.strip().lower() for t in text.split(",") if t.strip()]
    types = [t for t in tokens if t in KMP_TYPES]
    for tok in tokens:
        if tok in KMP_TYPES or tok in KMP_MODIFIERS or ascii_uint(tok) is not None:
            continue
        if tok.startswith("granularity=") and tok.split("=", 1)[1] in ("fine", "thread", "core", "tile", "die",
                                                                       "socket", "package", "numa", "cache"):
            continue
        return Problem("malformed", f"malformed KMP_AFFINITY token {short(tok)}")
    if "disabled" in types:
        return Problem("disabled", "disabled: threads are not bound and migrate")
    if len(types) > 1:
        return Problem("malformed", "more than one affinity type")
    if proclist is not None and cpus is not None:
        outside = proclist - cpus
        if outside:
            return Problem("outside", f"proclist CPUs {format_cpulist(outside)} are outside the rank's CPUs")
    return None


def numactl_memory_args(mem_policy: str, nodes: Sequence[int]) -> list[str]:
    """numactl's memory-policy flag for ``nodes`` (``--membind=0,1``, ``--preferred=0``...), or none."""
    if not nodes or mem_policy not in ("membind", "preferred", "interleave"):
        return []
    joined = ",".join(map(str, nodes))
    return [{"membind": f"--membind={joined}", "preferred": f"--preferred={nodes[0]}",
             "interleave": f"--interleave={joined}"}[mem_policy]]


def numactl_args(rank: RankPlan, mem_policy: str, *, bind_cpus: bool = True) -> list[str]:
    """A ``numactl`` command equivalent to the rank's binding (``affrun plan --json``'s ``numactl``)."""
    args = ["numactl"]
    if bind_cpus:
        args.append(f"--physcpubind={format_cpulist(rank.cpus)}")
    return args + numactl_memory_args(mem_policy, rank.mem_nodes)


def effective_mem_policy(requested: MemPolicy, nodes_with_cpus: int) -> AppliedMemPolicy:
    """``auto`` means ``preferred`` on a machine with several NUMA nodes with CPUs, else ``none``."""
    if requested == "auto":
        return "preferred" if nodes_with_cpus > 1 else "none"
    return requested


def plan_json(plan: Plan, envs: Sequence[RankEnvironment], mem_policy: str,
              threads: Sequence[ThreadPlan] = ()) -> dict[str, object]:
    """The documented ``affrun plan --json`` contract: the plan plus each rank's environment, and its thread plan
    (``thread_plan``, when ``threads`` gives them)."""
    out: dict[str, Any] = to_dict(plan)
    ranks = []
    for i, (rank, entry, env) in enumerate(zip(plan.ranks, out["ranks"], envs)):
        if i < len(threads):
            entry = {**entry, "thread_plan": threads[i].to_dict()}
        entry = {**entry, "env": dict(env.set), "unset": list(env.unset), "notes": list(env.notes),
                 "mem_policy": mem_policy if rank.mem_nodes else "none",
                 "numactl": numactl_args(rank, mem_policy)}
        ranks.append(entry)
    out["ranks"] = ranks
    return out
