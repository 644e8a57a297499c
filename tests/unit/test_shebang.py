"""How ``affrun run`` reads ``env -S`` strings and ``#!`` lines (launcher/launch/shebang.py), in process.

Each expected split was checked against GNU coreutils 9.1's ``/usr/bin/env -S`` (the system tier compares the
two on generated strings: tests/system/test_run_shebang.py).
"""

from __future__ import annotations

import pytest

from launcher.launch.shebang import Unreadable, kernel_line, split_string

ENV = {"FLAGS": "-S", "EMPTY": "", "SPACED": "a b"}


@pytest.mark.parametrize(("text", "words"), [
    ("python3 -u", ["python3", "-u"]),
    ("python3\\_-S", ["python3", "-S"]),  # \_ separates words outside double quotes
    ('"python3\\_-S"', ["python3 -S"]),  # and is a space within them
    ("python3 ${FLAGS}", ["python3", "-S"]),
    ('python3 "${FLAGS}"', ["python3", "-S"]),
    ("python3 '${FLAGS}'", ["python3", "${FLAGS}"]),  # not within single quotes
    ("python3 ${UNSET_NAME} -u", ["python3", "-u"]),
    ("python3 ${EMPTY} -u", ["python3", "", "-u"]),  # set but empty: an empty word, as env gives
    ("python3 ${SPACED}", ["python3", "a b"]),  # one word: no splitting of the value
    ("python3 -u #-S", ["python3", "-u"]),  # a word that starts with # ends the string
    ("python3 -u#-S", ["python3", "-u#-S"]),
    ("python3 -u\\c -S", ["python3", "-u"]),  # \c ends the string
    ("python3 \\#-S", ["python3", "#-S"]),
    ("'python3' \"-S\"", ["python3", "-S"]),
    ("py''thon3 ''", ["python3", ""]),
    ("python3 'a\\'b' 'c\\d'", ["python3", "a'b", "c\\d"]),
    ("python3 a\\tb \\$x", ["python3", "a\tb", "$x"]),
    ("  python3\t\t-S  ", ["python3", "-S"]),
])
def test_split_string_as_gnu_env(text: str, words: list[str]) -> None:
    assert split_string(text, ENV) == words


@pytest.mark.parametrize("text", ["python3 $FLAGS", "python3 \\q", "python3 'open", 'python3 "\\c"', "python3 \\",
                                  "python3 ${1}"])
def test_what_env_refuses_is_unreadable(text: str) -> None:
    with pytest.raises(Unreadable, match="env -S"):
        split_string(text, ENV)


@pytest.mark.parametrize(("head", "line"), [
    (b"#!/usr/bin/python3\r\nprint(1)\r\n", ("/usr/bin/python3\r", "")),  # the kernel keeps the carriage return
    (b"#!  /venv/bin/python3 -u -S \nx", ("/venv/bin/python3", "-u -S")),  # one argument
    (b"#!/usr/bin/env -S python3\\_-S\n", ("/usr/bin/env", "-S python3\\_-S")),
    (b"print(1)\n", None),
])
def test_the_kernel_reads_one_interpreter_and_one_argument(head: bytes, line: tuple[str, str] | None) -> None:
    assert kernel_line(head) == line
