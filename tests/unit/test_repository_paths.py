"""Every path of this repository that the code, the docs or ``pyproject.toml`` names exists.

A file that moved leaves its old name behind in comments, docstrings and pages; a newcomer who follows one finds
nothing. Paths are recognised by their top folder (``launcher/``, ``tests/``, ``docs/`` ...) or, for the package's
own modules, by their layer (``plan/homes.py``). ``CHANGELOG.md`` is history and may name what is gone.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
THIS = "tests/unit/test_repository_paths.py"  # its own examples name paths that do not exist
TOP = r"(?:launcher|tests|docs|benchmarks|examples|templates|build_backend|\.ci)"
LAYER = r"(?:base|topology|plan|env|context|options|bind|launch|slurm|cli|doctor|show|feed|tune)"
# Not preceded by a path character, so that ``../shared/...`` and URLs do not count.
FULL = re.compile(rf"(?<![\w./-])({TOP}/[\w./-]*\w)")
IN_PACKAGE = re.compile(rf"(?<![\w./-])({LAYER}/[\w/]*\w\.py)\b")
SUFFIXES = (".py", ".md", ".toml", ".sh", ".yml", ".yaml", ".sbatch", ".in", ".cfg")


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        names = out.split()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked sdist): walk the tree
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]
    keep = [n for n in names if (n.endswith(SUFFIXES) or n in ("build_backend/affrun", ".ci/run"))
            and n not in ("CHANGELOG.md", THIS) and not n.startswith(".venv")]
    return [ROOT / n for n in keep if (ROOT / n).is_file()]


def named_paths(text: str) -> list[tuple[int, str]]:
    """(line, path) for each repository path ``text`` names; globs and templated names are not paths."""
    found = []
    for pattern in (FULL, IN_PACKAGE):
        for m in pattern.finditer(text):
            path = m.group(1).split("::")[0]
            if not any(c in path for c in "*{}<>$"):
                found.append((text.count("\n", 0, m.start()) + 1, path))
    return found


def test_the_pattern_finds_paths_and_only_paths() -> None:
    text = "see launcher/records.py and plan/homes.py, tests/x.py::test_y, ../shared/fixtures/a, launcher/*.py"
    assert [p for _, p in named_paths(text)] == ["launcher/records.py", "tests/x.py", "plan/homes.py"]


def test_every_named_path_exists() -> None:
    missing = []
    for path in _tracked():
        text = path.read_text(encoding="utf-8", errors="replace")
        missing += [f"{path.relative_to(ROOT)}:{line}: {name}" for line, name in named_paths(text)
                    if not (ROOT / name).exists() and not (ROOT / "launcher" / name).exists()]
    assert not missing, "\n".join(missing)


def test_test_modules_have_unique_names() -> None:
    """pytest imports test files by their base name (the tiers are not packages): two files of one name in
    tests/unit and tests/system stop the whole run at collection."""
    names: dict[str, str] = {}
    clashes = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        where = str(path.relative_to(ROOT))
        if path.name in names:
            clashes.append(f"{names[path.name]} and {where}")
        names.setdefault(path.name, where)
    assert not clashes, clashes


def test_every_test_tests_tiers_py_names_exists() -> None:
    """An entry of tests/tiers.py that names no test would leave that test in a tier quietly."""
    from tests.tiers import SLOW, UNIT_IN_SYSTEM

    missing = []
    for folder, entries in (("system", SLOW), ("unit", UNIT_IN_SYSTEM)):
        for entry in sorted(entries):
            module, _, test = entry.partition("::")
            path = ROOT / "tests" / folder / module
            if not path.is_file() or (test and f"\ndef {test}(" not in path.read_text()):
                missing.append(f"tests/{folder}/{entry}")
    assert not missing, missing
