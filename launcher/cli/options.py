"""Click options built from the option table's rows (:class:`launcher.options.table.OptionSpec`: the binding
options, ``affrun sbatch``'s own), the rows ``affrun exec`` and ``affrun torchrun`` build their argparse arguments
from, as plain decorators (as in sqlite-utils)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from launcher.base.cpulist import MAX_COUNT
from launcher.base.untrusted import ascii_uint
from launcher.options.table import OptionSpec, options_in

F = TypeVar("F", bound=Callable[..., Any])


class WholeNumber(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2 only
    """A count or a pid read as every vocabulary reads a count (:mod:`launcher.options.values`): ASCII digits only,
    in range (click's int also takes '١', '1_0' and ' +3')."""

    name = "integer"

    def __init__(self, low: int = 0, high: int | None = MAX_COUNT) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from launcher.options.values import BadValue, read

        try:
            return int(read("count", value, "cli", low=self.low, high=self.high))
        except BadValue as exc:
            self.fail(exc.is_not(value), param, ctx)


class Digits(click.ParamType):  # type: ignore[type-arg]
    """``affrun sbatch``'s integers: ASCII digits as an int; anything else stays the text it was, which sbatch
    refuses in one line, as a profile's value (:func:`launcher.slurm.profile.checked`)."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        number = ascii_uint(value) if isinstance(value, str) else None
        return value if number is None else number


COUNT = WholeNumber()
PID = WholeNumber(1, None)


def click_option(spec: OptionSpec) -> Callable[[F], F]:
    """``spec`` as a click option, its value landing in ``spec.dest``."""
    if spec.is_flag:
        return click.option(*spec.flags, spec.dest, is_flag=True, default=spec.default or False, help=spec.help)
    kind: Any = (click.Choice(spec.choices) if spec.choices else COUNT if spec.count
                 else Digits() if spec.kind in ("int", "port") else None)
    # no envvar: load_topology reads $AFFRUN_FSROOT itself, after a --topology given here (as argparse's side does)
    return click.option(*spec.flags, spec.dest, type=kind, default=spec.default, metavar=spec.metavar,
                        multiple=spec.kind == "lines", show_default=spec.default is not None and spec.kind != "lines",
                        help=spec.help)


def click_options(specs: Sequence[OptionSpec]) -> Callable[[F], F]:
    def decorate(func: F) -> F:
        for spec in reversed(specs):
            func = click_option(spec)(func)
        return func

    return decorate


topology_options = click_options(options_in("topology"))
plan_options = click_options(options_in("plan"))
env_options = click_options(options_in("env"))
