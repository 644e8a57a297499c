"""The binding options of one job as one record, :class:`Options`, whatever front end read them: the option table's
rows by their Python keyword, and ``verbose``. It gives back flags (:meth:`Options.to_argv`) and the planner's
:class:`~launcher.plan.request.Request` (:meth:`Options.request`); docs/design.md §14.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from launcher.base.choices import (
    EnvPolicy,
    GpuOrder,
    MainThread,
    MemBackend,
    MemPolicy,
    Mode,
    NicEnv,
    OmpBind,
    RankHooks,
    SpillChoice,
)
from launcher.base.errors import AffrunError, ConfigError, Opt
from launcher.options.table import BINDING_OPTIONS, default, options_in, spell_error
from launcher.plan.request import Request

if TYPE_CHECKING:
    from collections.abc import Mapping


@dataclass(frozen=True)
class Options:
    """Every binding option of one job, as the user gave it (strings where the command line takes strings), and
    whether the ranks say what they were given. Fields in :data:`ORDER`."""

    mode: Mode = default("mode")
    smt: bool = default("smt")
    reserve: str | None = default("reserve")
    loader_cores: int = default("loader_cores")
    comm_cores: int = default("comm_cores")
    main_thread: MainThread = default("main_thread")
    gpu_order: GpuOrder = default("gpu_order")
    cpu_map: str | None = default("cpu_map")
    gpus: str | None = default("gpus")
    spill: SpillChoice = default("spill")
    no_gpu: bool = default("no_gpu")
    fsroot: str | None = default("fsroot")
    topology: str | None = default("topology_file")
    cpus: str | None = default("cpus")
    omp_bind: OmpBind = default("omp_bind")
    env_policy: EnvPolicy = default("env_policy")
    nic_env: NicEnv = default("nic_env")
    mem_policy: MemPolicy = default("mem_policy")
    rank_hooks: RankHooks = default("rank_hooks")
    mem_backend: MemBackend = default("mem_backend")
    verbose: bool = False

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Options:
        """The options ``values`` holds by ``dest`` (a missing one takes the table's default); its other keys
        (click's other parameters) are the caller's."""
        return cls(**{FIELDS[dest]: value for dest, value in values.items() if dest in FIELDS})

    @classmethod
    def from_args(cls, args: object, prefix: str = "") -> Options:
        """The options an argparse namespace holds, its ``dest``\\ s carrying ``prefix`` (torchrun's ``affrun_``)."""
        return cls.from_values({dest: getattr(args, prefix + dest) for dest in FIELDS if hasattr(args, prefix + dest)})

    @classmethod
    def from_keywords(cls, base: Options | None = None, **values: Any) -> Options:
        """``base`` (default: the defaults) with Python keyword arguments over it, read and checked; a wrong or
        unknown one is one :class:`~launcher.errors.ConfigError` naming the keyword."""
        from launcher.options.keywords import BY_KEYWORD, check_argument, check_keyword

        unknown = sorted(set(values) - set(KEYWORDS))
        if unknown:
            raise ConfigError(f"unknown affrun option(s) {', '.join(unknown)}; valid: {', '.join(KEYWORDS)}")
        clean = {name: check_argument(None, name, value, "flag") if name == "verbose"
                 else check_keyword(BY_KEYWORD[name], value) for name, value in values.items()}
        options = replace(base or cls(), **clean)
        options.check()
        return options

    from_kwargs = from_keywords  # the submitit executor's name (launcher.submitit.AffinityOptions is this record)

    def check(self) -> None:
        """Refuse values ``affrun exec`` would refuse in every task, before any is started: a negative count, two
        topology sources, what :meth:`request` refuses. Errors name options as Python keywords (``cpu_map=``)."""
        try:
            for spec in BINDING_OPTIONS:
                value = getattr(self, spec.name("python"))
                if spec.count and value < 0:
                    raise ConfigError(Opt(spec.dest, value), ": must be 0 or more")
            from launcher.topology import check_sources

            check_sources(self.fsroot, self.topology, self.cpus)
            self.request(1)
        except AffrunError as exc:
            spell_error(exc, "python")
            raise

    def request(self, nproc: int) -> Request:
        """The planner's request for ``nproc`` local ranks: every choice checked, the CPU and GPU lists parsed."""
        from launcher.base.cpulist import cpu_error, parse_cpulist
        from launcher.base.untrusted import ascii_uint

        for spec in BINDING_OPTIONS:
            value = getattr(self, spec.name("python"))
            if spec.choices and value not in spec.choices:
                raise ConfigError(Opt(spec.dest, value, quoted=True), f": choose one of {', '.join(spec.choices)}")
        reserve: frozenset[int] = frozenset()
        if self.reserve:
            try:
                reserve = parse_cpulist(self.reserve)
            except ValueError as exc:
                raise ConfigError(Opt("reserve", self.reserve, quoted=True),
                                  ": " + cpu_error(exc, "not a cpu list (e.g. 0 or 0,8,16)")) from None
        cpu_map = None
        if self.cpu_map:
            try:
                cpu_map = tuple(parse_cpulist(part) for part in self.cpu_map.split(";"))  # ':' is cpu list syntax
            except ValueError as exc:
                raise ConfigError(Opt("cpu_map", self.cpu_map, quoted=True),
                                  ": " + cpu_error(exc, "expected one cpu list per rank, separated by ';'")) from None
            if any(not m for m in cpu_map):
                raise ConfigError(Opt("cpu_map", self.cpu_map, quoted=True), ": a rank has an empty cpu list")
        if cpu_map is not None and self.mode not in ("exclusive", "map"):
            raise ConfigError(Opt("cpu_map"), " gives explicit CPUs, which ", Opt("mode", self.mode),
                              " would ignore: drop one of them")
        gpus = None
        if self.gpus:
            ids = [ascii_uint(g.strip()) for g in self.gpus.split(",")]
            if None in ids:
                raise ConfigError(Opt("gpus", self.gpus, quoted=True), ": expected visible GPU indices like 0,1,2,3")
            gpus = tuple(g for g in ids if g is not None)
        if gpus is not None and self.no_gpu:
            raise ConfigError(Opt("gpus"), " names GPUs for the ranks, ", Opt("no_gpu"),
                              " plans without GPUs: give only one")
        return Request(nproc=nproc, mode="map" if cpu_map is not None else self.mode, smt=self.smt, reserve=reserve,
                       loader_cores=self.loader_cores, gpu_order=self.gpu_order, cpu_map=cpu_map, gpus=gpus,
                       use_gpus=not self.no_gpu, spill=self.spill, comm_cores=self.comm_cores,
                       main_thread=self.main_thread)

    def rank_count(self) -> int | None:
        """How many ranks the options name: one per ``--gpus`` entry, else per ``--map`` list, else ``None`` (the
        front end decides)."""
        if self.gpus:
            return len(self.gpus.split(","))
        if self.cpu_map:
            return len(self.cpu_map.split(";"))
        return None

    def to_argv(self) -> list[str]:
        """``affrun exec`` flags for these options, planning first (defaults and unset values left out)."""
        argv: list[str] = []
        for spec in ORDER:
            value = getattr(self, spec.name("python"))
            if spec.is_flag:
                argv += [spec.flag] if value else []
            elif value is not None and value != "" and value != spec.default:
                argv += [spec.flag, str(value)]
        return [*argv, *(["--verbose"] if self.verbose else [])]


# The table's options as the record orders them (and flags and error messages list them): planning first.
ORDER = (*options_in("plan"), *options_in("topology"), *options_in("env", "apply"))
# dest -> field: every option of the table by its Python keyword, and the one the launch front ends share.
FIELDS: dict[str, str] = {**{spec.dest: spec.name("python") for spec in ORDER}, "verbose": "verbose"}
KEYWORDS: tuple[str, ...] = tuple(FIELDS.values())
