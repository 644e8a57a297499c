"""The one channel from the process that plans to each rank: ``AFFRUN_PLAN`` (the JSON of a
:class:`launcher.plan.record.Handoff`, compressed above 32 KiB), read into a :class:`Job` and checked here before
anything is applied, importing no planner or topology. What it carries and why it is checked: docs/design.md §9.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.base.cpulist import format_cpulist
from launcher.base.errors import LaunchError
from launcher.base.records import BadRecord, from_dict
from launcher.base.untrusted import BadJSON, ascii_uint, clip, load_json, short
from launcher.bind.inherited import binding_fault
from launcher.env.variables import POOL_OF, USER_VARIABLES
from launcher.plan.record import SCHEMA, Handoff, Plan, RankEnv, RankPlan

PLAN_VARIABLE = "AFFRUN_PLAN"
COMPRESSED_PREFIX = "zlib+base64:"
PLAN_TEXT_LIMIT = 16 << 20  # the most a compressed plan may expand to (96 KiB of zlib could hold gigabytes)


@dataclass(frozen=True)
class Job:
    """What a rank reads from ``AFFRUN_PLAN``: the hand-off, and the identity of its JSON (``AFFRUN_PLAN_ID``,
    which names this plan in every binding made from it)."""

    handoff: Handoff
    identity: str

    @property
    def plan(self) -> Plan:
        return self.handoff.plan

    @property
    def ranks(self) -> tuple[RankPlan, ...]:
        return self.handoff.plan.ranks

    @property
    def size(self) -> int:
        return len(self.handoff.plan.ranks)

    def env(self, rank: RankPlan) -> RankEnv:
        """The variables the parent's env policy decided for ``rank``."""
        return self.handoff.env[rank.local_rank]


def read_job(value: str) -> Job:
    """The :class:`Job` in ``AFFRUN_PLAN``'s ``value``, checked; one :class:`LaunchError` line for anything wrong."""
    if value.startswith(COMPRESSED_PREFIX):
        value = _decompressed(value[len(COMPRESSED_PREFIX):])
    elif value.startswith("@"):
        raise LaunchError(f"{PLAN_VARIABLE}={short(value, 40)} names a plan file (@FILE), which affrun no longer "
                          "reads: a plan travels in the variable itself")
    kind = _not_an_object(value)
    if kind:
        raise LaunchError(f"{PLAN_VARIABLE} is not a plan written by affrun: it holds {kind} where a plan "
                          "object ({...}) is expected")
    try:
        d = load_json(value, finite=True)
        if isinstance(d, dict) and d.get("schema") != SCHEMA:
            raise BadRecord(f"its \"schema\" is {short(d.get('schema'), 20)}, not {SCHEMA} (another version of "
                            "affrun wrote it)")
        handoff = from_dict(Handoff, d, "")
        check_handoff(handoff)
    except (BadJSON, BadRecord) as exc:
        raise LaunchError(f"{PLAN_VARIABLE} is not a plan written by affrun: {exc}") from None
    return Job(handoff, identity(value))


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


# --------------------------------------------------------------------------------------------- what protects the user
def check_handoff(handoff: Handoff) -> None:
    """Refuse (:class:`BadRecord`) a plan whose ranks could not be bound as it says, or that sets variables affrun
    does not manage (the list: docs/design.md §9)."""
    ranks = handoff.plan.ranks
    if not ranks:
        raise BadRecord("plan.ranks is empty: a plan has at least one rank")
    if len(handoff.env) != len(ranks):
        raise BadRecord(f"env holds {len(handoff.env)} entries for {len(ranks)} ranks")
    _names(handoff.user_env, "user_env")
    if handoff.plan.mode != "map":
        _check_sharing(ranks, handoff.plan.mode)
    shared_comm: dict[tuple[int, ...], set[int]] = {}  # a shared mask: the comm CPUs of the ranks sharing it
    for rank in ranks:
        if rank.shared:
            shared_comm.setdefault(rank.cpus, set()).update(rank.comm_cpus)
    for i, (rank, env) in enumerate(zip(ranks, handoff.env)):
        if rank.local_rank != i:
            raise BadRecord(f"plan.ranks[{i}].local_rank is {rank.local_rank}, not {i}")
        _check_rank(rank, shared_comm.get(rank.cpus, set()) if rank.shared else set(), f"plan.ranks[{i}]")
        _check_env(env, rank, handoff.user_env, f"env[{i}]")


def _check_rank(rank: RankPlan, shared_comm: set[int], what: str) -> None:
    fault = binding_fault(rank)
    if fault:
        raise BadRecord(f"{what}: {fault}")
    compute = [p for core in rank.compute_cores for p in core]
    parts = (compute, rank.loader_cpus, rank.comm_cpus)
    if not all(rank.compute_cores) or sum(map(len, parts)) != len(set().union(*parts)):
        raise BadRecord(f"{what}: compute_cores, loader_cpus and comm_cpus must split its cpus (no CPU in two, no "
                        "empty core)")
    rest = set(rank.cpus).difference(*parts)  # in a shared mask: the comm CPUs of the ranks sharing it
    if rest - shared_comm:
        raise BadRecord(f"{what}: CPUs {clip(format_cpulist(rest), 40)} of its cpus are neither compute, loader nor "
                        "comm CPUs")
    if rank.main_cpus and set(rank.main_cpus) not in [set(core) for core in rank.compute_cores]:
        raise BadRecord(f"{what}.main_cpus must be one of its compute_cores (the main thread's core), not "
                        f"{clip(format_cpulist(rank.main_cpus), 40)}")


def _names(variables: dict[str, str], what: str) -> None:
    for name in variables:
        if name not in USER_VARIABLES:
            raise BadRecord(f"{what}: {short(name, 40)} is not one of the variables affrun sets")


def _check_env(env: RankEnv, rank: RankPlan, user_env: dict[str, str], what: str) -> None:
    _names(env.set, f"{what}.set")
    if not set(env.unset) <= set(USER_VARIABLES) or set(env.unset) & set(env.set):
        raise BadRecord(f"{what}.unset must name variables affrun manages that it does not set")
    if not set(env.user_pools) <= set(env.set) & set(POOL_OF):
        raise BadRecord(f"{what}.user_pools must name thread and pool counts that {what}.set holds")
    for name, value in env.set.items():  # a pool is at most the rank's threads, unless the user gave its size
        if name in POOL_OF and value != user_env.get(name) and not 1 <= (ascii_uint(value) or 0) <= rank.threads:
            raise BadRecord(f"{what}.set: {name}={short(value, 20)} is neither a count of 1 to the rank's "
                            f"{rank.threads} threads nor the user's value")


def _check_sharing(ranks: tuple[RankPlan, ...], mode: str) -> None:
    """Outside ``map``, a CPU is in two ranks only when both share it (``numa``, ``socket``)."""
    holders: dict[int, RankPlan] = {}
    for rank in ranks:
        for cpu in rank.cpus:
            other = holders.setdefault(cpu, rank)
            if other is not rank and not (other.shared and rank.shared):
                raise BadRecord(f"ranks {other.local_rank} and {rank.local_rank} both have CPU {cpu} but are not "
                                f"shared (plan.mode {mode})")
