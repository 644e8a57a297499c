"""The one wording of a usage error, for every parser affrun has (click's and argparse's):
``unknown option --x: did you mean --y? (affrun CMD --help gives the full usage)``, one line, exit status 2.

Standard library only, and ``difflib`` only once a word is unknown: ``affrun exec`` imports this module when
it parses options (with argparse, which imports typing).
"""

from __future__ import annotations

import argparse  # imported already: only a parser's error needs this module
from typing import NoReturn


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


def one_line_errors(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """``parser``, whose usage errors raise one :class:`~launcher.errors.ConfigError` line (:func:`argparse_line`)
    instead of printing argparse's usage block and exiting 2."""

    def error(message: str) -> NoReturn:
        from launcher.errors import ConfigError

        raise ConfigError(argparse_line(parser, message, command))

    parser.error = error  # type: ignore[method-assign]
    return parser
