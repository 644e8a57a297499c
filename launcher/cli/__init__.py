"""The click command group. Each command lives in its own module and is imported only when it runs."""

from __future__ import annotations

import importlib
import sys
from typing import Any, NoReturn

import click

from launcher.base.version import __version__
from launcher.errors import AffrunError, error_line
from launcher.options.table import spell_error

# command name -> "module:attribute"; modules are imported lazily so that `affrun plan` never loads torch/yaml.
COMMANDS: dict[str, str] = {
    "topology": "launcher.cli.topology_cmds:topology",
    "plan": "launcher.cli.topology_cmds:plan",
    "show": "launcher.cli.topology_cmds:show",
    "exec": "launcher.cli.passthrough:exec_",
    "torchrun": "launcher.cli.torchrun_cmd:torchrun",
    "run": "launcher.cli.passthrough:run",
    "sbatch": "launcher.cli.sbatch_cmd:sbatch",
    "doctor": "launcher.cli.doctor_cmd:doctor",
    "tune": "launcher.cli.tune_cmd:tune",
}


class LazyGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; an :class:`AffrunError` from any of them becomes one line and its exit code, here once."""
        try:
            return super().invoke(ctx)
        except AffrunError as exc:
            click.echo(error_line(spell_error(exc)), err=True)
            ctx.exit(exc.exit_code)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None  # command not built yet
            raise
        command: click.Command = getattr(module, attr)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="affrun")
def cli() -> None:
    """Put every training rank on the right CPU cores: GPU-local, disjoint, whole cores, matching OpenMP settings."""


def main(args: list[str] | None = None) -> None:
    words = sys.argv[1:] if args is None else list(args)
    if words[:1] in (["torchrun"], ["tune"]):
        # click's parser drops the first "--" of a command line, even into an UNPROCESSED argument. Every word
        # after "torchrun" (or "tune") belongs to torchrun's own parser and the script, so put them all behind a "--" of
        # affrun's own: click drops that one, and passes the rest through untouched.
        words = [words[0], "--", *words[1:]]
    cli.main(args=words, prog_name="affrun", standalone_mode=True)


def fail(exc: AffrunError) -> NoReturn:
    """Stop the command with ``exc``, reported by :meth:`LazyGroup.invoke` (``raise exc`` does the same)."""
    raise exc
