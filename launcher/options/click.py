"""The one click builder: each row of the option table as a click option (:func:`click_option`), and the two
command shapes besides plain click's: :class:`Launch` (``[OPTIONS] -- COMMAND ARGS``) and :class:`Verbatim`
(every word to a parser of its own).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from launcher.base.cpulist import MAX_COUNT
from launcher.base.untrusted import ascii_uint, short
from launcher.options.table import LAUNCH_OPTIONS, OptionSpec, options_in

F = TypeVar("F", bound=Callable[..., Any])
COMMAND = "command"  # where Launch leaves the words after "--" (ctx.meta)


class Value(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2 only
    """A value read as every vocabulary reads its kind (:func:`launcher.options.values.read`): ASCII digits only."""

    def __init__(self, kind: str = "count", low: float = 0, high: int | None = MAX_COUNT, over: bool = False) -> None:
        self.kind, self.low, self.high, self.over = kind, low, high, over
        self.name = "integer" if kind == "count" else "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from launcher.options.values import BadValue, read

        try:
            return read(self.kind, value, "cli", low=self.low, high=self.high, over=self.over)
        except BadValue as exc:
            self.fail(exc.is_not(value), param, ctx)


class Choice(click.Choice):  # type: ignore[type-arg]
    """One of ``choices``, refused in the words torchrun's argparse uses for the same options."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value in self.choices:
            return value
        self.fail(f"invalid choice: {short(value)} (choose from {', '.join(map(repr, self.choices))})", param, ctx)


class Digits(click.ParamType):  # type: ignore[type-arg]
    """``affrun sbatch``'s integers: ASCII digits as an int; anything else stays the text it was, for sbatch to
    refuse as a profile's value."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        number = ascii_uint(value) if isinstance(value, str) else None
        return value if number is None else number


COUNT = Value()
PID = Value("count", 1, None)


def click_option(spec: OptionSpec) -> Callable[[F], F]:
    """``spec`` as a click option, its value landing in ``spec.dest``."""
    if spec.is_flag:
        return click.option(*spec.flags, spec.dest, is_flag=True, default=spec.default or False, help=spec.help)
    kind: Any = (Choice(spec.choices) if spec.choices else Value(spec.kind, spec.low, over=spec.over)
                 if spec.kind in ("count", "seconds") else Digits() if spec.kind in ("int", "port") else None)
    # no envvar: load_topology reads $AFFRUN_FSROOT itself, after a --topology given here
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


def nproc_option(help: str, dest: str = "nproc") -> Callable[[F], F]:
    return click.option("--nproc-per-node", "--nproc_per_node", dest, type=COUNT, default=None, help=help)


def launch_options(verbose: str, dry_run: str) -> Callable[[F], F]:
    """What ``exec`` and ``run`` take besides their own flags: the table's launch options, ``--verbose`` and
    ``--dry-run`` (``--affrun-verbose`` and ``--affrun-dry-run``, torchrun's spellings, as aliases)."""
    def decorate(func: F) -> F:
        func = click.option("--dry-run", "--affrun-dry-run", "dry_run", is_flag=True, help=dry_run)(func)
        func = click.option("-v", "--verbose", "--affrun-verbose", "verbose", is_flag=True, help=verbose)(func)
        return click_options(LAUNCH_OPTIONS)(func)

    return decorate


class Launch(click.Command):
    """``affrun CMD [OPTIONS] -- COMMAND [ARGS...]``: click reads the words before the first ``--``; those after
    it are COMMAND's, untouched, in ``ctx.meta[COMMAND]`` (an option after COMMAND is COMMAND's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.options_metavar, self.allow_extra_args = "[OPTIONS] -- COMMAND [ARGS...]", True

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        at = args.index("--") if "--" in args else len(args)
        ctx.meta[COMMAND] = args[at + 1:]
        rest = super().parse_args(ctx, args[:at])
        if ctx.args and not ctx.resilient_parsing:
            raise click.UsageError(f"unexpected argument {short(ctx.args[0])}: put the command after --", ctx)
        return rest


def given(ctx: click.Context) -> set[str]:
    """The parameters (by ``dest``) the command line gave: an explicit default counts (``--mode exclusive``)."""
    from click.core import ParameterSource

    return {name for name in ctx.params if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE}


class Verbatim(click.Command):
    """A command whose every word goes to a parser of its own, untouched (``--`` and ``--help`` included), as the
    callback's ``words``: ``affrun torchrun`` (torchrun's argparse) and ``affrun tune`` (its words are torchrun's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_help_option = False

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.params["words"] = list(args)
        return []
