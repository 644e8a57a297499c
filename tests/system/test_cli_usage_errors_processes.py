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
