"""``affrun torchrun``: a drop-in for torchrun that binds every local rank."""

from __future__ import annotations

import gc
import sys

import click


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def torchrun(args: tuple[str, ...]) -> None:
    """torchrun with each local rank bound by affrun (affrun's options go before the script)."""
    # After `import torch` the agent holds ~257,000 objects, and every full collection walks all of them (118 ms
    # a pass, measured on a 2-CPU machine whose CPUs the ranks need). The collector stays off until torchrun's
    # agent starts; launcher.torchrun.main then freezes those objects and turns it back on. Ranks are untouched.
    gc.disable()
    try:
        import torch  # noqa: F401
    except ImportError:
        click.echo("affrun: error: affrun torchrun needs torch (pip install torch)", err=True)
        sys.exit(2)
    from launcher.torchrun import run_cli

    sys.exit(run_cli(list(args)))
