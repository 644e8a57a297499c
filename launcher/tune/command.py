"""``affrun tune``'s command line: its own options (:data:`TUNE_OPTIONS`) taken out from among affrun torchrun's,
which every trial gets as given."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NoReturn

from launcher.base.errors import ConfigError
from launcher.base.outpath import checked, marked
from launcher.options.table import OptionSpec, add_arguments

if TYPE_CHECKING:
    from launcher.options.record import Options
    from launcher.topology.model import Topology


def _row(flag: str, dest: str, kind: str, default: Any, metavar: str | None, help: str, **more: Any) -> OptionSpec:
    return OptionSpec(flag, dest, "tune", help, kind, default=default, metavar=metavar, **more)


TUNE_OPTIONS: tuple[OptionSpec, ...] = (
    _row("--trial-seconds", "trial_seconds", "seconds", 10.0, "S", "Measure each trial for S seconds of the loop, "
         "after its warm-up.", over=True),
    _row("--warmup-seconds", "warmup_seconds", "seconds", 2.0, "S", "Let every rank run S seconds past its first "
         "batch before the measurement starts."),
    _row("--repeats", "repeats", "count", 1, "R", "Run every trial R times, interleaved (round after round), for "
         "the spread.", low=1),
    _row("--budget", "budget", "seconds", 900.0, "SECONDS", "Stop with what has been measured once the trials have "
         "taken this long.", over=True),
    _row("--start-seconds", "start_seconds", "seconds", 120.0, "S", "How long a trial may take to reach every rank's "
         "first batch; the first trial's script then never iterated a DataLoader.", over=True),
    _row("--json", "as_json", "flag", False, None, "Print the result as JSON (keys: trials, best)."),
    _row("--save", "save", "path", None, "FILE", "Write the best options as YAML, with this machine's identity: "
         "affrun torchrun --tuned FILE applies them."),
    _row("--svg", "svg", "path", None, "FILE", "Also draw the trials as an SVG bar chart."),
)

USAGE = "affrun tune [AFFRUN TORCHRUN OPTIONS] [TUNE OPTIONS] SCRIPT [ARGS...]"
DESCRIPTION = """\
Find the split of loader and compute cores, and the DataLoader workers, that feed your own script fastest.

Runs SCRIPT in short trials under `affrun torchrun --feed-report` with your options: the default plan first, then
--loader-cores 0 .. half a rank's cores, each with --loader-workers 0, one and two per loader core (the DataLoaders'
num_workers are set by affrun unless the script asks launcher.torch.loader_workers()). Each trial warms up, is
measured for --trial-seconds, and is stopped (SIGTERM to the job, SIGKILL after a grace period, nothing left
running). Prints each trial's batches/s (median, min, max), data wait and ratio to the default, and the best
options, or that the default stands. Ctrl-C stops and prints the table so far.

  affrun tune --nproc-per-node 2 train.py --epochs 1
  affrun tune --trial-seconds 5 --repeats 3 --save tuned.yaml train.py
  affrun torchrun --tuned tuned.yaml --nproc-per-node 2 train.py

Every affrun torchrun option (affrun torchrun --help) is taken too and given to every trial; the arguments after
SCRIPT reach it byte for byte. See docs/tune.md."""


def help_text() -> str:
    rows = [f"usage: {USAGE}", "", DESCRIPTION, "", "tune options:"]
    for spec in TUNE_OPTIONS:
        name = spec.flag if spec.is_flag else f"{spec.flag} {spec.metavar}"
        shown = f" (default: {spec.default:g})" if isinstance(spec.default, (int, float)) and not spec.is_flag else ""
        rows.append(f"  {name:<22} {spec.help}{shown}")
    rows.append(f"  {'-h, --help':<22} Show this message and exit.")
    return "\n".join(rows) + "\n"


def _tune_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="affrun tune", add_help=False, allow_abbrev=False)
    add_arguments(parser, TUNE_OPTIONS)

    def error(message: str) -> NoReturn:
        from launcher.options.usage import argparse_line

        raise ConfigError(argparse_line(parser, message, "affrun tune"))

    parser.error = error  # type: ignore[method-assign]
    return parser


@dataclass(frozen=True)
class TuneArgs:
    values: dict[str, Any]  # tune's own options by dest
    before: list[str]  # affrun torchrun's and torchrun's options, as given
    script: list[str]  # ["--"]? SCRIPT ARGS..., as given
    torchrun: argparse.Namespace  # affrun torchrun's parse of before + script


def split(argv: list[str]) -> TuneArgs | None:
    """Tune's options, the user's torchrun options and the script; ``None`` for ``--help``."""
    from torch.distributed.run import get_args_parser

    from launcher.launch.torchrun import add_affrun_options, check_args, check_script, parse

    parser = get_args_parser()
    add_affrun_options(parser)
    add_arguments(parser, TUNE_OPTIONS, prefix="tune_")  # to be told apart from torchrun's (_walk): never parsed
    mine, theirs, script = _walk(parser, list(argv))
    if any(word in ("-h", "--help") for word in theirs):
        return None
    values = vars(_tune_parser().parse_args(mine))
    named = next((w for w in script if w != "--"), None)  # the script's file, or -m's module: never replaced
    for option, dest, marker in OUTPUTS:  # refused now, before the script is parsed, and not after the trials
        if values[dest] is not None:
            checked(option, values[dest], marked(marker), named)
    if not [w for w in script if w != "--"]:
        raise ConfigError(f"no script: {USAGE}")
    args = check_args(parse([*theirs, *script], command="affrun tune", offered=[spec.flag for spec in TUNE_OPTIONS]))
    check_script(args)
    return TuneArgs(values, theirs, script, args)


CHART_TITLE = "affrun tune: "  # how the --svg chart's title begins: the chart is known by it, not any SVG of the user's
SVG_MARKER = f"<title>{CHART_TITLE}".encode()
OUTPUTS = (("--save", "save", b"affrun-tuned:"), ("--svg", "svg", SVG_MARKER))  # what each file affrun wrote holds


def _walk(parser: argparse.ArgumentParser, words: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(tune's options with their values, the other options, the script and its arguments), read as affrun
    torchrun reads them, abbreviations resolved as argparse does."""
    actions = parser._option_string_actions
    long_names = [name for name in actions if name.startswith("--")]
    mine: list[str] = []
    theirs: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--" or not word.startswith("-") or word == "-":
            return mine, theirs, words[i:]
        name, has_value, _ = word.partition("=")
        action = actions.get(name if word.startswith("--") else word[:2])
        if action is None and word.startswith("--"):
            matches = [n for n in long_names if n.startswith(name)]
            action = actions[matches[0]] if len(matches) == 1 else None
        takes = action is not None and action.nargs != 0 and not has_value and (word.startswith("--") or len(word) == 2)
        span = words[i: i + (2 if takes else 1)]
        if action is not None and action.dest.startswith("tune_"):
            full = next(f for f in action.option_strings if f.startswith("--"))
            mine += [full + ("=" + word.partition("=")[2] if has_value else ""), *span[1:]]
        else:
            theirs += span
        i += len(span)
    return mine, theirs, []


def rank_cores(args: argparse.Namespace) -> tuple[int, int, Topology, Options]:
    """(local ranks, the fewest cores a rank has with no loader cores, the machine, the user's options)."""
    import os

    from torch.distributed.run import determine_local_world_size

    from launcher.bind.handoff import plan_job
    from launcher.env.variables import user_values
    from launcher.options.record import Options

    try:
        nproc = determine_local_world_size(args.nproc_per_node)
    except ValueError as exc:
        raise ConfigError(f"--nproc-per-node {args.nproc_per_node}: {exc}") from None
    options = Options.from_args(args, prefix="affrun_")
    topo, parent = plan_job(replace(options, loader_cores=0), nproc, user_env=user_values(os.environ))
    return nproc, min(len(rank.compute_cores) for rank in parent.plan.ranks), topo, options
