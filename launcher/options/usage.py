"""The one wording of a usage error, for click's parser and argparse's: one line, exit status 2
(``unknown option --x: did you mean --y? (affrun CMD --help gives the full usage)``).
"""

from __future__ import annotations

from typing import IO, TYPE_CHECKING, Any

import click

from launcher.base.errors import LaunchError, error_line

if TYPE_CHECKING:
    import argparse


def usage_hint(command: str) -> str:
    """``(CMD --help gives the full usage)``: where a usage error sends the user."""
    return f"({command} --help gives the full usage)"


def nearest(word: str, known: list[str]) -> str | None:
    """The spelling of ``known`` nearest to ``word`` (``_`` in an option read as ``-``), if one is close."""
    import difflib

    close = difflib.get_close_matches(word.replace("_", "-") if word.startswith("--") else word, known, n=1,
                                      cutoff=0.6)
    return close[0] if close else None


def unknown_word(kind: str, word: str, known: list[str], command: str) -> str:
    """``unknown option --x: did you mean --y? (CMD --help gives the full usage)`` (``kind``: option, command)."""
    from launcher.base.untrusted import clip

    close = nearest(word, known)
    guess = f": did you mean {close}?" if close else ""
    return f"unknown {kind} {clip(word)}{guess} {usage_hint(command)}"


def argparse_line(parser: argparse.ArgumentParser, message: str, command: str) -> str:
    """What argparse's ``parser.error`` says, as one line of that form: an unknown option gets the nearest of the
    ``--`` spellings ``--help`` lists (the first unknown word that has one, else the first unknown word)."""
    import argparse

    known = sorted(name for name, action in parser._option_string_actions.items()
                   if name.startswith("--") and action.help != argparse.SUPPRESS)
    prefix = "unrecognized arguments: "
    if message.startswith(prefix):
        unknown = [word.partition("=")[0] for word in message[len(prefix):].split() if word.startswith("-")]
        for word in unknown:
            if nearest(word, known):
                return unknown_word("option", word, known, command)
        if unknown:
            return unknown_word("option", unknown[0], known, command)
    return f"{message} {usage_hint(command)}"


def long_options(command: click.Command) -> list[str]:
    """The ``--`` spellings ``command`` shows in its help, ``_`` written as ``-`` (an alias in either spelling is
    then one name)."""
    names = ["--help"]
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            names += [n.replace("_", "-") for n in (*param.opts, *param.secondary_opts) if n.startswith("--")]
    return sorted(set(names))


def usage_text(exc: click.UsageError, where: click.Context) -> str:
    """What click's usage error says, as one line of argparse's form (no usage block, no "Try"). ``where``: the
    context that was parsing, when click's error does not carry one (a missing value)."""
    ctx = exc.ctx or where
    if isinstance(exc, click.NoSuchOption):
        return unknown_word("option", exc.option_name, long_options(ctx.command), ctx.command_path)
    if isinstance(exc, click.BadParameter) and isinstance(exc.param, click.Option):
        text = f"argument {'/'.join(exc.param.opts)}: {exc.message.rstrip('.')}"
    elif isinstance(exc, click.BadOptionUsage) and exc.message.endswith("requires an argument."):
        text = f"argument {exc.option_name}: expected one argument"
    else:
        text = exc.format_message().rstrip(".")
        if text[1:2].islower():  # "Got unexpected extra argument": mid-line, as argparse's
            text = text[0].lower() + text[1:]
    return f"{text} {usage_hint(ctx.command_path)}"


class UsageLine(click.ClickException):
    """A usage error shown as one ``affrun: error:`` line, exit status 2 (click's own shows its usage block)."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(error_line(LaunchError(self.message)), err=True)
