"""``affrun run`` as click sees it: listed in ``affrun --help``; the console script dispatches ``run`` to
:mod:`launcher.run_cmd` before click is imported, so this only runs through ``launcher.cli`` directly."""

from __future__ import annotations

import sys

import click


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(args: tuple[str, ...]) -> None:
    """Plan once and run any launcher (accelerate, deepspeed, Lightning, mp.spawn): affrun run -- CMD ARGS."""
    from launcher.run_cmd import main

    # click swallows the "--" that separates affrun's options from CMD; take the words as typed when we can.
    raw = sys.argv[sys.argv.index("run") + 1 :] if "run" in sys.argv else list(args)
    sys.exit(main(raw))
