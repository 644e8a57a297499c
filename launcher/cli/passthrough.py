"""``affrun exec`` and ``affrun run`` as click sees them: listed in ``affrun --help``. The console script
dispatches both to their argparse front ends before click is imported (:mod:`launcher.main`), so these commands
only run through ``launcher.cli`` directly, and hand every word after the command name to the front end."""

from __future__ import annotations

import importlib
import sys

import click


def passthrough(name: str, module: str, doc: str) -> click.Command:
    """A click command that gives the words after ``name`` to ``module.main`` untouched and exits with its code."""

    @click.command(
        name,
        help=doc,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
        add_help_option=False,
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> None:
        main = importlib.import_module(module).main
        # click swallows the "--" that separates affrun's options from CMD; take the words as typed when we can.
        raw = sys.argv[sys.argv.index(name) + 1 :] if name in sys.argv else list(args)
        sys.exit(main(raw))

    return command


exec_ = passthrough(
    "exec", "launcher.launch.exec_cmd",
    "Bind one rank (local rank from LOCAL_RANK, SLURM_LOCALID, ...) and exec CMD: affrun exec -- CMD ARGS.")
run = passthrough(
    "run", "launcher.launch.run_cmd",
    "Plan once and run any launcher (accelerate, deepspeed, Lightning, mp.spawn): affrun run -- CMD ARGS.")
