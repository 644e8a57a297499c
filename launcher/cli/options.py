"""Click options built from :data:`launcher.options.table.BINDING_OPTIONS`, the table ``affrun exec`` and
``affrun torchrun`` build their argparse arguments from, as plain decorators (as in sqlite-utils)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from launcher.base.cpulist import MAX_COUNT
from launcher.base.untrusted import ascii_uint, short
from launcher.options.table import OptionSpec, options_in

F = TypeVar("F", bound=Callable[..., Any])


class WholeNumber(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2 only
    """A count or a pid as the argparse side reads one (:func:`launcher.options.table.non_negative`): ASCII digits
    only, in range (click's int also takes '١', '1_0' and ' +3')."""

    name = "integer"

    def __init__(self, low: int = 0, high: int | None = MAX_COUNT) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        number = value if isinstance(value, int) else ascii_uint(value) if isinstance(value, str) else None
        if number is None or number < self.low or (self.high is not None and number > self.high):
            bound = f"from {self.low} to {self.high}" if self.high is not None else f">= {self.low}"
            self.fail(f"{short(value)} is not a whole number {bound}", param, ctx)
        return number


COUNT = WholeNumber()
PID = WholeNumber(1, None)


def _click_option(spec: OptionSpec) -> Callable[[F], F]:
    if spec.is_flag:
        return click.option(spec.flag, spec.dest, is_flag=True, help=spec.help)
    kind: Any = click.Choice(spec.choices) if spec.choices else COUNT if spec.count else None
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
