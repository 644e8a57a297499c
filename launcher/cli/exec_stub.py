"""``affrun exec`` as click sees it: listed in ``affrun --help``; the console script dispatches ``exec`` to
:mod:`launcher.exec_cmd` before click is imported, so this only runs through ``launcher.cli`` directly."""

from __future__ import annotations

import sys

import click


@click.command(
    "exec",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def exec_(args: tuple[str, ...]) -> None:
    """Bind one rank (local rank from LOCAL_RANK, SLURM_LOCALID, ...) and exec CMD: affrun exec -- CMD ARGS."""
    from launcher.exec_cmd import main

    # click swallows the "--" that separates affrun's options from CMD; take the words as typed when we can.
    raw = sys.argv[sys.argv.index("exec") + 1 :] if "exec" in sys.argv else list(args)
    sys.exit(main(raw))
