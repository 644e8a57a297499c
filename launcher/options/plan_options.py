"""Planning options shared by every front end (click CLI, ``affrun exec``'s argparse, submitit, sbatch).

Turning option values into a :class:`~launcher.plan.planner.Request` lives here, once, with no click import.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from launcher.base.choices import MEM_POLICIES, GpuOrder, MainThread, MemPolicy, Mode, SpillChoice
from launcher.base.cpulist import cpu_error, parse_cpulist
from launcher.base.untrusted import ascii_uint
from launcher.errors import ConfigError, Opt
from launcher.options.table import default
from launcher.plan.request import Request, check_choices

__all__ = ["MEM_POLICIES", "MemPolicy", "PlanOptions", "make_request"]  # the memory policies: option_table's


@dataclass(frozen=True)
class PlanOptions:
    """Every planning option as the user typed it (strings where the CLI takes strings), with the option
    table's defaults."""

    mode: Mode = default("mode")
    smt: bool = default("smt")
    reserve: str | None = default("reserve")
    loader_cores: int = default("loader_cores")
    gpu_order: GpuOrder = default("gpu_order")
    cpu_map: str | None = default("cpu_map")
    gpus: str | None = default("gpus")
    no_gpu: bool = default("no_gpu")
    spill: SpillChoice = default("spill")
    comm_cores: int = default("comm_cores")
    main_thread: MainThread = default("main_thread")

    def request(self, nproc: int) -> Request:
        return make_request(nproc, self)

    def rank_count(self) -> int | None:
        """How many ranks the options name: one per ``--gpus`` entry, else per ``--map`` list (``;``-separated),
        else ``None`` (the front end decides: visible GPUs, ``--nproc-per-node``...). Front ends default the
        rank count to it; a mismatch with an explicit count is reported by the planner."""
        if self.gpus:
            return len(self.gpus.split(","))
        if self.cpu_map:
            return len(self.cpu_map.split(";"))
        return None

    def to_argv(self) -> list[str]:
        """The same options as command-line flags (for generated scripts and child commands)."""
        from launcher.options.table import options_in, to_argv

        return to_argv({f.name: getattr(self, f.name) for f in fields(self)}, options_in("plan"))


def make_request(nproc: int, opts: PlanOptions) -> Request:
    check_choices(ConfigError, mode=opts.mode, gpu_order=opts.gpu_order, spill=opts.spill, main_thread=opts.main_thread)
    reserve: frozenset[int] = frozenset()
    if opts.reserve:
        try:
            reserve = parse_cpulist(opts.reserve)
        except ValueError as exc:
            raise ConfigError(Opt("reserve", opts.reserve, quoted=True),
                              ": " + cpu_error(exc, "not a cpu list (e.g. 0 or 0,8,16)")) from None
    cpu_map = None
    if opts.cpu_map:
        try:
            cpu_map = tuple(parse_cpulist(part) for part in opts.cpu_map.split(";"))  # ':' is cpu list syntax
        except ValueError as exc:
            raise ConfigError(Opt("cpu_map", opts.cpu_map, quoted=True),
                              ": " + cpu_error(exc, "expected one cpu list per rank, separated by ';'")) from None
        if any(not m for m in cpu_map):
            raise ConfigError(Opt("cpu_map", opts.cpu_map, quoted=True), ": a rank has an empty cpu list")
    if cpu_map is not None and opts.mode not in ("exclusive", "map"):
        raise ConfigError(Opt("cpu_map"), " gives explicit CPUs, which ", Opt("mode", opts.mode), " would ignore: drop one of them")
    mode = "map" if cpu_map is not None else opts.mode
    gpus = None
    if opts.gpus:
        ids = [ascii_uint(g.strip()) for g in opts.gpus.split(",")]
        if None in ids:
            raise ConfigError(Opt("gpus", opts.gpus, quoted=True), ": expected visible GPU indices like 0,1,2,3")
        gpus = tuple(g for g in ids if g is not None)
    if gpus is not None and opts.no_gpu:
        raise ConfigError(Opt("gpus"), " names GPUs for the ranks, ", Opt("no_gpu"), " plans without GPUs: give only one")
    return Request(
        nproc=nproc,
        mode=mode,
        smt=opts.smt,
        reserve=reserve,
        loader_cores=opts.loader_cores,
        gpu_order=opts.gpu_order,
        cpu_map=cpu_map,
        gpus=gpus,
        use_gpus=not opts.no_gpu,
        spill=opts.spill,
        comm_cores=opts.comm_cores,
        main_thread=opts.main_thread,
    )


def plan_options_from(args: object, prefix: str = "") -> PlanOptions:
    """The :class:`PlanOptions` that :func:`add_binding_arguments` parsed into ``args`` (or :func:`launcher.launch.exec_cmd.default_args`)."""
    return PlanOptions(**{f.name: getattr(args, prefix + f.name) for f in fields(PlanOptions)})
