"""The one channel from the process that plans to each rank: ``AFFRUN_PLAN``, read and checked here.

The parent (:class:`launcher.bind.handoff.ParentPlan`) computes every rank's final binding once and writes it as
JSON; every process that applies a binding (``affrun exec``, the startup hook, ``bind_rank``) reads it here into a
:class:`Job` of :class:`RankRecord`\\ s: what applying takes (mask, memory nodes, variables, notes, the rank
line's fields) and nothing of the planner. Reading one imports no planner, topology, ``typing`` or
``dataclasses`` (tests/unit/test_import_graph.py, tests/system/test_light_imports.py). Every field is checked for
its type and range, and the plan for what a planner guarantees (:func:`check_job`), before anything is applied.
``AFFRUN_PLAN`` holds the JSON, the JSON compressed (``zlib+base64:``, above 32 KiB), or ``@FILE``. What it
carries and why it is checked: docs/design.md §9.
"""

from __future__ import annotations

import os

from launcher.base.choices import (
    APPLIED_MEM_POLICIES,
    BIND_MODES,
    ENV_POLICIES,
    GPU_ORDERS,
    MEM_BACKENDS,
    MODES,
    RANK_HOOKS,
    SHARED_MODES,
    SPILLS,
)
from launcher.base.cpulist import MAX_CPU_ID, MAX_NODE_ID, format_cpulist
from launcher.base.memnodes import memory_nodes_fault
from launcher.base.untrusted import BadJSON, ascii_uint, clip, load_json, short
from launcher.bind.fields import (
    BadPlan,
    boolean,
    choice,
    get_field,
    ids,
    integer,
    items,
    obj,
    string,
    string_map,
    strings,
)
from launcher.env.variables import (
    COMM_VARIABLE,
    POOL_OF,
    POOL_VARIABLES,
    THREAD_VARIABLES,
    USER_VARIABLES,
    affrun_variables,
)
from launcher.errors import LaunchError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a rank imports this module (docs/design.md §11)
if TYPE_CHECKING:
    from typing import Any

PLAN_VARIABLE = "AFFRUN_PLAN"
COMPRESSED_PREFIX = "zlib+base64:"
# The most a compressed plan may expand to when it is read (a value of 96 KiB could hold gigabytes).
PLAN_TEXT_LIMIT = 16 << 20
# A GPU's visible index; no machine has anywhere near this many.
MAX_GPU_INDEX = (1 << 16) - 1


class RankRecord:
    """One rank's binding, as its parent computed it: what to apply, and what the rank line shows. Its fields
    are a plan entry's (:class:`launcher.plan.planner.RankPlan`) and the variables the env policy decided."""

    __slots__ = ("comm_cpus", "compute_cores", "cpus", "gpu", "gpu_pci", "loader_cpus", "local_rank", "main_cpus",
                 "mem_nodes", "nic_device", "notes", "numa_nodes", "set", "shared", "spill_cpus", "spill_nodes",
                 "threads", "unset", "user_pools", "warnings")

    def __init__(self, d: dict[str, Any], env: dict[str, Any], index: int) -> None:
        what = f"ranks[{index}]"
        self.local_rank = integer(get_field(d, "local_rank", what), f"{what}.local_rank", index, index)
        self.cpus = ids(get_field(d, "cpus", what), f"{what}.cpus", MAX_CPU_ID)
        if not self.cpus:
            raise BadPlan(f"{what}.cpus is empty")
        self.compute_cores = tuple(ids(c, f"{what}.compute_cores[]", MAX_CPU_ID)
                                   for c in items(get_field(d, "compute_cores", what), f"{what}.compute_cores"))
        self.loader_cpus = ids(get_field(d, "loader_cpus", what), f"{what}.loader_cpus", MAX_CPU_ID)
        self.comm_cpus = ids(d.get("comm_cpus", []), f"{what}.comm_cpus", MAX_CPU_ID)
        inside = set(self.cpus)
        if not all(set(core) <= inside for core in self.compute_cores) or not set(self.loader_cpus) <= inside:
            raise BadPlan(f"{what}: compute_cores and loader_cpus must be CPUs of the rank's cpus")
        if not set(self.comm_cpus) <= inside:
            raise BadPlan(f"{what}: comm_cpus must be CPUs of the rank's cpus (its mask holds them)")
        self.main_cpus = ids(d.get("main_cpus", []), f"{what}.main_cpus", MAX_CPU_ID)
        if self.main_cpus and set(self.main_cpus) not in [set(core) for core in self.compute_cores]:
            raise BadPlan(f"{what}.main_cpus must be one of the rank's compute_cores (the main thread's core), not "
                          f"{short(format_cpulist(self.main_cpus), 40)}")
        gpu, pci = get_field(d, "gpu", what), d.get("gpu_pci")
        self.gpu = None if gpu is None else integer(gpu, f"{what}.gpu", 0, MAX_GPU_INDEX)
        self.gpu_pci = None if pci is None else string(pci, f"{what}.gpu_pci")
        self.numa_nodes = ids(get_field(d, "numa_nodes", what), f"{what}.numa_nodes", MAX_NODE_ID)
        self.mem_nodes = ids(get_field(d, "mem_nodes", what), f"{what}.mem_nodes", MAX_NODE_ID)
        self.threads = integer(get_field(d, "threads", what), f"{what}.threads", 1, MAX_CPU_ID + 1)
        self.shared = boolean(d.get("shared", False), f"{what}.shared")
        self.warnings = strings(d.get("warnings", []), f"{what}.warnings")
        strings(d.get("reasons", []), f"{what}.reasons")  # the plan's; a rank shows none of them
        self.spill_cpus = ids(d.get("spill_cpus", []), f"{what}.spill_cpus", MAX_CPU_ID)
        self.spill_nodes = ids(d.get("spill_nodes", []), f"{what}.spill_nodes", MAX_NODE_ID)
        nic = d.get("nic")
        self.nic_device = None if nic is None else string(get_field(obj(nic, f"{what}.nic"), "device", f"{what}.nic"),
                                                        f"{what}.nic.device")
        what = f"env[{index}]"
        self.set = string_map(get_field(env, "set", what), f"{what}.set", USER_VARIABLES)
        self.unset = strings(get_field(env, "unset", what), f"{what}.unset")
        if not set(self.unset) <= set(USER_VARIABLES) or set(self.unset) & set(self.set):
            raise BadPlan(f"{what}.unset must name variables affrun manages that it does not set")
        self.notes = strings(get_field(env, "notes", what), f"{what}.notes")
        self.user_pools = strings(env.get("user_pools", []), f"{what}.user_pools")
        if not set(self.user_pools) <= set(self.set) & set(POOL_OF):
            raise BadPlan(f"{what}.user_pools must name thread and pool counts that env[{index}].set holds")

    @property
    def compute_cpus(self) -> tuple[int, ...]:
        return tuple(sorted(p for core in self.compute_cores for p in core))

    def __repr__(self) -> str:
        return f"RankRecord(local_rank={self.local_rank}, cpus={format_cpulist(self.cpus)!r}, threads={self.threads})"


class Job:
    """What a rank reads from ``AFFRUN_PLAN``: every rank's record, the plan's shape, and how to apply them."""

    __slots__ = ("bind", "env_policy", "gpu_order", "identity", "mem_backend", "mem_policy", "mode", "rank_hooks",
                 "ranks", "reserved", "smt", "spill", "user_env", "verbose", "warnings")

    def __init__(self, d: dict[str, Any], identity: str) -> None:
        plan = obj(d.get("plan"), "plan")
        raw = items(get_field(plan, "ranks", "plan"), "plan.ranks")
        if not raw or len(raw) > MAX_CPU_ID + 1:
            raise BadPlan(f"plan.ranks must hold 1 to {MAX_CPU_ID + 1} ranks, not {len(raw)}")
        envs = items(get_field(d, "env", "the plan"), "env")
        if len(envs) != len(raw):
            raise BadPlan(f"env holds {len(envs)} entries for {len(raw)} ranks")
        self.ranks = tuple(RankRecord(obj(r, f"ranks[{i}]"), obj(e, f"env[{i}]"), i)
                           for i, (r, e) in enumerate(zip(raw, envs)))
        self.mode = choice(get_field(plan, "mode", "plan"), "plan.mode", MODES)
        self.smt = boolean(get_field(plan, "smt", "plan"), "plan.smt")
        self.gpu_order = choice(get_field(plan, "gpu_order", "plan"), "plan.gpu_order", GPU_ORDERS)
        self.warnings = strings(plan.get("warnings", []), "plan.warnings")
        self.reserved = ids(plan.get("reserved", []), "plan.reserved", MAX_CPU_ID)
        self.spill = choice(plan.get("spill", "none"), "plan.spill", SPILLS)
        self.bind = choice(d.get("bind"), "bind", BIND_MODES)
        self.env_policy = choice(d.get("env_policy"), "env_policy", ENV_POLICIES)
        self.mem_policy = choice(d.get("mem_policy"), "mem_policy", APPLIED_MEM_POLICIES)  # resolved: no "auto"
        self.mem_backend = choice(d.get("mem_backend"), "mem_backend", MEM_BACKENDS)
        self.user_env = string_map(d.get("user_env", {}), "user_env", USER_VARIABLES)
        self.verbose = boolean(d.get("verbose", False), "verbose")
        self.rank_hooks = choice(d.get("rank_hooks", "auto"), "rank_hooks", RANK_HOOKS)
        self.identity = identity  # names this plan in every binding made from it (AFFRUN_PLAN_ID)

    @property
    def size(self) -> int:
        return len(self.ranks)

    def variables(self, rank: RankRecord) -> dict[str, str]:
        """Every variable ``rank`` gets: the OpenMP/BLAS ones its parent decided and affrun's own ``AFFRUN_*``."""
        return {**rank.set, **affrun_variables(rank, len(self.ranks), self.bind, policy=self.env_policy,
                                               hooks=self.rank_hooks, user_pools=rank.user_pools)}


def read_job(value: str) -> Job:
    """The :class:`Job` in ``AFFRUN_PLAN``'s ``value``, checked; one :class:`LaunchError` line for anything wrong."""
    if value.startswith(COMPRESSED_PREFIX):
        value = _decompressed(value[len(COMPRESSED_PREFIX):])
    elif value.startswith("@"):
        value = _plan_file(value[1:])
    kind = _not_an_object(value)
    if kind:
        raise LaunchError(f"{PLAN_VARIABLE} is not a plan written by affrun: it holds {kind} where a plan "
                          "object ({...}) is expected")
    try:
        d = load_json(value, finite=True)
        job = Job(obj(d, "the plan"), identity(value))
        check_job(job)
    except (BadJSON, BadPlan) as exc:
        raise LaunchError(f"{PLAN_VARIABLE} is not a plan written by affrun: {exc}") from None
    return job


def identity(text: str) -> str:
    """A short fingerprint of a plan's JSON (CRC-32), the value of ``AFFRUN_PLAN_ID``: tells a binding made from
    this plan from one made from another. Not a secret: it only has to differ between plans."""
    import zlib  # a small C module (hashlib would load OpenSSL)

    return f"{zlib.crc32(text.encode('utf-8', 'surrogateescape')):08x}"


# --------------------------------------------------------------------------------------------- the value's forms
def _decompressed(data: str) -> str:
    import binascii
    import zlib

    what = f"{PLAN_VARIABLE}={COMPRESSED_PREFIX}... is damaged"
    try:
        packed = binascii.a2b_base64(data.encode("ascii"), strict_mode=True)
    except (UnicodeEncodeError, binascii.Error, ValueError):
        raise LaunchError(f"{what}: not base64 text (affrun writes the plan's compressed JSON there)") from None
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(packed, PLAN_TEXT_LIMIT)
    except zlib.error:
        raise LaunchError(f"{what}: not zlib data (affrun writes the plan's compressed JSON there)") from None
    if inflate.unconsumed_tail:
        raise LaunchError(f"{what}: it expands to more than {PLAN_TEXT_LIMIT >> 20} MiB, which no plan does")
    if not inflate.eof:
        raise LaunchError(f"{what}: the compressed data is cut short")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise LaunchError(f"{what}: it does not expand to UTF-8 text") from None


def _plan_file(path: str) -> str:
    """The text of the plan file ``AFFRUN_PLAN=@path`` names; one line for a name or a file that cannot be one."""
    import stat

    shown = f"{PLAN_VARIABLE}=@{path}"  # error_line bounds the line: a long name keeps its start and its end
    if not path.strip():
        blank = "an empty file name" if not path else "a file name of only blanks"
        raise LaunchError(f"{PLAN_VARIABLE}={short('@' + path)} names no plan file: {blank} after @")
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as exc:
        if isinstance(exc, FileNotFoundError):
            reason = "no such file (removed since the job started, or from another machine?)"
        else:
            reason = getattr(exc, "strerror", None) or "not a usable file name"
        raise LaunchError(f"{shown}: the plan file cannot be read: {reason}") from None
    if stat.S_ISDIR(mode):
        raise LaunchError(f"{shown}: a directory, where a plan file is expected")
    if not stat.S_ISREG(mode):
        raise LaunchError(f"{shown}: not a regular file (a device, FIFO or socket), where a plan file is expected")
    from launcher.topology._files import read_document

    data = read_document(path, "the plan file AFFRUN_PLAN names", LaunchError)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise LaunchError(f"{shown}: the plan file is not UTF-8 text") from None


def _not_an_object(text: str) -> str:
    """What ``text`` holds when it is JSON but no object (``a number``, ``a list``...); ``""`` otherwise (an object,
    or not JSON: :func:`read_job` says so)."""
    head = text.lstrip(" \t\r\n")
    if head.startswith("{"):
        return ""
    if not head:
        return "nothing (an empty value)"
    import json

    try:
        value = json.loads(head, parse_constant=float)  # NaN, Infinity: numbers too, to the user
    except RecursionError:
        return "a list nested too deeply" if head[0] == "[" else ""
    except json.JSONDecodeError:
        return ""
    except ValueError:  # an integer of more than 4,300 digits
        return f"a number ({clip(head, 40)})"
    if isinstance(value, bool) or value is None:
        return head.split(None, 1)[0][:5]
    kind = "a string" if isinstance(value, str) else "a list" if isinstance(value, list) else "a number"
    return f"{kind} ({clip(head.rstrip(), 40)})"


# --------------------------------------------------------------------------------------------- what a planner makes
def check_job(job: Job) -> None:
    """Refuse a plan that has the right form but that no planner could have made (:class:`BadPlan`): more threads
    than compute cores, loader CPUs that are not apart from the compute ones, ``shared`` outside the shared modes,
    two ranks on one CPU unless both share it (``numa``, ``socket``) or the user mapped it so (``map``), memory
    nodes that are not the rank's, thread counts in the environment that are neither the plan's nor the user's."""
    if job.mode != "map":
        _check_sharing(job)
    mains: dict[int, int] = {}
    for rank in job.ranks:
        _check_rank(job, rank)
        for cpu in rank.main_cpus:
            if mains.setdefault(cpu, rank.local_rank) != rank.local_rank:
                raise BadPlan(f"ranks {mains[cpu]} and {rank.local_rank} have the same main core (CPU {cpu})")


def _check_rank(job: Job, rank: RankRecord) -> None:
    """What :func:`launcher.plan.planner.make_plan` guarantees of each rank (docs/how-it-decides.md, steps 3 to 6)."""
    what = f"ranks[{rank.local_rank}]"
    compute = [p for core in rank.compute_cores for p in core]
    if not rank.compute_cores or not all(rank.compute_cores):
        raise BadPlan(f"{what}.compute_cores is empty or holds an empty core: a rank computes on at least one core")
    if len(set(compute)) != len(compute):
        raise BadPlan(f"{what}.compute_cores lists a CPU in two cores")
    parts = (set(compute), set(rank.loader_cpus), set(rank.comm_cpus))
    rest = set(rank.cpus) - parts[0] - parts[1] - parts[2]
    sharers = {p for r in job.ranks if r is not rank and r.shared and r.cpus == rank.cpus for p in r.comm_cpus}
    if sum(map(len, parts)) != len(set().union(*parts)) or (rest and not (rank.shared and rest <= sharers)):
        raise BadPlan(f"{what}: compute_cores, loader_cpus and comm_cpus must split the rank's cpus (no CPU in two, "
                      "none in neither but the comm CPUs of ranks sharing them)")
    comm_value = rank.set.get(COMM_VARIABLE)
    off_main = sorted(set(rank.cpus) - set(rank.main_cpus)) or rank.cpus  # NCCL's home with a main core
    ours = format_cpulist(rank.comm_cpus or (off_main if rank.main_cpus else ()))
    if comm_value is not None and comm_value != ours and comm_value != job.user_env.get(COMM_VARIABLE):
        raise BadPlan(f"env[{rank.local_rank}].set: {COMM_VARIABLE}={short(comm_value, 20)} is neither the rank's "
                      "comm CPUs (its CPUs off its main core) nor the user's value")
    units = len(compute) if job.smt else len(rank.compute_cores)
    if rank.threads > units:
        raise BadPlan(f"{what}.threads is {rank.threads}, more than its {units} compute "
                      f"{'hardware thread(s)' if job.smt else 'core(s)'} (plan.smt {str(job.smt).lower()})")
    if rank.shared and job.mode not in SHARED_MODES:
        raise BadPlan(f"{what}.shared is true in plan.mode {job.mode}: only numa and socket ranks share CPUs")
    spill = set(rank.spill_cpus)
    if not spill <= set(rank.cpus) or (job.spill == "none" and (spill or rank.spill_nodes)) or (
            job.spill == "loader" and not spill <= set(rank.loader_cpus)) or (
            job.spill == "compute" and not spill <= set(compute) | set(rank.comm_cpus) | sharers):
        raise BadPlan(f"{what}.spill_cpus must be {job.spill} CPUs of the rank (plan.spill {job.spill})"
                      if job.spill != "none" else f"{what}: spill CPUs or nodes in a plan with plan.spill none")
    if not set(rank.cpus).isdisjoint(job.reserved):
        raise BadPlan(f"{what}.cpus holds CPUs of plan.reserved")
    fault = memory_nodes_fault(rank.numa_nodes, rank.mem_nodes)  # the planner's own normal form
    if fault:
        raise BadPlan(f"{what}.mem_nodes {fault}")
    for name in (*THREAD_VARIABLES, *POOL_VARIABLES):  # the plan's count, or the user's own value the policy kept
        value = rank.set.get(name)
        if value is None or value == job.user_env.get(name) or value == str(rank.threads):
            continue
        # the pools but OpenMP's are sized to the main thread's mask (launcher.plan.threads): at most the threads
        if POOL_OF[name] == "openmp" or not 1 <= (ascii_uint(value) or 0) <= rank.threads:
            raise BadPlan(f"env[{rank.local_rank}].set: {name}={short(value, 20)} is neither the rank's "
                          f"{rank.threads} threads (a pool: at most them) nor the user's value")
    if any(rank.set[name] != job.user_env.get(name) for name in rank.user_pools):
        raise BadPlan(f"env[{rank.local_rank}].user_pools names a count whose value is not the user's")


def _check_sharing(job: Job) -> None:
    """Outside ``map``, a CPU is in two ranks only when both share it (``numa``, ``socket``); a shared rank shares."""
    holders: dict[int, list[RankRecord]] = {}
    for rank in job.ranks:
        for cpu in rank.cpus:
            holders.setdefault(cpu, []).append(rank)
    for cpu, ranks in holders.items():
        if len(ranks) > 1 and not all(r.shared for r in ranks):
            a, b = ranks[0].local_rank, ranks[1].local_rank
            raise BadPlan(f"ranks {a} and {b} both have CPU {cpu} but are not shared (plan.mode {job.mode})")
    for rank in job.ranks:
        if rank.shared and all(len(holders[cpu]) == 1 for cpu in rank.cpus):
            raise BadPlan(f"ranks[{rank.local_rank}].shared is true but no other rank has its CPUs")
