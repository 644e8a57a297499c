"""The click command group. Each command lives in its own module, imported only when it runs; every error a command
raises is one ``affrun: error:`` line and the error's exit status, here once (usage errors worded by
:mod:`launcher.options.usage`, exit status 2).
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from launcher.base.errors import AffrunError, error_line
from launcher.base.version import __version__
from launcher.options.table import spell_error
from launcher.options.usage import UsageLine, unknown_word, usage_text

# command name -> "module:attribute" of its click command, imported when it runs
COMMANDS: dict[str, str] = {
    "topology": "launcher.cli.topology_cmds:topology",
    "plan": "launcher.cli.topology_cmds:plan",
    "show": "launcher.cli.topology_cmds:show",
    "exec": "launcher.launch.exec_cmd:command",
    "torchrun": "launcher.launch.torchrun:command",
    "run": "launcher.launch.run_cmd:command",
    "sbatch": "launcher.cli.sbatch_cmd:sbatch",
    "doctor": "launcher.cli.doctor_cmd:doctor",
    "tune": "launcher.cli.tune_cmd:tune",
}


class LazyGroup(click.Group):
    """The ``affrun`` group: commands imported lazily, errors as one line."""

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

