"""``shown`` and ``shell_join`` (launcher/base/untrusted.py), the escapers every text report uses, over any text:
what they write is printable, ``shown`` never changes printable text, and ``shell_join`` quotes printable words
as :func:`shlex.join` does (bash reading back the others is tests/system/test_untrusted_text.py)."""

from __future__ import annotations

import shlex

from hypothesis import given
from hypothesis import strategies as st

from launcher.base.untrusted import shell_join, shown

TEXT = st.text(st.characters(), max_size=40)


@given(TEXT)
def test_shown_is_printable_and_idempotent(text: str) -> None:
    once = shown(text)
    assert once.isprintable()
    assert shown(once) == once
    assert shown(text) == text or not text.isprintable()


@given(st.lists(TEXT, max_size=5))
def test_shell_join_is_printable_and_shlex_for_printable_words(words: list[str]) -> None:
    line = shell_join(words)
    assert line.isprintable()
    if all(w.isprintable() for w in words):
        assert line == shlex.join(words)


def test_the_escapes_of_repr() -> None:
    assert shown("a\nb\r\x1b[31m\u200b\u202e\x85\udcff\\n") == "a\\nb\\r\\x1b[31m\\u200b\\u202e\\x85\\udcff\\n"
    assert shell_join(["a\nb", "it's", "\udcff"]) == "$'a\\nb' 'it'\"'\"'s' $'\\xff'"
