"""The binding options, defined once: flags, destination, type, default and help, with their argparse side
(:func:`add_binding_arguments`; :func:`launcher.options.plan_options.plan_options_from` reads them back) and their way back to flags (:func:`to_argv`).

``affrun exec`` and ``affrun torchrun`` build argparse arguments from this table
(:func:`add_binding_arguments`); the click commands build click options from it
(:mod:`launcher.cli.options`). Planning options are named like :class:`~launcher.options.plan_options.PlanOptions`'s fields.
Standard library only: ``affrun exec`` imports it before every rank.
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
    from collections.abc import Mapping, Sequence
    from typing import Any

    from launcher.errors import AffrunError, Opt, Vocabulary

# The planner's defaults (launcher.plan.request.Request): the planning options' defaults are the planner's own.
_PLANNER: dict[str, Any] = {f.name: f.default for f in fields(Request)}


OptionGroup = Literal["topology", "plan", "env", "apply", "feed", "tuned"]


@dataclass(frozen=True)
class OptionSpec:
    flag: str
    dest: str
    group: OptionGroup  # apply, feed: only where a rank is started (exec, torchrun, run); tuned: --tuned alone
    help: str
    choices: tuple[str, ...] | None = None
    default: str | int | bool | None = None
    is_flag: bool = False
    count: bool = False  # an integer >= 0
    metavar: str | None = None
    envvar: str | None = None  # the variable that stands in for the option (load_topology reads it): for the help
    keyword: str | None = None  # the name Python callers give it (AffinityOptions), where that is not ``dest``
    value: str = ""  # what a Python caller may give besides a string: "path", "cpus", "gpus", "cpu_map" (options/keywords.py)

    @property
    def kind(self) -> str:
        """The kind of value the option takes: ``flag``, ``count``, ``choice``, or :attr:`value`'s
        (``path``, ``cpus``, ``gpus``, ``cpu_map``); :mod:`launcher.options.keywords` checks Python callers' values by it."""
        return "flag" if self.is_flag else "count" if self.count else "choice" if self.choices else self.value

    def name(self, vocabulary: Vocabulary) -> str:
        """The option as ``vocabulary`` writes it: the flag (``--map``), the Python keyword (``cpu_map``), or the
        key of a YAML site profile (``map``: the flag without its dashes)."""
        if vocabulary == "cli":
            return self.flag
        if vocabulary == "python":
            return self.keyword or self.dest
        return self.flag[2:]


BINDING_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("--fsroot", "fsroot", "topology", "Read sys/ and proc/ under DIR instead of / (default: $AFFRUN_FSROOT; "
               "hwloc's test-tarball layout).", metavar="DIR", envvar="AFFRUN_FSROOT", value="path"),
    OptionSpec("--topology", "topology_file", "topology", "Load a saved topology: affrun JSON snapshot or hwloc XML "
               "(lstopo --of xml).", metavar="FILE", keyword="topology", value="path"),
    OptionSpec("--cpus", "cpus", "topology", "Restrict the allowed CPUs further (cpulist, e.g. 0-7,64-71).",
               metavar="LIST", value="cpus"),
    OptionSpec("--mode", "mode", "plan", "exclusive: disjoint cores per rank; numa/socket: share the GPU's "
               "node/package; l3: whole L3 groups; map: explicit --map.", choices=MODES, default=_PLANNER["mode"]),
    OptionSpec("--smt", "smt", "plan", "Count every hardware thread in OMP_NUM_THREADS.", is_flag=True, default=False),
    OptionSpec("--reserve", "reserve", "plan", "Keep the cores of these CPUs for the OS (e.g. 0).", metavar="LIST", value="cpus"),
    OptionSpec("--loader-cores", "loader_cores", "plan", "Cores of each rank set aside for DataLoader workers.",
               count=True, default=_PLANNER["loader_cores"], metavar="N"),
    OptionSpec("--comm-cores", "comm_cores", "plan", "Cores of each rank, near its GPU, kept for NCCL's proxy "
               "threads (NCCL_PROXY_CPUSET), out of the OpenMP team and the loader cores.",
               count=True, default=_PLANNER["comm_cores"], metavar="K"),
    OptionSpec("--main-thread", "main_thread", "plan", "Where each rank's main thread lives: none: the rank's whole "
               "set; compute: a compute core of its own; priority: a priority core of its own near its GPU (none "
               "found: as none, with a warning). The OpenMP team and DataLoader workers keep off it.",
               choices=MAIN_THREADS, default=_PLANNER["main_thread"]),
    OptionSpec("--gpu-order", "gpu_order", "plan", "rank: rank i uses visible GPU i; closest: rank i takes the i-th "
               "CPU region and its GPU.", choices=GPU_ORDERS, default=_PLANNER["gpu_order"]),
    OptionSpec("--map", "cpu_map", "plan", "Explicit CPUs per rank, separated by ';' (':' inside a list is the "
               "kernel's group syntax, 0-15:2/4): '0-7;8-15'.", metavar="LISTS", value="cpu_map"),
    OptionSpec("--gpus", "gpus", "plan", "Explicit visible GPU per rank: '0,1,2,3'.", metavar="LIST", value="gpus"),
    OptionSpec("--spill", "spill", "plan", "Cores of NUMA nodes that host no rank go to the nearest ranks: loader: "
               "as DataLoader cores (OMP_NUM_THREADS unchanged); compute: as compute cores; none: left idle.",
               choices=SPILLS, default=_PLANNER["spill"]),
    OptionSpec("--no-gpu", "no_gpu", "plan", "Plan a CPU-only job even where GPUs exist.", is_flag=True,
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


# The feed meter's options (docs/tune.md): only where a rank is started (exec, torchrun, run). Each rank gets them as
# the AFFRUN_FEED* variables and AFFRUN_LOADER_WORKERS (launcher.feed.variables); they do not change the plan.
FEED_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("--feed-report", "feed_report", "feed", "Measure each rank's data wait (the time its loop waits "
               "for the DataLoader's next batch), its main thread's wait for a CPU, its GPU's busy share (with NVML) "
               "and batches/s, on an unmodified script; one line per rank on stderr at its exit, with a verdict "
               "(fed, starved-by-data, starved-of-cpu, underused, unknown).",
               is_flag=True, default=False),
    OptionSpec("--feed-interval", "feed_interval", "feed", "Also print each rank's feed line every SECONDS, "
               "at least 0.1 (default: only at exit). Implies --feed-report.", metavar="SECONDS"),
    OptionSpec("--feed-json", "feed_json", "feed", "Write the figures as JSON, one object per rank, updated about "
               "once a second and at exit. Implies --feed-report.", metavar="PATH", value="path"),
    OptionSpec("--loader-workers", "loader_workers", "feed", "DataLoader workers per rank, for scripts that ask "
               "launcher.torch.loader_workers() (default: one per loader core of the rank).", count=True,
               metavar="N"),
)


# The rank count: each command adds it itself (exec's and run's argparse, torchrun's own parser, click's plan, show
# and doctor), and the planner's message names it (launcher.plan.request.check_rank_count).
NPROC_OPTION = OptionSpec("--nproc-per-node", "nproc", "plan", "Local ranks on this node.", keyword="nproc_per_node")
# affrun tune's saved options (launcher.options.tuned): taken by exec, run, torchrun (add_binding_arguments) and sbatch,
# outside BINDING_OPTIONS as it is no option of a plan record but a file of them, applied under the command line's.
TUNED_OPTION = OptionSpec("--tuned", "tuned", "tuned", "Apply the options affrun tune --save wrote to FILE (a flag "
                          "given on the command line wins; a file tuned on another machine gets a warning).",
                          metavar="FILE", value="path")
_BY_DEST: dict[str, OptionSpec] = {o.dest: o for o in (*BINDING_OPTIONS, *FEED_OPTIONS, NPROC_OPTION, TUNED_OPTION)}


def default(dest: str) -> Any:
    """The default of the option landing in ``dest``, for the front ends' own records of option values
    (:class:`~launcher.options.plan_options.PlanOptions`, ``AffinityOptions``, ``SbatchSpec``): defaults are stated here."""
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
    when given; options no front end gave a vocabulary are spelled as the command line writes them). Every front
    end calls it on an error on its way out, before printing or re-raising it."""
    if vocabulary is not None:
        exc.use_vocabulary(vocabulary, keys)
    exc.speller = spell
    return exc


def to_argv(values: Mapping[str, object], specs: Sequence[OptionSpec] = BINDING_OPTIONS) -> list[str]:
    """The flags that give ``values`` (keyed by ``dest``) back, for generated scripts and child commands.

    Defaults and unset values are left out; a key that ``values`` lacks is not an option of the caller."""
    argv: list[str] = []
    for spec in specs:
        if spec.dest not in values:
            continue
        value = values[spec.dest]
        if spec.is_flag:
            if value:
                argv.append(spec.flag)
        elif value is not None and value != "" and value != spec.default:
            argv += [spec.flag, str(value)]
    return argv


def non_negative(text: str) -> int:
    """argparse ``type`` for counts and ranks: ASCII digits only (``int()`` also takes '٣', ' 3' and '1_0')."""
    from launcher.base.cpulist import MAX_COUNT
    from launcher.base.untrusted import ascii_uint, short

    value = ascii_uint(text)
    if value is None or value > MAX_COUNT:
        import argparse

        raise argparse.ArgumentTypeError(f"{short(text)} is not a whole number from 0 to {MAX_COUNT}")
    return value


def add_binding_arguments(group: argparse._ActionsContainer, prefix: str = "") -> None:
    """The topology, planning, environment and memory options of ``exec`` and ``torchrun``, argparse side, from
    :data:`launcher.options.table.BINDING_OPTIONS` (click builds its options from the same table). Each value lands
    in ``prefix + dest``; the planning ones are named like :class:`~launcher.options.plan_options.PlanOptions`'s fields (see
    :func:`launcher.options.plan_options.plan_options_from`)."""
    for spec in BINDING_OPTIONS:
        kwargs: dict[str, Any] = {"dest": prefix + spec.dest, "help": spec.help}
        if spec.is_flag:
            kwargs["action"] = "store_true"
        else:
            kwargs.update(default=spec.default, metavar=spec.metavar)
            if spec.choices:
                kwargs["choices"] = spec.choices
            if spec.count:
                kwargs["type"] = non_negative
        group.add_argument(spec.flag, **kwargs)
    group.add_argument(TUNED_OPTION.flag, dest=prefix + TUNED_OPTION.dest, metavar=TUNED_OPTION.metavar,
                       help=TUNED_OPTION.help)


def feed_seconds(text: str) -> float:
    """argparse ``type`` for ``--feed-interval``: a plain decimal number of seconds from the meter's shortest interval
    on (:func:`launcher.base.untrusted.seconds`)."""
    import argparse

    from launcher.base.untrusted import seconds
    from launcher.feed.meter import MIN_INTERVAL_S

    return seconds(text, MIN_INTERVAL_S, inclusive=True, error=argparse.ArgumentTypeError)


def add_feed_arguments(group: argparse._ActionsContainer, prefix: str = "") -> None:
    """The feed meter's options (:data:`FEED_OPTIONS`), argparse side, for ``exec``, ``run`` and ``torchrun``."""
    for spec in FEED_OPTIONS:
        kwargs: dict[str, Any] = {"dest": prefix + spec.dest, "help": spec.help}
        if spec.is_flag:
            kwargs["action"] = "store_true"
        else:
            kwargs.update(default=spec.default, metavar=spec.metavar,
                          type=non_negative if spec.count else feed_seconds if spec.metavar == "SECONDS" else str)
        group.add_argument(spec.flag, **kwargs)


def add_run_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, verbose: str, dry_run: str,
                  prefix: str = "", short: bool = True) -> None:
    """``--verbose`` and ``--dry-run``, one spelling for ``affrun exec``, ``run`` and ``torchrun``; ``--affrun-verbose``
    and ``--affrun-dry-run`` (torchrun's spelling before) are kept as aliases. ``prefix`` goes before the ``dest``
    (torchrun's namespace holds its own options too); ``short`` adds ``-v`` (not beside torchrun's options)."""
    flags = ["-v"] if short else []
    parser.add_argument(*flags, "--verbose", "--affrun-verbose", dest=f"{prefix}verbose", action="store_true",
                        help=verbose)
    parser.add_argument("--dry-run", "--affrun-dry-run", dest=f"{prefix}dry_run", action="store_true", help=dry_run)
