"""The manual: docs/cli.md is the option tables, generated (``python -m launcher.cli.reference``), and every
page README links to exists; ``mkdocs build --strict`` (tests/run_all.sh) checks the links inside docs/."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from launcher.cli.reference import render
from launcher.options.table import BINDING_OPTIONS
from launcher.slurm.options import SBATCH_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
CLI_PAGE = ROOT / "docs" / "cli.md"


def test_cli_page_is_the_option_table() -> None:
    assert CLI_PAGE.read_text() == render(), "docs/cli.md is stale: python -m launcher.cli.reference > docs/cli.md"


def test_every_option_of_the_tables_is_on_the_page() -> None:
    text = CLI_PAGE.read_text()
    for spec in BINDING_OPTIONS:
        assert f"| `{spec.flag}`" in text, spec.flag
    for option in SBATCH_OPTIONS:
        for flag in option.flags:
            assert f"`{flag}`" in text, flag


def test_the_check_fails_when_page_and_table_differ(tmp_path: Path) -> None:
    stale = tmp_path / "cli.md"
    stale.write_text(render().replace("`--loader-cores`", "`--loader-core`"))
    check = [sys.executable, "-m", "launcher.cli.reference", "--check"]
    assert subprocess.run([*check, str(stale)], capture_output=True, timeout=60).returncode == 1
    assert subprocess.run([*check, str(CLI_PAGE)], capture_output=True, timeout=60).returncode == 0


def test_readme_links_point_at_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)#]+)", text) if "://" not in t]
    assert targets
    for target in targets:
        assert (ROOT / target).exists(), target


def test_every_docs_page_is_in_the_site_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert f": {page.name}" in nav, page.name
