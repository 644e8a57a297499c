"""The parent's side of the plan's trip to each rank: :func:`plan_job` makes the plan once, and :class:`ParentPlan`
computes every rank's final environment and writes it all into ``AFFRUN_PLAN``, which each rank reads with
:func:`launcher.bind.wire.read_job` (docs/design.md §9).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.base.choices import AppliedMemPolicy, EnvPolicy, MemBackend, NicEnv, OmpBind, RankHooks
from launcher.base.errors import ConfigError, LaunchError
from launcher.base.records import to_dict
from launcher.bind.wire import COMPRESSED_PREFIX, PLAN_VARIABLE, Job, identity
from launcher.context.run_role import BOOT
from launcher.env.policy import RankEnvironment, effective_mem_policy, rank_environment
from launcher.options.record import Options
from launcher.plan.record import SCHEMA, Handoff, Plan, RankEnv, RankPlan

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from launcher.topology.model import Topology

INLINE_PLAN_LIMIT = 32 * 1024  # above this size the plan's JSON travels compressed (AFFRUN_PLAN=zlib+base64:...)
ENV_PLAN_LIMIT = 96 * 1024  # the longest AFFRUN_PLAN written: well under MAX_ARG_STRLEN (128 KiB)


def exec_prefix() -> list[str]:
    """The argv that starts ``affrun exec`` with this interpreter, safe from modules in the working directory."""
    return [sys.executable, "-c", BOOT, "exec"]


@dataclass(frozen=True)
class ParentPlan:
    """What ``affrun torchrun`` hands to every worker's ``affrun exec`` through ``AFFRUN_PLAN``."""

    plan: Plan
    bind: OmpBind
    env_policy: EnvPolicy
    mem_policy: AppliedMemPolicy  # already resolved (no "auto")
    mem_backend: MemBackend
    user_env: dict[str, str]  # the user's own values of the variables affrun sets, before torchrun touched them
    verbose: bool
    nic_env: NicEnv = "none"  # which NIC variables the ranks get besides AFFRUN_NIC (--nic-env)
    rank_hooks: RankHooks = "auto"  # what affrun patches inside the ranks (--rank-hooks): AFFRUN_RANK_HOOKS

    def handoff(self) -> Handoff:
        """What ``AFFRUN_PLAN`` carries: the plan, how to apply it, and each rank's variables but its ``AFFRUN_*``
        ones, which the rank writes from its fields (:func:`launcher.bind.apply.rank_variables`)."""
        envs = tuple(RankEnv({k: v for k, v in e.set.items() if not k.startswith("AFFRUN_")}, e.unset, e.notes,
                             e.user_pools) for e in map(self.environment, self.plan.ranks))
        return Handoff(SCHEMA, self.plan, self.bind, self.env_policy, self.mem_policy, self.mem_backend,
                       self.user_env, self.verbose, self.rank_hooks, envs)

    def to_json(self) -> str:
        """The hand-off as compact JSON."""
        return _json(self.handoff())

    def environment(self, rank: RankPlan) -> RankEnvironment:
        """The variables ``rank`` gets, as the env policy judges the user's own values (:attr:`user_env`)."""
        return rank_environment(rank, local_world_size=len(self.plan.ranks), user_env=self.user_env, bind=self.bind,
                                smt=self.plan.smt, policy=self.env_policy, nic_env=self.nic_env, hooks=self.rank_hooks)

    def to_env(self) -> str:
        """The value of ``AFFRUN_PLAN``: the JSON itself, or, above :data:`INLINE_PLAN_LIMIT`, the JSON compressed;
        :class:`LaunchError` above :data:`ENV_PLAN_LIMIT`. Never a file: docs/design.md §9."""
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

    def job(self) -> Job:
        """The :class:`~launcher.bind.wire.Job` the ranks read from :meth:`to_env`, for a process that plans for
        itself (``affrun exec`` under srun, ``bind_rank``)."""
        handoff = self.handoff()
        return Job(handoff, identity(_json(handoff)))


def _json(handoff: Handoff) -> str:
    import json  # the planning parent's, not the rank's

    return json.dumps(to_dict(handoff), separators=(",", ":"))


def plan_job(
    options: Options,
    nproc: int | None,
    *,
    environ: Mapping[str, str] | None = None,
    user_env: Mapping[str, str] | None = None,
    default_nproc: int | None = None,
    loaded: Callable[[Topology], None] | None = None,
) -> tuple[Topology, ParentPlan]:
    """Load the topology, plan ``nproc`` local ranks and resolve the memory policy, for every front end. With
    ``nproc=None``: one rank per ``--gpus``/``--map`` entry, else per visible GPU, else ``default_nproc`` (``None``:
    a :class:`ConfigError`). ``loaded`` is called with the topology before planning."""
    from launcher.plan.planner import make_plan
    from launcher.topology import load_topology

    topo = load_topology(fsroot=options.fsroot, topology_file=options.topology, cpus=options.cpus,
                         environ=environ, gpus=not options.no_gpu)
    if loaded is not None:
        loaded(topo)
    if nproc is None:
        nproc = options.rank_count() or (0 if options.no_gpu else len(topo.visible_gpus())) or default_nproc
        if nproc is None:
            raise ConfigError("no GPU is visible to plan one rank per GPU: give --nproc-per-node N (the number of "
                              "processes the launcher starts)")
    plan = make_plan(topo, options.request(nproc))
    mem = effective_mem_policy(options.mem_policy, len(topo.cpu_nodes()))
    return topo, ParentPlan(plan, options.omp_bind, options.env_policy, mem, options.mem_backend, dict(user_env or {}),
                            options.verbose, options.nic_env, options.rank_hooks)
