"""Read a :class:`~launcher.plan.planner.Plan` back from JSON that another process wrote (``AFFRUN_PLAN``), checking it
like any other input.

``affrun torchrun`` writes the plan; each worker's ``affrun exec`` reads it from its environment, where anything
can have changed it (a user's script, a scheduler prolog, a copy-pasted variable). So every field is checked for
its type and range before a CPU mask or memory policy is built from it: CPU ids 0..``MAX_CPU_ID``, NUMA node ids
0..``MAX_NODE_ID``, known enumerated values only, and no CPU in two ranks unless the plan shares them (``numa``,
``socket``) or the user mapped them so (``map``). Standard library only: this runs before every rank.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from launcher.base.cpulist import MAX_CPU_ID, MAX_NODE_ID
from launcher.base.untrusted import short
from launcher.plan.planner import GPU_ORDERS, MODES, Plan, RankPlan
from launcher.plan.spill import SPILLS

if TYPE_CHECKING:
    from typing import Any, TypeVar

    C = TypeVar("C", bound=str)

# A GPU's visible index; no machine has anywhere near this many.
MAX_GPU_INDEX = (1 << 16) - 1


class BadPlan(ValueError):
    """A field of a plan is missing or has the wrong type or value (the message names it)."""


def _get(d: dict[str, Any], key: str, what: str) -> Any:
    if key not in d:
        raise BadPlan(f"{what}: missing \"{key}\"")
    return d[key]


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadPlan(f"{what} must be an object, not {short(value, 40)}")
    return value


def _int(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadPlan(f"{what} must be an integer from {low} to {high}, not {short(value, 40)}")
    return value


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise BadPlan(f"{what} must be true or false, not {short(value, 40)}")
    return value


def environment_string(value: str) -> bool:
    """Whether ``value`` can go into the environment (``os.environ``, ``execve``): no NUL byte, and encodable
    (a lone surrogate that JSON's ``\\ud800`` made is not)."""
    if "\0" in value:
        return False
    try:
        os.fsencode(value)  # what os.environ does with it
    except UnicodeError:
        return False
    return True


def _str(value: Any, what: str) -> str:
    """A string of the plan. Any of them may reach the environment or an error line: none may hold NUL."""
    if not isinstance(value, str):
        raise BadPlan(f"{what} must be a string, not {short(value, 40)}")
    if not environment_string(value):
        raise BadPlan(f"{what} holds a NUL byte or a character the environment cannot hold: {short(value, 40)}")
    return value


def choice(value: Any, what: str, choices: tuple[C, ...]) -> C:
    """``value`` as the member of ``choices`` it equals (typed as their Literal); :class:`BadPlan` otherwise."""
    for member in choices:
        if isinstance(value, str) and value == member:
            return member
    raise BadPlan(f"{what} must be one of {', '.join(choices)}, not {short(value, 40)}")


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise BadPlan(f"{what} must be a list, not {short(value, 40)}")
    return value


def _ids(value: Any, what: str, high: int) -> tuple[int, ...]:
    items = tuple(_int(v, f"{what}[]", 0, high) for v in _list(value, what))
    if len(set(items)) != len(items):
        raise BadPlan(f"{what} lists an id twice")
    return items


def _strings(value: Any, what: str) -> tuple[str, ...]:
    return tuple(_str(v, f"{what}[]") for v in _list(value, what))


def string_map(value: Any, what: str, names: tuple[str, ...] | None = None) -> dict[str, str]:
    """An object of environment variables: every name one of ``names`` (when given), and a valid variable name
    (not empty, no ``=``, no NUL); every value a string the environment can hold."""
    d = _obj(value, what)
    for k, v in d.items():
        if not k or "=" in k or not environment_string(k) or (names is not None and k not in names):
            raise BadPlan(f"{what}: {short(k, 40)} is not " + ("one of the variables affrun sets" if names is not None
                                                               else "an environment variable name"))
        _str(v, f"{what}[{short(k, 40)}]")
    return dict(d)


def _rank(value: Any, index: int) -> RankPlan:
    what = f"ranks[{index}]"
    d = _obj(value, what)
    cpus = _ids(_get(d, "cpus", what), f"{what}.cpus", MAX_CPU_ID)
    if not cpus:
        raise BadPlan(f"{what}.cpus is empty")
    cores = tuple(_ids(c, f"{what}.compute_cores[]", MAX_CPU_ID)
                  for c in _list(_get(d, "compute_cores", what), f"{what}.compute_cores"))
    loader = _ids(_get(d, "loader_cpus", what), f"{what}.loader_cpus", MAX_CPU_ID)
    inside = set(cpus)
    if not all(set(core) <= inside for core in cores) or not set(loader) <= inside:
        raise BadPlan(f"{what}: compute_cores and loader_cpus must be CPUs of the rank's cpus")
    gpu = _get(d, "gpu", what)
    pci = d.get("gpu_pci")
    return RankPlan(
        local_rank=_int(_get(d, "local_rank", what), f"{what}.local_rank", index, index),
        cpus=cpus,
        compute_cores=cores,
        loader_cpus=loader,
        gpu=None if gpu is None else _int(gpu, f"{what}.gpu", 0, MAX_GPU_INDEX),
        gpu_pci=None if pci is None else _str(pci, f"{what}.gpu_pci"),
        numa_nodes=_ids(_get(d, "numa_nodes", what), f"{what}.numa_nodes", MAX_NODE_ID),
        mem_nodes=_ids(_get(d, "mem_nodes", what), f"{what}.mem_nodes", MAX_NODE_ID),
        threads=_int(_get(d, "threads", what), f"{what}.threads", 1, MAX_CPU_ID + 1),
        shared=_bool(d.get("shared", False), f"{what}.shared"),
        reasons=_strings(d.get("reasons", []), f"{what}.reasons"),
        warnings=_strings(d.get("warnings", []), f"{what}.warnings"),
        spill_cpus=_ids(d.get("spill_cpus", []), f"{what}.spill_cpus", MAX_CPU_ID),
        spill_nodes=_ids(d.get("spill_nodes", []), f"{what}.spill_nodes", MAX_NODE_ID),
    )


def plan_from_json(value: Any) -> Plan:
    """The :class:`Plan` that :meth:`Plan.to_dict` wrote as ``value``; :class:`BadPlan` for anything else."""
    d = _obj(value, "plan")
    raw_ranks = _list(_get(d, "ranks", "plan"), "plan.ranks")
    if not raw_ranks or len(raw_ranks) > MAX_CPU_ID + 1:
        raise BadPlan(f"plan.ranks must hold 1 to {MAX_CPU_ID + 1} ranks, not {len(raw_ranks)}")
    ranks = tuple(_rank(r, i) for i, r in enumerate(raw_ranks))
    mode = choice(_get(d, "mode", "plan"), "plan.mode", MODES)
    plan = Plan(
        ranks=ranks,
        mode=mode,
        smt=_bool(_get(d, "smt", "plan"), "plan.smt"),
        gpu_order=choice(_get(d, "gpu_order", "plan"), "plan.gpu_order", GPU_ORDERS),
        warnings=_strings(d.get("warnings", []), "plan.warnings"),
        reserved=_ids(d.get("reserved", []), "plan.reserved", MAX_CPU_ID),
        spill=choice(d.get("spill", "none"), "plan.spill", SPILLS),
    )
    check_plan(plan)
    return plan


def _check_rank(plan: Plan, rank: RankPlan) -> None:
    """What :func:`launcher.plan.planner.make_plan` guarantees of each rank (its module docstring, steps 3 to 6)."""
    what = f"ranks[{rank.local_rank}]"
    compute = [p for core in rank.compute_cores for p in core]
    if not rank.compute_cores or not all(rank.compute_cores):
        raise BadPlan(f"{what}.compute_cores is empty or holds an empty core: a rank computes on at least one core")
    if len(set(compute)) != len(compute):
        raise BadPlan(f"{what}.compute_cores lists a CPU in two cores")
    if not set(compute).isdisjoint(rank.loader_cpus) or set(compute) | set(rank.loader_cpus) != set(rank.cpus):
        raise BadPlan(f"{what}: compute_cores and loader_cpus must split the rank's cpus (no CPU in both, none in "
                      "neither)")
    units = len(compute) if plan.smt else len(rank.compute_cores)
    if rank.threads > units:
        raise BadPlan(f"{what}.threads is {rank.threads}, more than its {units} compute "
                      f"{'hardware thread(s)' if plan.smt else 'core(s)'} (plan.smt {str(plan.smt).lower()})")
    if rank.shared and plan.mode not in ("numa", "socket"):
        raise BadPlan(f"{what}.shared is true in plan.mode {plan.mode}: only numa and socket ranks share CPUs")
    spill = set(rank.spill_cpus)
    if not spill <= set(rank.cpus) or (plan.spill == "none" and (spill or rank.spill_nodes)) or (
            plan.spill == "loader" and not spill <= set(rank.loader_cpus)) or (
            plan.spill == "compute" and not spill <= set(compute)):
        raise BadPlan(f"{what}.spill_cpus must be {plan.spill} CPUs of the rank (plan.spill {plan.spill})"
                      if plan.spill != "none" else f"{what}: spill CPUs or nodes in a plan with plan.spill none")
    if not set(rank.cpus).isdisjoint(plan.reserved):
        raise BadPlan(f"{what}.cpus holds CPUs of plan.reserved")
    # A memory node is one of the rank's NUMA nodes, or the nearest node with memory that stands in for one of
    # them that has none (which is then not among its memory nodes).
    foreign = set(rank.mem_nodes) - set(rank.numa_nodes)
    if len(foreign) > len(set(rank.numa_nodes) - set(rank.mem_nodes)):
        raise BadPlan(f"{what}.mem_nodes names node(s) {','.join(map(str, sorted(foreign)))}, which stand in for "
                      "none of its numa_nodes")


def check_plan(plan: Plan) -> None:
    """Refuse a plan that has the right form but that no planner could have made (:class:`BadPlan`): more threads
    than compute cores, loader CPUs that are not apart from the compute ones, ``shared`` outside the shared modes,
    two ranks on one CPU unless both share it (``numa``, ``socket``) or the user mapped it so (``map``), memory
    nodes that are not the rank's. Every reader of ``AFFRUN_PLAN`` gets it through :func:`plan_from_json`."""
    if plan.mode != "map":
        _check_sharing(plan)
    for rank in plan.ranks:
        _check_rank(plan, rank)


def _check_sharing(plan: Plan) -> None:
    """Outside ``map``, a CPU is in two ranks only when both share it (``numa``, ``socket``); a shared rank shares."""
    holders: dict[int, list[RankPlan]] = {}
    for rank in plan.ranks:
        for cpu in rank.cpus:
            holders.setdefault(cpu, []).append(rank)
    for cpu, ranks in holders.items():
        if len(ranks) > 1 and not all(r.shared for r in ranks):
            a, b = ranks[0].local_rank, ranks[1].local_rank
            raise BadPlan(f"ranks {a} and {b} both have CPU {cpu} but are not shared (plan.mode {plan.mode})")
    for rank in plan.ranks:
        if rank.shared and all(len(holders[cpu]) == 1 for cpu in rank.cpus):
            raise BadPlan(f"ranks[{rank.local_rank}].shared is true but no other rank has its CPUs")
