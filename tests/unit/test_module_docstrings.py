"""Every module docstring in launcher/ and build_backend/ says what the module does in at most 15 lines; the
reasoning lives in docs/ (design.md, how-it-decides.md, launchers.md...)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 15


def docstring_lines(source: str) -> int:
    """Lines of the module docstring's literal as written (quotes included); 0 without one."""
    tree = ast.parse(source)
    if ast.get_docstring(tree, clean=False) is None:
        return 0
    node = tree.body[0]
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def modules() -> list[Path]:
    found = [*sorted((ROOT / "launcher").rglob("*.py")), *sorted((ROOT / "build_backend").rglob("*.py"))]
    # build_backend/affrun is the command: a Python script without the suffix.
    found += [p for p in sorted((ROOT / "build_backend").iterdir()) if p.is_file() and p.suffix == ""
              and p.read_text(errors="replace").startswith("#!python")]
    return found


def test_the_count_is_of_the_literal() -> None:
    assert docstring_lines('"""One line."""\nx = 1\n') == 1
    assert docstring_lines('"""Two\nlines.\n"""\n') == 3
    assert docstring_lines("# no docstring\nx = 1\n") == 0
    long = '"""' + "\n".join(f"line {i}" for i in range(MAX_LINES)) + '\n"""\n'
    assert docstring_lines(long) == MAX_LINES + 1


def test_the_modules_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in modules()}
    assert {"launcher/plan/planner.py", "launcher/startup.py", "build_backend/affrun_build.py",
            "build_backend/affrun"} <= names


def test_no_module_docstring_is_longer_than_15_lines() -> None:
    long = {p.relative_to(ROOT).as_posix(): n for p in modules() if (n := docstring_lines(p.read_text())) > MAX_LINES}
    assert not long, f"module docstrings over {MAX_LINES} lines (move the reasoning to docs/): {long}"
