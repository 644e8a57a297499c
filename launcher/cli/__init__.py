"""The click command group. Each command lives in its own module and is imported only when it runs; ``exec``,
``run`` and ``torchrun`` parse their own words with argparse (:mod:`launcher.launch`) and are listed here.

A usage error of any click command (an unknown command or option, a bad or missing value) is one line in
``affrun torchrun``'s form, ``affrun: error: unknown option --x: did you mean --y? (affrun plan --help gives the
full usage)``, and exit status 2: :class:`UsageLine`.
"""

from __future__ import annotations

import importlib
import sys
from typing import IO, Any

import click

from launcher.base.version import __version__
from launcher.errors import AffrunError, LaunchError, error_line
from launcher.options.table import spell_error
from launcher.options.usage import unknown_word, usage_hint

# command name -> "module:attribute": a click command, or the main(words) of an argparse front end (FRONT_ENDS).
# Modules are imported lazily so that `affrun plan` never loads torch/yaml.
COMMANDS: dict[str, str] = {
    "topology": "launcher.cli.topology_cmds:topology",
    "plan": "launcher.cli.topology_cmds:plan",
    "show": "launcher.cli.topology_cmds:show",
    "exec": "launcher.launch.exec_cmd:main",
    "torchrun": "launcher.launch.torchrun:main",
    "run": "launcher.launch.run_cmd:main",
    "sbatch": "launcher.cli.sbatch_cmd:sbatch",
    "doctor": "launcher.cli.doctor_cmd:doctor",
    "tune": "launcher.cli.tune_cmd:tune",
}
# The commands that parse their own words (argparse: docs/development.md), with their line in `affrun --help`. The console script runs exec and run before click is imported (launcher.main).
FRONT_ENDS: dict[str, str] = {
    "exec": "Bind one rank (local rank from LOCAL_RANK, SLURM_LOCALID, ...) and exec CMD: affrun exec -- CMD ARGS.",
    "torchrun": "torchrun with each local rank bound by affrun (affrun's options go before the script).",
    "run": "Plan once and run any launcher (accelerate, deepspeed, Lightning, mp.spawn): affrun run -- CMD ARGS.",
}
# Commands whose words all belong to a parser of their own (click would drop their first "--"): main().
OWN_WORDS = (*FRONT_ENDS, "tune")


def long_options(command: click.Command) -> list[str]:
    """The ``--`` spellings ``command`` shows in its help, ``_`` written as ``-`` (an alias in either spelling is
    then one name)."""
    names = ["--help"]
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            names += [n.replace("_", "-") for n in (*param.opts, *param.secondary_opts) if n.startswith("--")]
    return sorted(set(names))


def usage_text(exc: click.UsageError, where: click.Context) -> str:
    """What click's usage error says, as one line of ``affrun torchrun``'s form (no usage block, no "Try").
    ``where``: the context that was parsing, when click's error does not carry one (a missing value)."""
    ctx = exc.ctx or where
    if isinstance(exc, click.NoSuchOption):
        return unknown_word("option", exc.option_name, long_options(ctx.command), ctx.command_path)
    text = exc.format_message().rstrip(".")
    if text[1:2].islower():  # "Invalid value...", "Option '--pid' requires...": mid-line, as argparse's
        text = text[0].lower() + text[1:]
    return f"{text} {usage_hint(ctx.command_path)}"


class UsageLine(click.ClickException):
    """A usage error shown as one ``affrun: error:`` line, exit status 2 (click's own shows its usage block)."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(error_line(LaunchError(self.message)), err=True)


class LazyGroup(click.Group):
    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        """The group's own options (``affrun --bogus``): a usage error is one line."""
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise UsageLine(usage_text(exc, exc.ctx or click.Context(self, info_name=info_name, parent=parent)))\
                from None

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0]
        if name not in COMMANDS and not name.startswith("-") and not ctx.resilient_parsing:
            raise UsageLine(unknown_word("command", name, sorted(COMMANDS), ctx.command_path))
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; an :class:`AffrunError` from any of them becomes one line and its exit code, here once,
        and so does a usage error (:class:`UsageLine`)."""
        try:
            return super().invoke(ctx)
        except AffrunError as exc:
            click.echo(error_line(spell_error(exc)), err=True)
            ctx.exit(exc.exit_code)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise UsageLine(usage_text(exc, _subcommand_context(ctx))) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        if cmd_name in FRONT_ENDS:
            return _front_end(cmd_name, target)
        module_name, attr = target.split(":")
        command: click.Command = getattr(importlib.import_module(module_name), attr)
        return command


def _subcommand_context(ctx: click.Context) -> click.Context:
    """The context of the command ``ctx`` was running (``affrun doctor``), for an error that carries none."""
    name = ctx.invoked_subcommand
    command = ctx.command.get_command(ctx, name) if name and isinstance(ctx.command, click.Group) else None
    return click.Context(command, info_name=name, parent=ctx) if command is not None else ctx


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="affrun")
def cli() -> None:
    """Put every training rank on the right CPU cores: GPU-local, disjoint, whole cores, matching OpenMP settings."""


def _front_end(name: str, target: str) -> click.Command:
    """A click command that gives the words after ``name`` to ``target`` (``module:main``) untouched and exits
    with its code."""

    @click.command(name, help=FRONT_ENDS[name], add_help_option=False,
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> None:
        module, attr = target.split(":")
        sys.exit(getattr(importlib.import_module(module), attr)(list(args)))

    return command


def main(args: list[str] | None = None) -> None:
    words = sys.argv[1:] if args is None else list(args)
    if words[:1] and words[0] in OWN_WORDS:
        # click's parser drops the first "--" of a command line, even into an UNPROCESSED argument. Every word
        # after the command belongs to its own parser and the script, so put them all behind a "--" of affrun's
        # own: click drops that one, and passes the rest through untouched.
        words = [words[0], "--", *words[1:]]
    cli.main(args=words, prog_name="affrun", standalone_mode=True)
