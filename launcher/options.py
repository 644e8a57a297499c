"""Planning options shared by every front end (click CLI, ``affrun exec``'s argparse, submitit, sbatch).

Turning option values into a :class:`~launcher.plan.Request` lives here, once, with no click import.
"""

from __future__ import annotations

from launcher.cpulist import CpuIdTooLarge, parse_cpulist
from launcher.errors import ConfigError
from launcher.plan import GPU_ORDERS, MODES, GpuOrder, Mode, Request
from launcher.plan_spill import SPILLS, SpillChoice
from launcher.records import dataclass, fields
from launcher.untrusted import ascii_uint, short

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: launcher/records.py says why
# The Literal types exist for mypy; at run time each is str, and the tuple beside it lists the values (a test holds
# the two equal). typing, which get_args() needs, costs affrun exec about 10 ms.
if TYPE_CHECKING:
    from typing import Literal

    MemPolicy = Literal["auto", "membind", "preferred", "interleave", "none"]
else:
    MemPolicy = str
MEM_POLICIES: tuple[MemPolicy, ...] = ("auto", "membind", "preferred", "interleave", "none")


@dataclass(frozen=True)
class PlanOptions:
    """Every planning option as the user typed it (strings where the CLI takes strings)."""

    mode: Mode = "exclusive"
    smt: bool = False
    reserve: str | None = None
    loader_cores: int = 0
    gpu_order: GpuOrder = "rank"
    cpu_map: str | None = None
    gpus: str | None = None
    no_gpu: bool = False
    spill: SpillChoice = "loader"

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
        from launcher.option_table import options_in, to_argv

        return to_argv({f.name: getattr(self, f.name) for f in fields(self)}, options_in("plan"))


def make_request(nproc: int, opts: PlanOptions) -> Request:
    if opts.mode not in MODES:
        raise ConfigError(f"--mode {short(opts.mode)}: choose one of {', '.join(MODES)}")
    if opts.gpu_order not in GPU_ORDERS:
        raise ConfigError(f"--gpu-order {short(opts.gpu_order)}: choose one of {', '.join(GPU_ORDERS)}")
    if opts.spill not in SPILLS:
        raise ConfigError(f"--spill {short(opts.spill)}: choose one of {', '.join(SPILLS)}")
    reserve: frozenset[int] = frozenset()
    if opts.reserve:
        try:
            reserve = parse_cpulist(opts.reserve)
        except CpuIdTooLarge as exc:
            raise ConfigError(f"--reserve {short(opts.reserve)}: {exc}") from None
        except ValueError:
            raise ConfigError(f"--reserve {short(opts.reserve)}: not a cpu list (e.g. 0 or 0,8,16)") from None
    cpu_map = None
    if opts.cpu_map:
        try:
            cpu_map = tuple(parse_cpulist(part) for part in opts.cpu_map.split(";"))  # ':' is cpu list syntax
        except CpuIdTooLarge as exc:
            raise ConfigError(f"--map {short(opts.cpu_map)}: {exc}") from None
        except ValueError:
            raise ConfigError(f"--map {short(opts.cpu_map)}: expected one cpu list per rank, separated by ';'") from None
        if any(not m for m in cpu_map):
            raise ConfigError(f"--map {short(opts.cpu_map)}: a rank has an empty cpu list")
    if cpu_map is not None and opts.mode not in ("exclusive", "map"):
        raise ConfigError(f"--map gives explicit CPUs, which --mode {opts.mode} would ignore: drop one of them")
    mode = "map" if cpu_map is not None else opts.mode
    gpus = None
    if opts.gpus:
        ids = [ascii_uint(g.strip()) for g in opts.gpus.split(",")]
        if None in ids:
            raise ConfigError(f"--gpus {short(opts.gpus)}: expected visible GPU indices like 0,1,2,3")
        gpus = tuple(g for g in ids if g is not None)
    if gpus is not None and opts.no_gpu:
        raise ConfigError("--gpus names GPUs for the ranks, --no-gpu plans without GPUs: give only one")
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
    )
