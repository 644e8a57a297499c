"""Every warning, note and dry-run line the launch front ends (``affrun exec``, ``run``, ``torchrun``) and the
topology commands print goes through one formatter (launcher/base/untrusted.py: ``shown``, ``warning_line``,
``note_line``): a user's value with an escape sequence or a newline (an ``OMP_PLACES`` kept by ``--env-policy
keep``, a ``--feed-json`` or ``--tuned`` path, an ``--fsroot`` path, the path of COMMAND's interpreter) reaches the
terminal escaped as ``repr`` writes it, on its own line, through the real command."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.fakesys import uniform, write_tree
from tests.launch import affrun_argv, clean_env, run
from tests.run_dry import dry_run

HOSTILE = "x\x1b[31m\nforged: line\x85"  # an escape sequence, a forged line, a C1 control
ESCAPED = "x\\x1b[31m\\nforged: line\\x85"


def clean(text: str) -> None:
    """Only printable characters and line breaks, and no forged line."""
    raw = sorted({c for c in text if not c.isprintable() and c != "\n"})
    assert not raw and not any(line.startswith("forged") for line in text.splitlines()), text[-3000:]


COMMANDS = ["run", pytest.param("torchrun", marks=pytest.mark.torch), "exec"]


def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('the script ran')\n")
    return str(path)


def one_rank(command: str, tmp_path: Path, *flags: str) -> tuple[str, str]:
    """``affrun COMMAND --dry-run`` of one rank with ``flags``: (stdout, stderr), after exit 0."""
    rank = ("--local-rank", "0") if command == "exec" else ()
    proc = dry_run(command, *rank, "--nproc-per-node", "1", *flags,
                   program=(script(tmp_path),) if command == "torchrun" else ("--", "true"))
    clean(proc.stdout)
    clean(proc.stderr)
    return proc.stdout, proc.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_a_feed_json_path_is_shown_escaped(tmp_path: Path, command: str) -> None:
    path = tmp_path / f"feed{HOSTILE}.json"
    out, _ = one_rank(command, tmp_path, "--feed-json", str(path))
    assert f"AFFRUN_FEED_JSON={tmp_path}/feed{ESCAPED}.json\n" in out, out


@pytest.mark.parametrize("command", COMMANDS)
def test_a_tuned_path_of_another_machine_is_warned_about_escaped(tmp_path: Path, command: str) -> None:
    path = tmp_path / f"t{HOSTILE}.yaml"
    path.write_text("affrun-tuned: 1\noptions: {}\nmachine: {cores: 640}\n")
    _, err = one_rank(command, tmp_path, "--tuned", str(path))
    (warning,) = [line for line in err.splitlines() if "tuned on another machine" in line]
    assert warning.startswith(f"affrun: warning: --tuned {tmp_path}/t{ESCAPED}.yaml was tuned"), warning


@pytest.mark.parametrize("command", COMMANDS)
def test_a_plan_warning_that_names_an_fsroot_path_is_escaped(tmp_path: Path, command: str) -> None:
    root = write_tree(tmp_path / "base", uniform(1, 2))
    (root / "sys/devices/system/node/node0/meminfo").write_text(f"Node 0 MemTotal: {HOSTILE} kB\n")
    hostile = tmp_path / HOSTILE
    shutil.move(str(root), str(hostile))
    _, err = one_rank(command, tmp_path, "--fsroot", str(hostile), "--verbose")
    warnings = [line for line in err.splitlines() if "MemTotal is not a number" in line]
    assert warnings and all(line.startswith("affrun: warning: ") for line in warnings), err
    assert "/x\\x1b[31m\\nforged: line\\x85/sys/devices" in warnings[0], warnings[0]


def test_a_note_on_a_kept_value_is_escaped_under_run(tmp_path: Path) -> None:
    """``affrun run -v`` with a Python that loads the hook: the rank's note on the kept OMP_PLACES, escaped."""
    proc = run(affrun_argv("run", "-v", "--env-policy", "keep", "--nproc-per-node", "1", "--", sys.executable,
                           "-c", "print('ran')"), env=clean_env(OMP_PLACES="\x1b[31m{0}"), timeout=120)
    assert proc.returncode == 0 and proc.stdout == "ran\n", proc.stderr[-3000:]
    clean(proc.stderr)
    assert "affrun: note: rank 0: keeping OMP_PLACES=\\x1b[31m{0} set by the user" in proc.stderr, proc.stderr


@pytest.mark.torch
def test_a_note_on_a_kept_value_is_escaped_under_torchrun(tmp_path: Path) -> None:
    proc = run(affrun_argv("torchrun", "--verbose", "--env-policy", "keep", "--nproc-per-node", "1",
                           script(tmp_path)), env=clean_env(OMP_PLACES="\x1b[31m{0}\nforged: line"), timeout=240)
    assert proc.returncode == 0 and "the script ran" in proc.stdout, proc.stderr[-3000:]
    clean(proc.stderr)
    assert "keeping OMP_PLACES=\\x1b[31m{0}\\nforged: line set by the user" in proc.stderr, proc.stderr


def test_the_interpreter_s_path_in_run_s_warning_is_escaped(tmp_path: Path) -> None:
    """COMMAND's Python is named in the warning on the startup hook: escaped, not turned into '?'."""
    where = tmp_path / HOSTILE
    where.mkdir()
    python = where / "python3"
    python.symlink_to(sys.executable)
    proc = run(affrun_argv("run", "--dry-run", "--nproc-per-node", "1", "--", str(python), "-I", "-c", "pass"),
               env=clean_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    clean(proc.stderr)
    (warning,) = [line for line in proc.stderr.splitlines() if line.startswith("affrun: warning:")]
    assert f"{tmp_path}/{ESCAPED}/python3" in warning, warning


@pytest.mark.parametrize("command", [["topology", "--save"], ["show", "--no-color", "--svg"]])
def test_a_written_file_s_path_is_shown_escaped(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / f"out{HOSTILE}.svg"
    proc = run(affrun_argv(*command, str(path)), env=clean_env(), timeout=120)
    assert proc.returncode == 0 and os.path.exists(path), proc.stderr[-3000:]
    clean(proc.stdout)
    assert f"{tmp_path}/out{ESCAPED}.svg" in proc.stdout, proc.stdout


def test_exec_planning_here_prints_the_plan_s_warnings_from_rank_0_only() -> None:
    """Under srun or mpirun each rank plans for itself: the plan's warnings (here two ranks on one CPU) are
    printed once per node, by local rank 0, instead of by no rank."""
    lines = {}
    for rank in ("0", "1"):
        proc = run(affrun_argv("exec", "--map", "0;0", "--local-rank", rank, "--nproc-per-node", "2", "--", "true"),
                   env=clean_env(), timeout=120)
        assert proc.returncode == 0, proc.stderr
        lines[rank] = proc.stderr.splitlines()
    assert lines == {"0": ["affrun: warning: --map: CPU 0 is given to ranks 0 and 1"], "1": []}, lines
