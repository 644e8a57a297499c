"""``affrun torchrun``: a drop-in for torchrun that binds every local rank."""

from __future__ import annotations

import gc
import os
import sys

import click

from launcher.env.variables import BINDING_VARIABLES


def import_torch_unbound() -> None:
    """``import torch`` without letting its OpenMP runtime pin this process (the agent) to one CPU.

    libgomp reads the binding variables once, when it loads, and with any of them set it binds the loading
    thread to its first place: the agent, every rank it starts and the plan would all be confined to one CPU.
    So the variables are out of the environment during the import and back right after it: the ranks get the
    user's values, and the env policy judges them there. The mask is read before the import and put back if the
    import narrowed it anyway (a runtime preloaded with a variable affrun does not know).
    """
    hidden = {name: os.environ.pop(name) for name in BINDING_VARIABLES if name in os.environ}
    before = os.sched_getaffinity(0)
    try:
        import torch  # noqa: F401
    finally:
        os.environ.update(hidden)
    if os.sched_getaffinity(0) != before:
        os.sched_setaffinity(0, before)


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def torchrun(args: tuple[str, ...]) -> None:
    """torchrun with each local rank bound by affrun (affrun's options go before the script)."""
    # After `import torch` the agent holds ~257,000 objects, and every full collection walks all of them (118 ms
    # a pass, measured on a 2-CPU machine whose CPUs the ranks need). The collector stays off until torchrun's
    # agent starts; launcher.launch.torchrun.main then freezes those objects and turns it back on. Ranks are untouched.
    gc.disable()
    try:
        import_torch_unbound()
    except ImportError:
        click.echo("affrun: error: affrun torchrun needs torch (pip install torch)", err=True)
        sys.exit(2)
    from launcher.launch.torchrun import main as torchrun_main

    sys.exit(torchrun_main(list(args)))
