"""A usage error of every click command is one line in ``affrun torchrun``'s form, with exit status 2.

``affrun: error: unknown option --x: did you mean --y? (affrun CMD --help gives the full usage)``: no usage block,
no "Try ... for help". In process, over every option of every click command; the real entry point and the match
with torchrun's own line are in ``tests/system/test_cli_usage_errors_processes.py``.
"""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from launcher.cli import COMMANDS, cli
from launcher.options.click import Verbatim

LINE = re.compile(r"^affrun: error: unknown (option|command) (\S+)(?:: did you mean (\S+)\?)? "
                  r"\((affrun(?: \S+)?) --help gives the full usage\)$")


def command(name: str) -> click.Command:
    found = cli.get_command(click.Context(cli), name)
    assert found is not None, name
    return found


# Not click's to parse: torchrun parses its words with torchrun's argparse, tune hands them to that parser.
CLICK_COMMANDS = sorted(name for name in COMMANDS if not isinstance(command(name), Verbatim))


def long_names(name: str) -> list[str]:
    return sorted({n for p in command(name).params if isinstance(p, click.Option) and not p.hidden
                   for n in p.opts if n.startswith("--")})


def one_line(args: list[str]) -> str:
    result = CliRunner().invoke(cli, args, prog_name="affrun", catch_exceptions=False)
    assert result.exit_code == 2, (args, result.output)
    assert result.stdout == "", (args, result.stdout)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, (args, result.stderr)
    assert lines[0].startswith("affrun: error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("name", CLICK_COMMANDS)
def test_a_misspelled_option_names_its_nearest_spelling(name: str) -> None:
    known = long_names(name)
    for option in known:
        for typo in (option + "x", option[:-1], "--" + option[2:].replace("-", "_") + "s"):
            if typo.replace("_", "-") in {n.replace("_", "-") for n in known}:
                continue
            line = one_line([name, typo])
            match = LINE.match(line)
            assert match and match[1] == "option" and match[2] == typo and match[4] == f"affrun {name}", line
            assert match[3] is not None and match[3].replace("_", "-") in {
                n.replace("_", "-") for n in long_names(name)}, line


@pytest.mark.parametrize("name", CLICK_COMMANDS)
def test_an_option_like_no_other_is_named_without_a_guess(name: str) -> None:
    match = LINE.match(one_line([name, "--qqqqqqqqqqqq"]))
    assert match and match[2] == "--qqqqqqqqqqqq" and match[3] is None


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_misspelled_command_names_the_command(name: str) -> None:
    for typo in (name + "-x", name[:-1], name[0] + name[2:]):
        if typo in COMMANDS:
            continue
        match = LINE.match(one_line([typo]))
        assert match and match[1] == "command" and match[2] == typo and match[4] == "affrun", typo
        assert match[3] in COMMANDS, (typo, match[3])


@pytest.mark.parametrize(
    "args",
    [["--qqqqq"], ["tune-x-y-z-w"], ["plan", "--mode", "bogus"], ["plan", "--nproc-per-node", "x"],
     ["doctor", "--pid"], ["plan", "--fsroot"], ["topology", "extra"], ["show", "-Q"], ["plan", "--json=1"]],
)
def test_every_usage_error_is_one_line_naming_where_the_usage_is(args: list[str]) -> None:
    line = one_line(args)
    where = "affrun" if args[0].startswith("-") or args[0] not in COMMANDS else f"affrun {args[0]}"
    assert line.endswith(f"({where} --help gives the full usage)"), line
    assert "Usage:" not in line and "Try " not in line


def test_help_is_still_help() -> None:
    result = CliRunner().invoke(cli, ["plan", "--help"], prog_name="affrun")
    assert result.exit_code == 0 and result.stdout.startswith("Usage: affrun plan")


@pytest.mark.parametrize("name", ["exec", "run"])
def test_exec_and_run_help_is_clicks_with_every_launch_option(name: str) -> None:
    from launcher.options.table import LAUNCH_OPTIONS

    result = CliRunner().invoke(cli, [name, "--help"], prog_name="affrun")
    assert result.exit_code == 0 and result.stdout.startswith(f"Usage: affrun {name} [OPTIONS] -- COMMAND [ARGS...]")
    assert all(spec.flag in result.stdout for spec in LAUNCH_OPTIONS), result.stdout
