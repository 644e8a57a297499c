"""The options, defined once: each one's flag, destination, kind of value, default and help (:class:`OptionSpec`).

The binding options, the feed meter's, the rank count and ``--tuned`` are here; click (:mod:`launcher.options.click`)
and argparse (:func:`add_arguments`) build every command's options from the rows (docs/design.md §14).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

from launcher.base.choices import (
    BIND_MODES,
    ENV_POLICIES,
    GPU_ORDERS,
    MAIN_THREADS,
    MEM_BACKENDS,
    MEM_POLICIES,
    MODES,
    NIC_ENVS,
    RANK_HOOKS,
    SPILLS,
)
from launcher.plan.request import Request

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from typing import Any

    from launcher.base.errors import AffrunError, Opt, Vocabulary
    from launcher.options.values import Reader

# The planner's defaults (launcher.plan.request.Request): the planning options' defaults are the planner's own.
_PLANNER: dict[str, Any] = {f.name: f.default for f in fields(Request)}

# apply, feed: only where a rank is started (exec, torchrun, run); tuned: --tuned alone; sbatch, tune: their own
OptionGroup = Literal["topology", "plan", "env", "apply", "feed", "tuned", "sbatch", "tune"]


@dataclass(frozen=True)
class OptionSpec:
    """One option. ``kind`` is the kind of value it takes, read by :func:`launcher.options.values.read` (given
    ``choices``, the kind is choice); ``low`` and ``over`` bound a count or a duration."""

    flag: str
    dest: str
    group: OptionGroup
    help: str
    kind: str = "str"
    choices: tuple[str, ...] | None = None
    default: Any = None
    metavar: str | None = None
    envvar: str | None = None  # the variable that stands in for the option (load_topology reads it): for the help
    keyword: str | None = None  # the name Python callers give it (Options' field), where that is not ``dest``
    short: str | None = None  # its one-letter flag (sbatch's -N)
    also: tuple[str, ...] = ()  # its other spellings: --affrun for --affrun-command; --no-exclusive for a flag's off
    low: float = 0
    over: bool = False

    def __post_init__(self) -> None:
        if self.choices:
            object.__setattr__(self, "kind", "choice")

    @property
    def is_flag(self) -> bool:
        return self.kind == "flag"

    @property
    def count(self) -> bool:
        return self.kind == "count"

    @property
    def flags(self) -> tuple[str, ...]:
        """Every spelling, as click and argparse take them (``-N``, ``--nodes``; ``--exclusive/--no-exclusive``)."""
        off = [a for a in self.also if a.startswith("--no-")]
        first = self.flag + "".join(f"/{a}" for a in off)
        return (*([self.short] if self.short else []), first, *(a for a in self.also if a not in off))

    def name(self, vocabulary: Vocabulary) -> str:
        """The option as ``vocabulary`` writes it: the flag (``--map``), the Python keyword (``cpu_map``), or the
        key of a YAML site profile or tuned file (``map``: the flag without its dashes)."""
        if vocabulary == "cli":
            return self.flag
        if vocabulary == "python":
            return self.keyword or self.dest
        return self.flag[2:]

    def read(self, value: object, vocabulary: Reader) -> Any:
        """``value`` as given in ``vocabulary``, read by its kind (:func:`launcher.options.values.read`)."""
        from launcher.options.values import read

        return read(self.kind, value, vocabulary, self.choices or (), self.dest, self.low, over=self.over)


BINDING_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("--fsroot", "fsroot", "topology", "Read sys/ and proc/ under DIR instead of / (default: $AFFRUN_FSROOT; "
               "hwloc's test-tarball layout).", metavar="DIR", envvar="AFFRUN_FSROOT", kind="path"),
    OptionSpec("--topology", "topology_file", "topology", "Load a saved topology: affrun JSON snapshot or hwloc XML "
               "(lstopo --of xml).", metavar="FILE", keyword="topology", kind="path"),
    OptionSpec("--cpus", "cpus", "topology", "Restrict the allowed CPUs further (cpulist, e.g. 0-7,64-71).",
               metavar="LIST", kind="cpus"),
    OptionSpec("--mode", "mode", "plan", "exclusive: disjoint cores per rank; numa/socket: share the GPU's "
               "node/package; l3: whole L3 groups; map: explicit --map.", choices=MODES, default=_PLANNER["mode"]),
    OptionSpec("--smt", "smt", "plan", "Count every hardware thread in OMP_NUM_THREADS.", kind="flag", default=False),
    OptionSpec("--reserve", "reserve", "plan", "Keep the cores of these CPUs for the OS (e.g. 0).", metavar="LIST", kind="cpus"),
    OptionSpec("--loader-cores", "loader_cores", "plan", "Cores of each rank set aside for DataLoader workers.",
               kind="count", default=_PLANNER["loader_cores"], metavar="N"),
    OptionSpec("--comm-cores", "comm_cores", "plan", "Cores of each rank, near its GPU, kept for NCCL's proxy "
               "threads (NCCL_PROXY_CPUSET), out of the OpenMP team and the loader cores.",
               kind="count", default=_PLANNER["comm_cores"], metavar="K"),
    OptionSpec("--main-thread", "main_thread", "plan", "Where each rank's main thread lives: none: the rank's whole "
               "set; compute: a compute core of its own; priority: a priority core of its own near its GPU (none "
               "found: as none, with a warning). The OpenMP team and DataLoader workers keep off it.",
               choices=MAIN_THREADS, default=_PLANNER["main_thread"]),
    OptionSpec("--gpu-order", "gpu_order", "plan", "rank: rank i uses visible GPU i; closest: rank i takes the i-th "
               "CPU region and its GPU.", choices=GPU_ORDERS, default=_PLANNER["gpu_order"]),
    OptionSpec("--map", "cpu_map", "plan", "Explicit CPUs per rank, separated by ';' (':' inside a list is the "
               "kernel's group syntax, 0-15:2/4): '0-7;8-15'.", metavar="LISTS", kind="cpu_map"),
    OptionSpec("--gpus", "gpus", "plan", "Explicit visible GPU per rank: '0,1,2,3'.", metavar="LIST", kind="gpus"),
    OptionSpec("--spill", "spill", "plan", "Cores of NUMA nodes that host no rank go to the nearest ranks: loader: "
               "as DataLoader cores (OMP_NUM_THREADS unchanged); compute: as compute cores; none: left idle.",
               choices=SPILLS, default=_PLANNER["spill"]),
    OptionSpec("--no-gpu", "no_gpu", "plan", "Plan a CPU-only job even where GPUs exist.", kind="flag",
               default=False),
    OptionSpec("--omp-bind", "omp_bind", "env", "rank: every OpenMP thread on the rank's compute CPUs; core: "
               "every thread but the main one pinned to a core of its own. Either way the main thread (and DataLoader "
               "workers it forks) keeps the whole rank, or its own core with --main-thread.", choices=BIND_MODES,
               default="rank"),
    OptionSpec("--env-policy", "env_policy", "env", "What to do with the thread, pool and binding variables "
               "(OMP/KMP/MKL/OpenBLAS, OpenCV, Rayon, numexpr, BLIS) the user already set.",
               choices=ENV_POLICIES, default="safe"),
    OptionSpec("--nic-env", "nic_env", "env", "Also export the rank's nearest NIC for a fabric library (AFFRUN_NIC is "
               "always set): ucx: UCX_NET_DEVICES=<name>:<port>; mpich: MPICH_OFI_NIC_POLICY=GPU (Cray MPICH); none. "
               "NCCL's own variables are never set.", choices=NIC_ENVS, default="none"),
    OptionSpec("--mem-policy", "mem_policy", "env", "Memory policy of each rank (auto: preferred on multi-NUMA "
               "machines, else none).", choices=MEM_POLICIES, default="auto"),
    OptionSpec("--rank-hooks", "rank_hooks", "apply", "What affrun patches inside each rank (AFFRUN_RANK_HOOKS): "
               "auto: DataLoader workers' CPUs and pools, the pin-memory thread, torch's inter-op pool and the main "
               "thread; none: only the mask and the environment.", choices=RANK_HOOKS, default="auto"),
    OptionSpec("--mem-backend", "mem_backend", "apply", "How the memory policy is applied (auto: the set_mempolicy "
               "system call, numactl where Python knows no call number).", choices=MEM_BACKENDS, default="auto"),
)


# The feed meter's options (docs/tune.md): only where a rank is started (exec, torchrun, run); not in the plan.
FEED_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("--feed-report", "feed_report", "feed", "Measure each rank's data wait (the time its loop waits "
               "for the DataLoader's next batch), its main thread's wait for a CPU, its GPU's busy share (with NVML) "
               "and batches/s, on an unmodified script; one line per rank on stderr at its exit, with a verdict "
               "(fed, starved-by-data, starved-of-cpu, underused, unknown).",
               kind="flag", default=False),
    OptionSpec("--feed-interval", "feed_interval", "feed", "Also print each rank's feed line every SECONDS, "
               "at least 0.1 (default: only at exit). Implies --feed-report.", metavar="SECONDS", kind="seconds",
               low=0.1),  # the meter's shortest, launcher.feed.meter.MIN_INTERVAL_S
    OptionSpec("--feed-json", "feed_json", "feed", "Write the figures as JSON, one object per rank, updated about "
               "once a second and at exit. Implies --feed-report.", metavar="PATH", kind="path"),
    OptionSpec("--loader-workers", "loader_workers", "feed", "DataLoader workers per rank, for scripts that ask "
               "launcher.torch.loader_workers() (default: one per loader core of the rank).", kind="count",
               metavar="N"),
)


# The rank count: each command adds it itself, and the planner's message names it.
NPROC_OPTION = OptionSpec("--nproc-per-node", "nproc", "plan", "Local ranks on this node.", kind="count",
                          keyword="nproc_per_node")
# affrun tune's saved options (launcher.options.tuned): a file of options, so not one of BINDING_OPTIONS.
TUNED_OPTION = OptionSpec("--tuned", "tuned", "tuned", "Apply the options affrun tune --save wrote to FILE (a flag "
                          "given on the command line wins; a file tuned on another machine gets a warning).",
                          metavar="FILE", kind="path")
_BY_DEST: dict[str, OptionSpec] = {o.dest: o for o in (*BINDING_OPTIONS, *FEED_OPTIONS, NPROC_OPTION, TUNED_OPTION)}
# What exec, run and torchrun take besides their own flags, in the order of their help.
LAUNCH_OPTIONS: tuple[OptionSpec, ...] = (*BINDING_OPTIONS, TUNED_OPTION, *FEED_OPTIONS)


def default(dest: str) -> Any:
    """The default of the option landing in ``dest``."""
    return _BY_DEST[dest].default


def options_in(*groups: str) -> tuple[OptionSpec, ...]:
    return tuple(o for o in BINDING_OPTIONS if o.group in groups)


def spell(option: Opt, vocabulary: Vocabulary) -> str:
    """An option named in an error message, as ``vocabulary`` writes it, with its value where the message
    quotes one: ``--loader-cores 9``, ``loader_cores=9``, ``loader-cores: 9`` (bare: ``--loader-cores``,
    ``loader_cores=``, ``loader-cores``). Python callers see values as ``repr``."""
    from launcher.base.untrusted import short

    spec = _BY_DEST.get(option.key)
    name = spec.name(vocabulary) if spec is not None else option.key  # not an option of the table: as given
    if vocabulary == "python":
        return f"{name}=" if option.value is None else f"{name}={short(option.value)}"
    if option.value is None:
        return name
    text = short(option.value) if option.quoted else str(option.value)
    return f"{name} {text}" if vocabulary == "cli" else f"{name}: {text}"


def spell_error(exc: AffrunError, vocabulary: Vocabulary | None = None,
                keys: frozenset[str] | set[str] | None = None) -> AffrunError:
    """``exc``, whose options will be spelled by this table, as ``vocabulary`` writes them (only those of ``keys``,
    when given; the others as the command line writes them)."""
    if vocabulary is not None:
        exc.use_vocabulary(vocabulary, keys)
    exc.speller = spell
    return exc


def argparse_type(spec: OptionSpec) -> Callable[[str], Any]:
    """argparse's ``type`` for ``spec``: its value read by its kind, a refusal in the command line's words."""
    def convert(text: str) -> Any:
        from launcher.options.values import BadValue

        try:
            return spec.read(text, "cli")
        except BadValue as exc:
            import argparse

            raise argparse.ArgumentTypeError(exc.is_not(text)) from None

    return convert


def add_arguments(group: argparse._ActionsContainer, specs: Sequence[OptionSpec], prefix: str = "") -> None:
    """The options ``specs``, argparse side: each value lands in ``prefix + dest`` (torchrun's namespace holds its own
    options too: ``affrun_``), read by :func:`argparse_type` where its kind is a number."""
    for spec in specs:
        kwargs: dict[str, Any] = {"dest": prefix + spec.dest, "help": spec.help}
        if spec.is_flag:
            kwargs["action"] = "store_true"
        else:
            kwargs.update(default=spec.default, metavar=spec.metavar, choices=spec.choices,
                          type=argparse_type(spec) if spec.kind in ("count", "seconds") else None)
        group.add_argument(*spec.flags, **kwargs)
