"""A tuned file's own text (launcher/options/tuned.py): what ``--save`` writes cannot be steered by the script's
words, and what the foreign-machine warning echoes of a file is bounded."""

from __future__ import annotations

from launcher.options.tuned import machine_differences, parse_tuned, render_tuned


def test_a_newline_in_the_about_line_adds_no_key() -> None:
    """``affrun tune --save t.yaml train.py $'\\noptions: {mode: numa}'``: the script's words go into the comment
    line escaped, and the file reads back with the options tune chose."""
    about = "the fastest options for train.py \nnoptions: {mode: numa}\r\u2028x"
    text = render_tuned({"loader_cores": 1}, {"cores": 4}, "2026-12-02", about)
    assert text.splitlines()[0].startswith("# the fastest options") and text.count("\n# Apply") == 1
    tuned = parse_tuned(text, "t.yaml")
    assert tuned.values == {"loader_cores": 1} and tuned.machine == {"cores": 4}


def test_the_differences_echo_a_bounded_text() -> None:
    there = {"cpu-model": "x" * 10_000, "gpus": ["nvidia"] * 5000, "cores": 64}
    here = {"cpu-model": "Fake", "gpus": [], "cores": 4}
    lines = machine_differences(there, here)
    assert len(lines) == 3 and all(len(line) < 200 for line in lines), lines


def test_bytes_read_as_text() -> None:
    tuned = parse_tuned(b"affrun-tuned: 1\noptions:\n  loader-workers: '3'\n  smt: true\n", "t.yaml")
    assert tuned.values == {"loader_workers": 3, "smt": True} and tuned.argv() == ["--loader-workers", "3", "--smt"]
