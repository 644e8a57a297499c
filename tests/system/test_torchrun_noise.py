"""``affrun torchrun`` without torchrun's noise (issue 21 item 4): a script that cannot run and a mistyped option
are one ``affrun: error:`` line before any rank starts; a rank that fails still gets torchrun's own report, and
affrun's rank lines say "starting", never anything that reads as success."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.errors import refused
from tests.system.test_hostile_input import affrun

pytestmark = pytest.mark.torch


def one_line_before_any_rank(proc_stderr: str) -> None:
    """Nothing but the error line: no rank line, no torchrun report, no usage dump."""
    lines = [line for line in proc_stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc_stderr[-3000:]
    assert "rank" not in lines[0] and "ChildFailedError" not in proc_stderr and "usage:" not in proc_stderr


@pytest.mark.parametrize("how", ["missing", "missing-relative", "dangling-link", "link-loop", "directory", "fifo",
                                 "device"])
def test_a_script_that_cannot_run_is_one_line_and_no_rank_starts(tmp_path: Path, how: str) -> None:
    script = tmp_path / "train.py"
    given = str(script)
    if how == "missing-relative":
        given = "train.py"
    elif how == "dangling-link":
        script.symlink_to(tmp_path / "gone.py")
    elif how == "link-loop":
        script.symlink_to(script)
    elif how == "directory":
        script.mkdir()
    elif how == "fifo":  # python would wait on it: a hang, not an error
        os.mkfifo(script)
    elif how == "device":  # python would read it without end
        script.symlink_to("/dev/zero")
    proc = affrun("torchrun", "--nproc-per-node", "1", given, "--lr", "1", cwd=tmp_path)
    line = refused(proc, "train.py")
    assert "script" in line, line
    if how == "directory":
        assert "__main__.py" in line, line
    if how in ("fifo", "device"):
        assert line.endswith(("is a FIFO, not a file", "is a device, not a file")), line
    one_line_before_any_rank(proc.stderr)
    assert sorted(os.listdir(tmp_path)) == (["train.py"] if how != "missing" and how != "missing-relative" else [])


def test_a_directory_with_main_runs_as_python_runs_it(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text("open('ran', 'w').close()\n")
    proc = affrun("torchrun", "--nproc-per-node", "1", "app", cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "ran").exists()


@pytest.mark.parametrize("command", [["-m", "no_such_module_xyz"], ["--no-python", "no-such-program-xyz"]])
def test_modules_and_programs_are_left_to_torchrun(command: list[str]) -> None:
    # torchrun resolves these on the workers' path: affrun does not second-guess them (the dry run starts nothing)
    proc = affrun("torchrun", "--affrun-dry-run", "--nproc-per-node", "1", *command)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert command[1] in proc.stdout


@pytest.mark.parametrize(("typo", "meant"), [
    ("--nprocs-per-node", "--nproc-per-node"),
    ("--nproc-pernode", "--nproc-per-node"),
    ("--node-rank", "--node-rank"),  # a valid spelling is not a typo: checked below
    ("--max-restrats", "--max-restarts"),
    ("--rdvz-backend", "--rdzv-backend"),
    ("--affrun-dryrun", "--affrun-dry-run"),
    ("--loader-cors", "--loader-cores"),
])
def test_a_mistyped_option_is_one_line_with_the_nearest_spelling(typo: str, meant: str) -> None:
    proc = affrun("torchrun", "--affrun-dry-run", typo, "1", "train.py")
    if typo == meant:
        # torchrun's own option: accepted, and the (missing) script is what is refused
        refused(proc, "train.py")
        return
    line = refused(proc, typo, f"did you mean {meant}?", "--help")
    assert line.startswith("affrun: error:"), line
    one_line_before_any_rank(proc.stderr)


def test_an_option_with_no_close_spelling_points_to_help() -> None:
    proc = affrun("torchrun", "--zzzzqqq", "train.py")
    refused(proc, "--zzzzqqq", "--help")
    assert "did you mean" not in proc.stderr
    one_line_before_any_rank(proc.stderr)


def test_a_missing_value_is_one_line_not_the_usage() -> None:
    proc = affrun("torchrun", "--nnodes")
    refused(proc, "--nnodes", "--help")
    one_line_before_any_rank(proc.stderr)


def test_help_does_not_list_what_affrun_refuses() -> None:
    proc = affrun("torchrun", "--help")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--nproc-per-node" in proc.stdout and "--affrun-dry-run" in proc.stdout
    for refused_option in ("--numa-binding", "--numa_binding", "--run-path", "--run_path"):
        assert refused_option not in proc.stdout, refused_option
    # still refused by name, not "unrecognized"
    refused(affrun("torchrun", "--run-path", "--nproc-per-node", "1", "x.py"), "--run-path")


def test_a_failing_rank_gets_torchruns_report_and_rank_lines_say_starting(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("raise SystemExit(3)\n")
    proc = affrun("torchrun", "--nproc-per-node", "1", str(script), cwd=tmp_path, timeout=180)
    assert proc.returncode != 0
    assert f"{script} FAILED" in proc.stderr and "exitcode  : 3" in proc.stderr, proc.stderr[-3000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("affrun:")]
    assert ours and all(line.startswith("affrun: starting rank ") for line in ours), ours
