"""README's examples run as written: every fenced ``sh`` block after a ``<!-- runnable -->`` line is run with bash
from the repository root, with this environment's ``affrun`` first on PATH, and must exit 0 (issue 21)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch import clean_env

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARKER = "<!-- runnable -->"
BLOCK = re.compile(r"^" + re.escape(MARKER) + r"\n```sh\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def runnable_blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def test_every_marker_is_followed_by_a_sh_block() -> None:
    text = README.read_text()
    assert text.count(MARKER) == len(runnable_blocks(text)) >= 3


@pytest.mark.torch
@pytest.mark.parametrize("index", range(len(runnable_blocks(README.read_text()))))
def test_readme_block_runs(index: int, tmp_path: Path) -> None:
    block = runnable_blocks(README.read_text())[index]
    env = clean_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env["HOME"] = str(tmp_path)
    proc = subprocess.run(["bash", "-e", "-c", block], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{block}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_readme_is_a_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, len(lines)
