"""The plan's trip from the process that plans (``affrun torchrun``, ``affrun run``, ``affrun exec`` on its own)
to each rank: :func:`plan_job` makes the plan once, :class:`ParentPlan` carries it in ``AFFRUN_PLAN``, and
:func:`rank_line` is the one summary line of a rank that every front end prints (:mod:`launcher.env.rank_line`
formats it).

Standard library and the pure core only: ``affrun exec`` imports it before every rank.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from launcher.base.untrusted import BadJSON, clip, load_json, short
from launcher.env.omp_syntax import BIND_MODES, OmpBind
from launcher.env.policy import ENV_POLICIES, USER_VARIABLES, EnvPolicy, effective_mem_policy
from launcher.env.rank_line import rank_summary
from launcher.errors import ConfigError, LaunchError
from launcher.options.plan_options import MEM_POLICIES, PlanOptions
from launcher.options.table import BINDING_OPTIONS, MEM_BACKENDS, MemBackend
from launcher.plan.planner import Plan, RankPlan

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from launcher.topology.model import Topology

PLAN_VARIABLE = "AFFRUN_PLAN"
# Written with AFFRUN_LOCAL_RANK by every binding made from a plan: ParentPlan.identity() of that plan. A process
# is "already bound" only when it carries the identity of the plan it reads (launcher.startup): an inherited
# AFFRUN_LOCAL_RANK of another binding (an outer affrun exec, a stale copy) is not proof.
PLAN_ID_VARIABLE = "AFFRUN_PLAN_ID"
# Above this size the plan's JSON travels compressed (AFFRUN_PLAN=zlib+base64:...), still in the variable: one
# environment string may not exceed 128 KiB (MAX_ARG_STRLEN), beyond which every worker's execve would fail.
INLINE_PLAN_LIMIT = 32 * 1024
COMPRESSED_PREFIX = "zlib+base64:"
# The longest AFFRUN_PLAN written, well under MAX_ARG_STRLEN (128 KiB for "NAME=value"), leaving room in the 2 MiB
# that execve allows for arguments and environment together. A plan of 512 ranks on 1,024 CPUs is 185 KB of JSON,
# 8 KB compressed.
ENV_PLAN_LIMIT = 96 * 1024
# The most a compressed plan may expand to when it is read (a value of ENV_PLAN_LIMIT could hold gigabytes).
PLAN_TEXT_LIMIT = 16 << 20
# The memory policies a plan carries: resolved, never "auto".
APPLIED_MEM_POLICIES = tuple(p for p in MEM_POLICIES if p != "auto")
# How children start `affrun exec`: not `python -m launcher`, which would import a `launcher.py` or `launcher/`
# from the user's working directory first. `-c` puts '' (the cwd) at sys.path[0]; drop it before importing.
BOOT = "import sys; del sys.path[0]; from launcher.main import main; main()"


def exec_prefix() -> list[str]:
    """The argv that starts ``affrun exec`` with this interpreter, safe from modules in the working directory."""
    return [sys.executable, "-c", BOOT, "exec"]


def rank_line(rank: RankPlan, size: int, mem: str, host: str) -> str:
    """The documented, parseable one-line summary of a rank (``--verbose``, ``affrun torchrun``):
    :func:`launcher.env.rank_line.rank_summary` of the plan's entry, after ``affrun:``."""
    return "affrun: " + rank_summary(rank.local_rank, size, host, rank.cpus, rank.numa_nodes, rank.gpu,
                                     rank.gpu_pci, rank.threads, rank.loader_cpus, mem)


@dataclass(frozen=True)
class ParentPlan:
    """What ``affrun torchrun`` hands to every worker's ``affrun exec`` through ``AFFRUN_PLAN``."""

    plan: Plan
    bind: OmpBind
    env_policy: EnvPolicy
    mem_policy: str  # already resolved (no "auto")
    mem_backend: MemBackend
    user_env: dict[str, str]  # the user's own values of the variables affrun sets, before torchrun touched them
    verbose: bool

    def to_json(self) -> str:
        import json  # the planning parent's, not the rank's

        return json.dumps(
            {
                "plan": self.plan.to_dict(),
                "bind": self.bind,
                "env_policy": self.env_policy,
                "mem_policy": self.mem_policy,
                "mem_backend": self.mem_backend,
                "user_env": self.user_env,
                "verbose": self.verbose,
            },
            separators=(",", ":"),
        )

    def to_env(self) -> str:
        """The value of ``AFFRUN_PLAN``: the JSON itself, or, above :data:`INLINE_PLAN_LIMIT`, the JSON compressed.

        The plan always travels in the variable, never in a file. A file must outlive the process that writes it
        (``affrun run`` execs the command, torchrun's agent can be SIGKILLed), so nobody can remove it when the job
        ends, a temporary-file cleaner can remove it while the job runs (every later process of the job would then
        fail), and it needs a writable temporary directory. An inherited descriptor or a memfd would not reach the
        ranks either: ``subprocess`` (torchrun, accelerate, Lightning) closes every descriptor above 2. The
        variable reaches every process the job starts, is gone with the job, and a plan's JSON compresses about
        25 times (its CPU lists repeat), far below what one variable may hold."""
        text = self.to_json()
        if len(text) <= INLINE_PLAN_LIMIT:
            return text
        import binascii
        import zlib

        value = COMPRESSED_PREFIX + binascii.b2a_base64(zlib.compress(text.encode("utf-8"), 9), newline=False).decode()
        if len(value) > ENV_PLAN_LIMIT:
            raise LaunchError(f"the plan of {len(self.plan.ranks)} ranks is too large to hand to them in "
                              f"{PLAN_VARIABLE}: {len(value)} bytes compressed, at most {ENV_PLAN_LIMIT}: "
                              "plan fewer ranks")
        return value

    @classmethod
    def from_env(cls, value: str) -> ParentPlan:
        """Read ``AFFRUN_PLAN``: the JSON, the compressed JSON (:meth:`to_env`), or ``@FILE``, a file that holds the
        JSON (affrun no longer writes one, but reads what a user or an older affrun wrote)."""
        if value.startswith(COMPRESSED_PREFIX):
            value = _decompressed(value[len(COMPRESSED_PREFIX):])
        elif value.startswith("@"):
            value = _plan_file(value[1:])
        kind = _not_an_object(value)
        if kind:
            raise LaunchError(f"{PLAN_VARIABLE} is not a plan written by affrun: it holds {kind} where a plan "
                              "object ({...}) is expected")
        return cls.from_json(value)

    @classmethod
    def from_json(cls, text: str) -> ParentPlan:
        """Parse and check ``AFFRUN_PLAN`` like any input: one :class:`LaunchError` line for anything wrong."""
        from launcher.plan.wire import BadPlan, choice, plan_from_json, string_map

        try:
            d = load_json(text)
            if not isinstance(d, dict):
                raise BadPlan(f"expected an object, not {short(d, 40)}")
            verbose = d.get("verbose", False)
            if not isinstance(verbose, bool):
                raise BadPlan(f"verbose must be true or false, not {short(verbose, 40)}")
            return cls(
                plan_from_json(d.get("plan")),
                choice(d.get("bind"), "bind", BIND_MODES),
                choice(d.get("env_policy"), "env_policy", ENV_POLICIES),
                choice(d.get("mem_policy"), "mem_policy", APPLIED_MEM_POLICIES),
                choice(d.get("mem_backend"), "mem_backend", MEM_BACKENDS),
                string_map(d.get("user_env", {}), "user_env", USER_VARIABLES),
                verbose,
            )
        except (BadJSON, BadPlan) as exc:
            raise LaunchError(f"{PLAN_VARIABLE} is not a plan written by affrun: {exc}") from None

    def identity(self) -> str:
        """A short fingerprint of this plan (CRC-32 of its JSON), the value of ``AFFRUN_PLAN_ID``: tells a binding
        made from this plan from one made from another. Not a secret: it only has to differ between plans."""
        import zlib  # a small C module (hashlib would load OpenSSL)

        return f"{zlib.crc32(self.to_json().encode('utf-8', 'surrogateescape')):08x}"


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
    or not JSON: :meth:`ParentPlan.from_json` says so)."""
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


def plan_job(
    values: Mapping[str, Any],
    nproc: int | None,
    *,
    environ: Mapping[str, str] | None = None,
    user_env: Mapping[str, str] | None = None,
    default_nproc: int | None = None,
) -> tuple[Topology, ParentPlan]:
    """Load the topology, plan ``nproc`` local ranks and resolve the memory policy, for every front end.

    ``values`` holds the binding options by their ``dest`` in :data:`~launcher.options.table.BINDING_OPTIONS`
    (a missing one takes the table's default) and ``verbose``. With ``nproc=None`` the job has one rank per
    ``--gpus``/``--map`` entry, else per visible GPU, else ``default_nproc`` (``None``: refuse, the caller must
    be told the count)."""
    from launcher.plan.planner import make_plan
    from launcher.topology import load_topology

    v = {spec.dest: spec.default for spec in BINDING_OPTIONS} | dict(values)
    opts = PlanOptions(**{f.name: v[f.name] for f in fields(PlanOptions)})
    topo = load_topology(fsroot=v["fsroot"], topology_file=v["topology_file"], cpus=v["cpus"], environ=environ,
                         gpus=not opts.no_gpu)
    if nproc is None:
        nproc = opts.rank_count() or (0 if opts.no_gpu else len(topo.visible_gpus())) or default_nproc
        if nproc is None:
            raise ConfigError("no GPU is visible to plan one rank per GPU: give --nproc-per-node N (the number of "
                              "processes the launcher starts)")
    plan = make_plan(topo, opts.request(nproc))
    mem = effective_mem_policy(v["mem_policy"], len(topo.cpu_nodes()))
    return topo, ParentPlan(plan, v["omp_bind"], v["env_policy"], mem, v["mem_backend"], dict(user_env or {}),
                            bool(v.get("verbose", False)))


def option_values(args: Any, prefix: str = "") -> dict[str, Any]:
    """The binding options (and ``verbose``) of an argparse namespace whose ``dest``s carry ``prefix``."""
    names = [spec.dest for spec in BINDING_OPTIONS] + ["verbose"]
    return {name: getattr(args, prefix + name) for name in names if hasattr(args, prefix + name)}
