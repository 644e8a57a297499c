"""Click options built from :data:`launcher.options.table.BINDING_OPTIONS`, the table ``affrun exec`` and
``affrun torchrun`` build their argparse arguments from, as plain decorators (as in sqlite-utils)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from launcher.base.cpulist import MAX_COUNT
from launcher.options.table import OptionSpec, options_in

F = TypeVar("F", bound=Callable[..., Any])


def _click_option(spec: OptionSpec) -> Callable[[F], F]:
    if spec.is_flag:
        return click.option(spec.flag, spec.dest, is_flag=True, help=spec.help)
    kind: Any = click.Choice(spec.choices) if spec.choices else click.IntRange(min=0, max=MAX_COUNT) if spec.count else None
    # no envvar: load_topology reads $AFFRUN_FSROOT itself, after a --topology given here (as argparse's side does)
    return click.option(spec.flag, spec.dest, type=kind, default=spec.default, metavar=spec.metavar,
                        show_default=spec.default is not None, help=spec.help)


def _options(*groups: str) -> Callable[[F], F]:
    def decorate(func: F) -> F:
        for spec in reversed(options_in(*groups)):
            func = _click_option(spec)(func)
        return func

    return decorate


topology_options = _options("topology")
plan_options = _options("plan")
env_options = _options("env")
