"""A plan error that an option of ``--tuned FILE`` caused names the file and the machine it was tuned on, and a file
from another machine is warned about before planning (so also when planning then fails), through each launch front
end (``affrun exec``, ``run``, ``torchrun``). An error the command line's own flags cause names no file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launch import affrun_argv, clean_env, run
from tests.machines import fake_cpu_4000_tree

FOREIGN = ("affrun-tuned: 1\noptions:\n{options}machine:\n  cpu-model: Other CPU\n  packages: 2\n  cores: 64\n"
           "  cpus: 128\n  gpus: [nvidia, nvidia]\ndate: '2026-01-01'\n")
MACHINE = "tuned on 'Other CPU', 2 packages, 64 cores, 128 CPUs, 2 GPUs"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return fake_cpu_4000_tree(tmp_path)


def launch(command: str, tree: Path, tmp_path: Path, *flags: str) -> tuple[int, list[str]]:
    """``affrun COMMAND --dry-run`` of two ranks on ``tree`` with ``flags``: (exit status, stderr's lines)."""
    script = tmp_path / "train.py"
    script.write_text("print('the script ran')\n")
    head = {"exec": ["exec", "--local-rank", "0", "--nproc-per-node", "2"], "run": ["run", "--nproc-per-node", "2"],
            "torchrun": ["torchrun", "--nproc-per-node", "2"]}[command]
    tail = [str(script)] if command == "torchrun" else ["--", "true"]
    proc = run(affrun_argv(*head, "--dry-run", "--fsroot", str(tree), *flags, *tail), env=clean_env(), timeout=120)
    assert "Traceback" not in proc.stderr and "the script ran" not in proc.stdout, proc.stderr[-3000:]
    return proc.returncode, proc.stderr.splitlines()


def tuned(tmp_path: Path, options: str) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(FOREIGN.format(options=options))
    return path


COMMANDS = ["exec", "run", pytest.param("torchrun", marks=pytest.mark.torch)]
# option of the file -> what the error says without the file's name (the flag's own error)
FROM_FILE = {
    "map": ("  map: '0-31;32-63'\n", "--map rank 0: CPUs 4-31 are not usable here (allowed: 0-3)"),
    "gpus": ("  gpus: '0,1'\n", "GPU 0 does not exist: 0 GPU(s) are visible"),
    "reserve": ("  reserve: '0-3'\n", "no usable CPU after reserving 4 core(s)"),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", list(FROM_FILE))
def test_an_error_the_file_caused_names_it_after_the_warning(tree: Path, tmp_path: Path, command: str,
                                                              case: str) -> None:
    options, needle = FROM_FILE[case]
    path = tuned(tmp_path, options)
    status, lines = launch(command, tree, tmp_path, "--tuned", str(path))
    assert status == 2, lines
    errors = [i for i, line in enumerate(lines) if line.startswith("affrun: error:")]
    warnings = [i for i, line in enumerate(lines) if "was tuned on another machine" in line]
    assert len(errors) == 1 and len(warnings) == 1 and warnings[0] < errors[0], lines
    error = lines[errors[0]]
    assert needle in error and error.endswith(f" (from --tuned {path}, {MACHINE})"), error


@pytest.mark.parametrize("command", COMMANDS)
def test_an_error_of_the_command_line_s_own_flag_names_no_file(tree: Path, tmp_path: Path, command: str) -> None:
    """The file's loader cores are fine here; --map given on the command line is not."""
    path = tuned(tmp_path, "  loader-cores: 1\n")
    status, lines = launch(command, tree, tmp_path, "--tuned", str(path), "--map", "0-31;32-63")
    (error,) = [line for line in lines if line.startswith("affrun: error:")]
    assert status == 2 and error == "affrun: error: --map rank 0: CPUs 4-31 are not usable here (allowed: 0-3)", lines


@pytest.mark.parametrize("command", COMMANDS)
def test_a_flag_given_wins_over_the_file_s_and_nothing_is_blamed(tree: Path, tmp_path: Path, command: str) -> None:
    path = tuned(tmp_path, "  map: '0-31;32-63'\n")
    status, lines = launch(command, tree, tmp_path, "--tuned", str(path), "--map", "0-1;2-3")
    assert status == 0 and not any(line.startswith("affrun: error:") for line in lines), lines
    assert [line for line in lines if "was tuned on another machine" in line], lines


def test_the_file_s_option_and_a_flag_that_fail_together_name_the_file(tree: Path, tmp_path: Path) -> None:
    """--loader-cores 1 given is fine with the default plan; with the file's map of one CPU per rank it is not:
    the file's option is why, so the file is named."""
    path = tuned(tmp_path, "  map: '0;1'\n")
    status, lines = launch("exec", tree, tmp_path, "--tuned", str(path), "--loader-cores", "1")
    (error,) = [line for line in lines if line.startswith("affrun: error:")]
    assert status == 2 and error.endswith(f" (from --tuned {path}, {MACHINE})"), lines
