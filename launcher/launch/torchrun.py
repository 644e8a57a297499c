"""``affrun torchrun``: torchrun, run in this process with torchrun's own parser (affrun's options added), the plan
made once and handed to the workers in ``AFFRUN_PLAN``, and each worker command rewritten to ``affrun exec --
<the original worker command>``. Exit status, signal forwarding and logs are torchrun's (docs/design.md §9).
"""

from __future__ import annotations

import argparse
import gc
import os
import stat
import sys
from collections.abc import Sequence
from typing import NoReturn

import click

from launcher.base.errors import ConfigError
from launcher.base.untrusted import shell_join, shown, warning_line
from launcher.bind.handoff import exec_prefix, plan_job
from launcher.bind.wire import PLAN_VARIABLE
from launcher.env.rank_line import mem_text, rank_line
from launcher.env.variables import BINDING_VARIABLES, user_values
from launcher.options.click import Verbatim
from launcher.options.record import Options
from launcher.options.table import LAUNCH_OPTIONS, add_arguments
from launcher.options.usage import argparse_line

DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torchrun's own default for --signals-to-handle


def add_affrun_options(parser: argparse.ArgumentParser) -> None:
    """Add affrun's options (the table's launch options, ``--verbose``, ``--dry-run``) to torchrun's ``parser``."""
    group = parser.add_argument_group("affrun", "CPU binding options (see affrun plan --help)")
    add_arguments(group, LAUNCH_OPTIONS, prefix="affrun_")
    # exec's and run's --verbose and --dry-run (launcher.options.click.launch_options), under their old names too
    group.add_argument("--verbose", "--affrun-verbose", dest="affrun_verbose", action="store_true",
                       help="Each rank also prints its line and env notes from inside the worker.")
    group.add_argument("--dry-run", "--affrun-dry-run", dest="affrun_dry_run", action="store_true",
                       help="Print the plan and the rewritten worker command, start nothing.")


# torchrun's options that affrun refuses (check_args): parsed, so refused by name, but not listed in --help.
REFUSED_OPTIONS = ("--numa-binding", "--numa_binding", "--run-path", "--run_path")


def parse(argv: Sequence[str], refuse: bool = False, command: str = "affrun torchrun",
          offered: Sequence[str] = ()) -> argparse.Namespace:
    """torchrun's and affrun's options, the script, and the script's arguments exactly as given (only the words
    before the script are parsed: docs/launchers.md). What argparse refuses is a :class:`ConfigError` (worded for
    the job's command line under ``refuse``); ``command`` and ``offered``: what a usage error names and suggests."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = "affrun torchrun"
    add_affrun_options(parser)
    for name in REFUSED_OPTIONS:
        if name in parser._option_string_actions:
            parser._option_string_actions[name].help = argparse.SUPPRESS
    for i, flag in enumerate(offered):  # never in argv: only spellings a usage error may suggest
        parser.add_argument(flag, dest=f"offered_{i}", help=command)

    def error(message: str) -> NoReturn:
        if refuse:
            raise ConfigError(f"affrun torchrun would refuse it in the job: {message}")
        raise ConfigError(argparse_line(parser, message, command))  # not torchrun's 30-line usage

    parser.error = error  # type: ignore[method-assign]
    # None tells "not given" from an explicit value equal to torchrun's default (PET_SIGNALS_TO_HANDLE is read below).
    parser.set_defaults(signals_to_handle=None)
    head, script_args = split_at_script(parser, list(argv))
    args = parser.parse_args(head)
    args.affrun_tuned_file = None
    if args.affrun_tuned is not None:  # affrun tune --save's options, under the flags given here
        from launcher.options.tuned import apply_tuned, tunable

        unset = object()  # what the command line gave: parsed again, with no defaults
        parser.set_defaults(**{f"affrun_{spec.dest}": unset for spec in tunable()})
        again = vars(parser.parse_args(head))
        given = {spec.dest for spec in tunable() if again[f"affrun_{spec.dest}"] is not unset}
        args.affrun_tuned_file = apply_tuned(vars(args), given, prefix="affrun_")
    if script_args:
        args.training_script_args = script_args
    return args


def split_at_script(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """(the options and the script, the script's arguments): walk the options as argparse would, using its
    table to know which take a value, and stop at the first word that is neither an option nor a value."""
    actions = parser._option_string_actions
    long_names = [name for name in actions if name.startswith("--")]
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv[: i + 2], argv[i + 2 :]  # the script follows; torchrun's argparse drops the "--"
        if not word.startswith("-") or word == "-":
            return argv[: i + 1], argv[i + 1 :]
        takes_value = False
        if word.startswith("--"):
            name, has_value, _ = word.partition("=")
            action = actions.get(name)
            if action is None and parser.allow_abbrev:  # argparse takes any unique prefix of a long option
                matches = [n for n in long_names if n.startswith(name)]
                action = actions[matches[0]] if len(matches) == 1 else None
            takes_value = action is not None and action.nargs != 0 and not has_value
        else:
            action = actions.get(word[:2])
            takes_value = action is not None and action.nargs != 0 and len(word) == 2  # "-r3" carries its value
        i += 2 if takes_value else 1
    return argv, []


def worker_command(args: argparse.Namespace) -> list[str]:
    """The command torchrun would start for each worker (before affrun's rewrite)."""
    if args.no_python:
        if args.module:
            raise ConfigError("don't use both --no-python and --module (torchrun refuses it too)")
        return [args.training_script]
    cmd = [os.getenv("PYTHON_EXEC", sys.executable), "-u"]
    if args.module:
        cmd.append("-m")
    return [*cmd, args.training_script]


def rewrite_for_exec(args: argparse.Namespace) -> list[str]:
    """Make torchrun start ``affrun exec -- <worker command> <script args>``; return that argv."""
    original = worker_command(args)
    args.no_python = True
    args.module = False
    prefix = exec_prefix()
    args.training_script = prefix[0]
    args.training_script_args = [*prefix[1:], "--", *original, *args.training_script_args]
    return [args.training_script, *args.training_script_args]


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Refuse what parses but cannot run bound: torchrun's own binding, ``--run-path``, ``--no-python`` with
    ``--module``, an empty script or module name. ``affrun sbatch`` runs it on the job's command line too."""
    if getattr(args, "numa_binding", None):
        raise ConfigError("--numa-binding is torchrun's own CPU binding and would fight affrun's: use one of them "
                          "(drop --numa-binding, or run plain torchrun)")
    if getattr(args, "run_path", False):
        raise ConfigError("--run-path runs the script inside torchrun's agent, where affrun cannot bind it: "
                          "drop --run-path")
    if not args.training_script:
        what = "module" if args.module else "command" if args.no_python else "script"
        raise ConfigError(f"the training {what} is an empty word ('')")
    worker_command(args)
    return args


def check_script(args: argparse.Namespace) -> None:
    """The training script exists and can be read, before any rank starts: else one line, not a rank's
    traceback and torchrun's failure report. Not for ``-m`` or ``--no-python``: torchrun resolves those (a
    module on the workers' path, a program on their PATH). A directory or a zip file runs its ``__main__.py``."""
    if args.module or args.no_python:
        return
    script = args.training_script
    try:
        info = os.stat(script)
        if stat.S_ISDIR(info.st_mode):
            if not os.path.isfile(os.path.join(script, "__main__.py")):
                raise ConfigError(f"the training script {script!r} is a directory without __main__.py")
            return
        if not stat.S_ISREG(info.st_mode):  # python would wait on a FIFO, or read /dev/zero without end
            kind = ("a FIFO" if stat.S_ISFIFO(info.st_mode) else "a socket" if stat.S_ISSOCK(info.st_mode)
                    else "a device")
            raise ConfigError(f"the training script {script!r} is {kind}, not a file")
        os.close(os.open(script, os.O_RDONLY | os.O_NONBLOCK))
    except FileNotFoundError:
        where = "" if os.path.isabs(script) else f" (from {os.getcwd()})"
        raise ConfigError(f"the training script {script!r} does not exist{where}") from None
    except OSError as exc:
        raise ConfigError(f"the training script {script!r} cannot be read: {exc.strerror or exc}") from None


def import_torch_unbound() -> None:
    """``import torch`` without letting its OpenMP runtime pin this process (the agent) to one CPU: the binding
    variables are out of the environment during the import, and the mask is put back if it narrowed anyway
    (docs/design.md §9)."""
    hidden = {name: os.environ.pop(name) for name in BINDING_VARIABLES if name in os.environ}
    before = os.sched_getaffinity(0)
    try:
        import torch  # noqa: F401
    finally:
        os.environ.update(hidden)
    if os.sched_getaffinity(0) != before:
        os.sched_setaffinity(0, before)


@click.command("torchrun", cls=Verbatim,
               help="torchrun with each local rank bound by affrun (affrun's options go before the script).")
def command(words: list[str]) -> None:
    sys.exit(main(words))


def main(argv: Sequence[str]) -> int:
    """``affrun torchrun ARGS``: every word after ``torchrun``, as typed."""
    gc.disable()  # until torchrun's agent starts: launch() freezes torch's objects (docs/design.md §9)
    try:
        import_torch_unbound()
    except ImportError:
        raise ConfigError("affrun torchrun needs torch (pip install torch)") from None
    return launch(argv)


def _warn(text: str) -> None:
    print(warning_line(text), file=sys.stderr)


def launch(argv: Sequence[str]) -> int:
    """Parse, plan once, and run torchrun's agent here (torch is imported: :func:`main`)."""
    args = check_args(parse(argv))
    check_script(args)
    from torch.distributed.run import determine_local_world_size

    try:
        nproc = determine_local_world_size(args.nproc_per_node)
    except ValueError as exc:
        raise ConfigError(f"--nproc-per-node {args.nproc_per_node}: {exc}") from None
    user_env = user_values(os.environ)
    from launcher.options.tuned import foreign_check, plan_tuned

    tuned = args.affrun_tuned_file
    loaded = None if tuned is None else foreign_check(tuned, Options.from_args(args, prefix="affrun_"), None, _warn)
    parent = plan_tuned(tuned, args, lambda values: plan_job(Options.from_args(values, prefix="affrun_"), nproc,
                                                             user_env=user_env, loaded=loaded)[1], prefix="affrun_")
    plan, mem = parent.plan, parent.mem_policy
    host = os.uname().nodename
    for rank in plan.ranks:
        # "starting": the plan a rank is about to start with; affrun exec --verbose prints the line once bound
        line = rank_line(rank, nproc, mem_text(mem, rank.mem_nodes), host)
        print(shown(line.replace("affrun: rank ", "affrun: starting rank ", 1)), file=sys.stderr)
    for warning in plan.warnings:
        _warn(warning)
    if args.signals_to_handle is None:
        # Slurm's time-limit warnings (sbatch --signal) too, unless the user chose (docs/launchers.md)
        args.signals_to_handle = os.environ.get("PET_SIGNALS_TO_HANDLE") or DEFAULT_SIGNALS + ",SIGUSR1,SIGUSR2"
    script = args.training_script  # what torchrun's failure report names (before the rewrite below)
    worker = rewrite_for_exec(args)
    from launcher.feed.variables import feed_variables, start_afresh

    feed = feed_variables(args, prefix="affrun_")
    if args.affrun_dry_run:
        print("worker: " + shell_join(worker))
        for name, value in sorted(feed.items()):
            print(shown(f"{name}={value}"))
        from launcher.launch.dry_run import job_notes

        for line in job_notes(parent.to_json()):
            print(line)
        return 0
    start_afresh(feed)
    os.environ.update(feed)  # every rank's environment: its startup hook meters it (launcher.feed.meter)
    os.environ[PLAN_VARIABLE] = parent.to_env()  # in the variable, never a file: ParentPlan.to_env says why
    # keeps torchrun's OMP_NUM_THREADS=1 warning away; each worker's affrun exec sets its own value
    os.environ.setdefault("OMP_NUM_THREADS", str(plan.ranks[0].threads))
    sys.stderr.flush()
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
    from torch.distributed.run import run

    def run_torchrun(args: argparse.Namespace) -> None:
        # name the user's script in torchrun's failure report, not exec_prefix's -c code (docs/design.md §9)
        try:
            run(args)  # type: ignore[no-untyped-call]
        except ChildFailedError as exc:
            raise ChildFailedError(name=script, failures=exc.failures) from None

    gc.freeze()  # what exists now lives as long as the agent: out of every future collection
    gc.enable()
    record(run_torchrun)(args)
    return 0
