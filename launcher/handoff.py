"""The plan's trip from the process that plans (``affrun torchrun``, ``affrun run``, ``affrun exec`` on its own)
to each rank: :func:`plan_job` makes the plan once, :class:`ParentPlan` carries it in ``AFFRUN_PLAN``, and
:func:`rank_line` is the one summary line of a rank that every front end prints (:mod:`launcher.rank_line`
formats it).

Standard library and the pure core only: ``affrun exec`` imports it before every rank.
"""

from __future__ import annotations

import os
import sys

from launcher.env import ENV_POLICIES, USER_VARIABLES, EnvPolicy, effective_mem_policy
from launcher.errors import ConfigError, LaunchError
from launcher.omp_syntax import BIND_MODES, OmpBind
from launcher.option_table import BINDING_OPTIONS, MEM_BACKENDS, MemBackend
from launcher.options import MEM_POLICIES, PlanOptions
from launcher.plan import Plan, RankPlan
from launcher.rank_line import rank_summary
from launcher.records import dataclass, fields
from launcher.untrusted import BadJSON, load_json, short

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: launcher/records.py says why
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from launcher.topology.model import Topology

PLAN_VARIABLE = "AFFRUN_PLAN"
# Written with AFFRUN_LOCAL_RANK by every binding made from a plan: ParentPlan.identity() of that plan. A process
# is "already bound" only when it carries the identity of the plan it reads (launcher.startup): an inherited
# AFFRUN_LOCAL_RANK of another binding (an outer affrun exec, a stale copy) is not proof.
PLAN_ID_VARIABLE = "AFFRUN_PLAN_ID"
# Above this size the plan travels in a file (AFFRUN_PLAN=@path): one environment string may not exceed
# 128 KiB (MAX_ARG_STRLEN), and every worker's execve would fail.
INLINE_PLAN_LIMIT = 32 * 1024
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
    :func:`launcher.rank_line.rank_summary` of the plan's entry, after ``affrun:``."""
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

    def to_env(self, spill_dir: str) -> str:
        """The value of ``AFFRUN_PLAN``: the JSON itself, or ``@FILE`` (written in ``spill_dir``) when it is large."""
        text = self.to_json()
        if len(text) <= INLINE_PLAN_LIMIT:
            return text
        path = os.path.join(spill_dir, "affrun-plan.json")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        return "@" + path

    @classmethod
    def from_env(cls, value: str) -> ParentPlan:
        if value.startswith("@"):
            from launcher.topology._files import read_document

            data = read_document(value[1:], "the plan file affrun torchrun wrote", LaunchError)
            try:
                value = data.decode("utf-8")
            except UnicodeDecodeError:
                raise LaunchError(f"{PLAN_VARIABLE}: the plan file {value[1:]} is not UTF-8 text") from None
        return cls.from_json(value)

    @classmethod
    def from_json(cls, text: str) -> ParentPlan:
        """Parse and check ``AFFRUN_PLAN`` like any input: one :class:`LaunchError` line for anything wrong."""
        from launcher.plan_json import BadPlan, choice, plan_from_json, string_map

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


def plan_job(
    values: Mapping[str, Any],
    nproc: int | None,
    *,
    environ: Mapping[str, str] | None = None,
    user_env: Mapping[str, str] | None = None,
    default_nproc: int | None = None,
) -> tuple[Topology, ParentPlan]:
    """Load the topology, plan ``nproc`` local ranks and resolve the memory policy, for every front end.

    ``values`` holds the binding options by their ``dest`` in :data:`~launcher.option_table.BINDING_OPTIONS`
    (a missing one takes the table's default) and ``verbose``. With ``nproc=None`` the job has one rank per
    ``--gpus``/``--map`` entry, else per visible GPU, else ``default_nproc`` (``None``: refuse, the caller must
    be told the count)."""
    from launcher.plan import make_plan
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
