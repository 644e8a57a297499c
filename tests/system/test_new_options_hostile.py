"""The session's new options given bad paths, through the real ``affrun`` command: one ``affrun: error:`` line
naming the option, exit status 2, no traceback, and (for ``affrun tune``) before any trial has run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launch import affrun, require_torch

SCRIPT = "print('ran')\n"


def _script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return str(path)


def _one_error(proc: object, option: str) -> None:
    stderr = proc.stderr  # type: ignore[attr-defined]
    assert proc.returncode == 2, stderr  # type: ignore[attr-defined]
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and option in errors[0], stderr
    assert "ran" not in proc.stdout  # type: ignore[attr-defined]


@pytest.mark.parametrize("option", ["--save", "--svg"])
@pytest.mark.parametrize("where", ["empty", "directory", "missing directory"])
def test_tune_refuses_an_output_it_cannot_write_before_any_trial(tmp_path: Path, option: str, where: str) -> None:
    require_torch()
    path = {"empty": "", "directory": str(tmp_path), "missing directory": str(tmp_path / "no" / "f")}[where]
    proc = affrun("tune", "--nproc-per-node", "1", option, path, _script(tmp_path))
    _one_error(proc, option)
    assert "trial 1" not in proc.stderr


@pytest.mark.parametrize("option", ["--feed-json", "--tuned"])
def test_an_empty_path_is_an_error_not_ignored(tmp_path: Path, option: str) -> None:
    require_torch()
    proc = affrun("torchrun", "--nproc-per-node", "1", option, "", _script(tmp_path))
    _one_error(proc, option)
