"""The binding options as records, one per group of the option table, and :class:`BindingOptions`, the three
together: what every planning front end hands to :func:`launcher.bind.handoff.plan_job`.

- :class:`SourceOptions`: where the topology comes from (``--fsroot``, ``--topology``, ``--cpus``);
- :class:`~launcher.options.plan_options.PlanOptions`: how the ranks are planned;
- :class:`ApplyOptions`: what each rank's environment and memory policy become (``--omp-bind``, ``--env-policy``,
  ``--nic-env``, ``--mem-policy``, ``--mem-backend``, ``--rank-hooks``).

Each front end reads its own vocabulary into them once: an argparse namespace (``affrun exec``, ``run``,
``torchrun``) with :meth:`BindingOptions.from_args`, click's or Python's keyword values, keyed by the option's
``dest``, with :meth:`BindingOptions.from_values`. Field names are the table's ``dest``\\ s and defaults its
defaults (``tests/unit/test_options_groups.py`` holds the records to the table).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from launcher.base.choices import EnvPolicy, MemBackend, MemPolicy, NicEnv, OmpBind, RankHooks
from launcher.errors import ConfigError, Opt
from launcher.options.plan_options import PlanOptions
from launcher.options.table import BINDING_OPTIONS, default, options_in, to_argv

if TYPE_CHECKING:
    from collections.abc import Mapping

    from _typeshed import DataclassInstance


@dataclass(frozen=True)
class SourceOptions:
    """Where the topology is read: the table's ``topology`` group."""

    fsroot: str | None = default("fsroot")
    topology_file: str | None = default("topology_file")
    cpus: str | None = default("cpus")

    def to_argv(self) -> list[str]:
        """These options as flags (defaults left out), for generated scripts and child commands."""
        return _to_argv(self, "topology")


@dataclass(frozen=True)
class ApplyOptions:
    """What each rank's variables and memory policy become: the table's ``env`` and ``apply`` groups."""

    omp_bind: OmpBind = default("omp_bind")
    env_policy: EnvPolicy = default("env_policy")
    mem_policy: MemPolicy = default("mem_policy")
    mem_backend: MemBackend = default("mem_backend")
    nic_env: NicEnv = default("nic_env")
    rank_hooks: RankHooks = default("rank_hooks")

    def check(self) -> None:
        """Refuse a value that is not one of its option's choices (argparse and click refuse them earlier)."""
        for spec in options_in("env", "apply"):
            value = getattr(self, spec.dest)
            if spec.choices and value not in spec.choices:
                raise ConfigError(Opt(spec.dest, value, quoted=True), f": choose one of {', '.join(spec.choices)}")

    def to_argv(self) -> list[str]:
        """These options as flags (defaults left out)."""
        return _to_argv(self, "env", "apply")


def _to_argv(record: object, *groups: str) -> list[str]:
    specs = options_in(*groups)
    return to_argv({spec.dest: getattr(record, spec.dest) for spec in specs}, specs)


R = TypeVar("R", bound="DataclassInstance")


def pick(record: type[R], values: Mapping[str, Any]) -> R:
    """The ``record`` (one of the option records) of the options ``values`` holds by ``dest``; the others take
    their defaults, and keys that are none of its fields are left for another record."""
    return record(**{f.name: values[f.name] for f in fields(record) if f.name in values})


# Every dest of the table, and the one option outside it that the launch front ends share.
DESTS: tuple[str, ...] = (*(spec.dest for spec in BINDING_OPTIONS), "verbose")


@dataclass(frozen=True)
class BindingOptions:
    """Every binding option of one job, by group, and whether the ranks say what they were given."""

    source: SourceOptions = field(default_factory=SourceOptions)
    plan: PlanOptions = field(default_factory=PlanOptions)
    apply: ApplyOptions = field(default_factory=ApplyOptions)
    verbose: bool = False

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> BindingOptions:
        """The options in ``values``, keyed by ``dest`` (a missing one takes the table's default). A key that is
        no binding option is a caller's mistake, not a user's: :class:`TypeError`."""
        unknown = sorted(set(values) - set(DESTS))
        if unknown:
            raise TypeError(f"not binding options: {', '.join(unknown)}")

        return cls(pick(SourceOptions, values), pick(PlanOptions, values), pick(ApplyOptions, values),
                   bool(values.get("verbose", False)))

    @classmethod
    def from_args(cls, args: object, prefix: str = "") -> BindingOptions:
        """The options an argparse namespace holds, its ``dest``\\ s carrying ``prefix`` (torchrun's ``affrun_``)."""
        return cls.from_values({name: getattr(args, prefix + name) for name in DESTS if hasattr(args, prefix + name)})

    def to_argv(self) -> list[str]:
        """``affrun exec`` flags for these options (defaults left out), from the one option table."""
        return [*self.plan.to_argv(), *self.source.to_argv(), *self.apply.to_argv(),
                *(["--verbose"] if self.verbose else [])]
