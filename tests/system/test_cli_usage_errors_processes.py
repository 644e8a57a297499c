"""Usage errors through the real ``affrun`` command: one line in ``affrun torchrun``'s own form, exit status 2."""

from __future__ import annotations

import re

import pytest

from tests.launch import affrun_argv, clean_env, require_torch, run

FORM = re.compile(r"^affrun: error: unknown (option|command) (\S+)(?:: did you mean (\S+)\?)? "
                  r"\((affrun(?: \S+)?) --help gives the full usage\)$")


def one_line(*args: str) -> str:
    proc = run(affrun_argv(*args), env=clean_env())
    assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
    assert proc.stdout == "", proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "kind", "guess", "where"),
    [
        (["tune-x"], "command", "tune", "affrun"),
        (["qqqqqqqq"], "command", None, "affrun"),
        (["tpology"], "command", "topology", "affrun"),
        (["plan", "--comm-core"], "option", "--comm-cores", "affrun plan"),
        (["plan", "--loader-core"], "option", "--loader-cores", "affrun plan"),
        (["show", "--nproc"], "option", "--nproc-per-node", "affrun show"),
        (["doctor", "--jsonn"], "option", "--json", "affrun doctor"),
        (["sbatch", "--nodez", "2"], "option", "--nodes", "affrun sbatch"),
        (["--verison"], "option", "--version", "affrun"),
        (["exec", "--feed-reprot", "--", "true"], "option", "--feed-report", "affrun exec"),
        (["run", "--loader-coers", "1", "--", "true"], "option", "--loader-cores", "affrun run"),
        (["exec", "--qqqqqqqqqqqq"], "option", None, "affrun exec"),
        # no command takes a prefix of an option for the option (exec's argparse did; click does not)
        (["exec", "--comm", "1", "--", "true"], "option", "--comm-cores", "affrun exec"),
        (["run", "--mem-pol", "none", "--dry-run", "--", "true"], "option", "--mem-policy", "affrun run"),
    ],
)
def test_unknown_words_get_one_line_and_the_nearest_spelling(args: list[str], kind: str, guess: str | None,
                                                             where: str) -> None:
    match = FORM.match(one_line(*args))
    assert match, args
    word = next(a for a in args if a.startswith("-")) if kind == "option" else args[0]
    assert (match[1], match[2], match[3], match[4]) == (kind, word, guess, where)


def test_the_form_is_torchruns_own() -> None:
    """``affrun torchrun --bogus`` (torchrun's parser) and ``affrun plan --bogus`` (click) say it the same way."""
    require_torch()
    torchrun = FORM.match(one_line("torchrun", "--gpuss", "train.py"))
    click = FORM.match(one_line("plan", "--gpuss"))
    assert torchrun and click
    assert torchrun.groups()[:3] == click.groups()[:3] == ("option", "--gpuss", "--gpus")


@pytest.mark.parametrize("args", [["plan", "--mode", "bogus"], ["doctor", "--pid"], ["topology", "extra"],
                                  ["exec", "--mode", "bogus", "--", "true"], ["run", "--top", "x", "--", "true"]])
def test_other_usage_errors_are_one_line_too(args: list[str]) -> None:
    line = one_line(*args)
    assert line.startswith("affrun: error: ") and line.endswith(f"(affrun {args[0]} --help gives the full usage)")


def test_a_bad_value_is_one_wording_in_every_command() -> None:
    """torchrun's argparse words a bad value ``argument --spill: invalid choice: ...``: so does every click command."""
    lines = {name: one_line(*args) for name, args in {
        "plan": ["plan", "--spill", "everywhere"], "exec": ["exec", "--spill", "everywhere", "--", "true"],
        "run": ["run", "--spill", "everywhere", "--", "true"], "show": ["show", "--spill", "everywhere"]}.items()}
    for name, line in lines.items():
        assert line == ("affrun: error: argument --spill: invalid choice: 'everywhere' (choose from 'loader', "
                        f"'compute', 'none') (affrun {name} --help gives the full usage)"), line
    require_torch()
    torchrun = one_line("torchrun", "--spill", "everywhere", "train.py")
    assert torchrun == lines["plan"].replace("affrun plan", "affrun torchrun"), torchrun


@pytest.mark.parametrize("command", ["exec", "run"])
def test_a_command_before_the_separator_is_one_line(command: str) -> None:
    line = one_line(command, "python", "train.py")
    assert line == (f"affrun: error: unexpected argument 'python': put the command after -- (affrun {command} "
                    "--help gives the full usage)"), line


def test_tunes_own_options_say_it_in_the_same_words() -> None:
    require_torch()
    line = one_line("tune", "--repeats", "0", "train.py")
    assert line == ("affrun: error: argument --repeats: '0' is not a whole number from 1 to 65536 (affrun tune "
                    "--help gives the full usage)"), line
