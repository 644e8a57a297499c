"""The one YAML reader of ``--tuned`` files and site profiles (launcher/base/safe_yaml.py), with libyaml's parser
and with PyYAML's pure-Python one: plain data comes back as PyYAML's safe loader builds it (timestamps left as
strings); alias bombs, self-referring aliases, tags of anything but plain data, deep nesting and keys given twice
are one BadYAML line each, decided on the composed nodes before any value is built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.base.safe_yaml import MAX_DEPTH, MAX_VALUES, BadYAML, load_yaml

PARSERS = [pytest.param(None, id="libyaml" if yaml.__with_libyaml__ else "pure"), pytest.param(False, id="pure")]


def bomb(levels: int = 9, width: int = 9) -> str:
    """The billion-laughs document: ``width ** levels`` strings once its aliases are expanded, a few hundred
    bytes as text."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("c_parser", PARSERS)
@pytest.mark.parametrize(("text", "needle"), [
    (bomb(), "more than 100000 values once its aliases are expanded"),
    ("a: &x {b: [1, 2]}\n" + "".join(f"k{i}: {{<<: *x, c{i}: 1}}\n" for i in range(3)) + bomb(), "values once its aliases are expanded"),
    ("&a [*a]", "an alias refers to the value that holds it"),
    ("a: &a {b: {c: *a}}", "an alias refers to the value that holds it"),
    ("options: !!python/object/apply:os.system ['true']", "the tag !!python/object/apply:os.system is not plain"),
    ("x: !!python/name:os.system", "!!python/name:os.system"),
    ("x: !!binary aGVsbG8=", "!!binary"),
    ("x: !!set {a}", "!!set"),
    ("x: !!timestamp 2001-02-30", "!!timestamp"),
    ("x: !custom 1", "the tag !custom is not plain data"),
    ("[" * 5000 + "]" * 5000, "nest"),
    ("a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nest"),
    ("".join("  " * i + f"k{i}:\n" for i in range(200)), "nested deeper than"),
    ("a: 1\nb: 2\na: 3\n", "the key 'a' is given twice in one mapping"),
    ("x: !!int abc", "a value YAML cannot build"),
    ("x: !!bool abc", "a value YAML cannot build"),
    ("x: " + "9" * 5000, "a value YAML cannot build"),
    ("? [a]\n: 1\n", "unhashable"),
    ("a: 1\n---\nb: 2\n", "not valid YAML"),
    ("a: 'x\0y'", "not valid YAML"),
    ("{", "not valid YAML (line"),
])
def test_hostile_yaml_is_one_line(c_parser: bool | None, text: str, needle: str) -> None:
    with pytest.raises(BadYAML) as info:
        load_yaml(text, c_parser=c_parser)
    message = str(info.value)
    assert needle in message and "\n" not in message and len(message) < 300, message


@pytest.mark.parametrize("c_parser", PARSERS)
def test_bytes_that_are_not_utf8(c_parser: bool | None) -> None:
    with pytest.raises(BadYAML, match="not UTF-8 text"):
        load_yaml(b"a: \xff\xfe", c_parser=c_parser)


@pytest.mark.parametrize("c_parser", PARSERS)
def test_plain_yaml_reads_as_safe_load_reads_it(c_parser: bool | None) -> None:
    text = ("base: &base {mode: numa, loader-cores: 2}\nprofiles:\n  a: {<<: *base, loader-cores: 1}\n"
            "  b: *base\nlist: [1, 2.5, true, null, '3']\nday: 2026-12-02\nbad-day: 2001-02-30\nempty:\n")
    data = load_yaml(text, c_parser=c_parser)
    assert data["profiles"] == {"a": {"mode": "numa", "loader-cores": 1}, "b": {"mode": "numa", "loader-cores": 2}}
    assert data["list"] == [1, 2.5, True, None, "3"]
    assert data["day"] == "2026-12-02" and data["bad-day"] == "2001-02-30"  # strings, never dates
    assert load_yaml("", c_parser=c_parser) is None and load_yaml("# nothing\n", c_parser=c_parser) is None


@pytest.mark.parametrize("c_parser", PARSERS)
def test_the_bounds_leave_room(c_parser: bool | None) -> None:
    """Just under each bound is read: aliases that expand to fewer than MAX_VALUES values, MAX_DEPTH levels."""
    assert len(load_yaml(bomb(levels=5, width=9), c_parser=c_parser)["l4"]) == 9  # 9 ** 5 = 59,049 strings
    deep = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    assert load_yaml(deep, c_parser=c_parser) is not None
    assert MAX_VALUES > 9 ** 5


def test_nothing_is_constructed_for_a_python_tag(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for c_parser in (None, False):
        with pytest.raises(BadYAML):
            load_yaml(f"!!python/object/apply:os.system ['touch {marker}']", c_parser=c_parser)
    assert not marker.exists()


plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 63), 2 ** 63) | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30)


@settings(max_examples=150, deadline=None)
@given(plain)
def test_what_safe_dump_writes_reads_back(value: Any) -> None:
    """Any plain data PyYAML writes (as affrun tune --save does) reads back equal, by either parser."""
    text = yaml.safe_dump({"v": value})
    for c_parser in (None, False):
        assert load_yaml(text, c_parser=c_parser) == {"v": value}
