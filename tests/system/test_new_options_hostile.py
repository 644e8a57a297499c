"""The session's new options given bad paths, through the real ``affrun`` command: one ``affrun: error:`` line
naming the option, exit status 2, no traceback, and (for ``affrun tune``) before any trial has run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launch import affrun

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


@pytest.mark.torch
@pytest.mark.parametrize("option", ["--save", "--svg"])
@pytest.mark.parametrize("where", ["empty", "directory", "missing directory"])
def test_tune_refuses_an_output_it_cannot_write_before_any_trial(tmp_path: Path, option: str, where: str) -> None:
    path = {"empty": "", "directory": str(tmp_path), "missing directory": str(tmp_path / "no" / "f")}[where]
    proc = affrun("tune", "--nproc-per-node", "1", option, path, _script(tmp_path))
    _one_error(proc, option)
    assert "trial 1" not in proc.stderr


@pytest.mark.torch
@pytest.mark.parametrize("option", ["--feed-json", "--tuned"])
def test_an_empty_path_is_an_error_not_ignored(tmp_path: Path, option: str) -> None:
    proc = affrun("torchrun", "--nproc-per-node", "1", option, "", _script(tmp_path))
    _one_error(proc, option)


@pytest.mark.parametrize("command", ["exec", "run"])
@pytest.mark.parametrize("option", ["--loader-workers", "--loader-cores", "--comm-cores", "--nproc-per-node"])
@pytest.mark.parametrize("value", ["99999999999999999999", "65537", "-1", "nan", "1_0"])
def test_a_count_no_machine_could_hold_is_refused(tmp_path: Path, command: str, option: str, value: str) -> None:
    """A count above one per CPU id affrun accepts (65536) fits no machine: refused where it is given, not taken
    to a rank (a script that asks for its workers would try to start that many)."""
    proc = affrun(command, "--dry-run", option, value, "--", "python3", _script(tmp_path))
    _one_error(proc, option)
