"""``affrun run``'s own behaviour: the plan it hands down, the role of the first process, what reaches COMMAND."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.run_cmd import top_role
from tests.fakesys import this_machine_with_gpus, write_tree

AFFRUN = [sys.executable, "-m", "launcher", "run"]


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AFFRUN_", "LOCAL_", "OMP_", "KMP_"))}
    return {**base, **extra}


def dry_run(*options: str) -> dict[str, str]:
    out = subprocess.run([*AFFRUN, *options, "--dry-run", "--", "x"], capture_output=True, text=True, timeout=60,
                         check=True, env=env()).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if line.startswith("AFFRUN_"))


def test_one_rank_per_visible_gpu(tmp_path: Path) -> None:
    root = write_tree(tmp_path, this_machine_with_gpus(2))
    plan = json.loads(dry_run("--fsroot", str(root))["AFFRUN_PLAN"])["plan"]
    assert [r["gpu"] for r in plan["ranks"]] == [0, 1]


@pytest.mark.parametrize(
    ("command", "role"),
    [
        (["accelerate", "launch", "train.py"], "launcher"),
        (["/venv/bin/torchrun", "--nproc-per-node", "2", "t.py"], "launcher"),
        (["deepspeed", "--num_gpus", "2", "t.py"], "launcher"),
        (["env", "A=1", "mpirun", "-n", "2", "python", "t.py"], "launcher"),
        (["python", "-m", "torch.distributed.run", "t.py"], "launcher"),
        (["python", "train.py"], "rank0"),
        (["python", "-m", "mypkg.train"], "rank0"),
    ],
)
def test_top_role(command: list[str], role: str) -> None:
    assert top_role(command) == role


def test_top_override() -> None:
    assert dry_run("--nproc-per-node", "1", "--top", "launcher")["AFFRUN_RUN"] == "launcher"


def test_arguments_pid_and_exit_status_are_the_commands() -> None:
    args = ["a b", "", "--nproc-per-node", "é", "-- x"]
    code = "import os, sys, json; print(json.dumps([os.getpid(), sys.argv[1:]])); sys.exit(7)"
    proc = subprocess.Popen([*AFFRUN, "--nproc-per-node", "1", "--", sys.executable, "-c", code, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err
    pid, argv = json.loads(out)
    assert pid == proc.pid and argv == args  # exec'd in place; every argument byte for byte


@pytest.mark.parametrize(
    ("argv", "extra", "message"),
    [
        (["--", "true"], {}, "no GPU is visible"),
        (["--nproc-per-node", "0", "--", "true"], {}, "at least 1"),
        (["--nproc-per-node", "1", "--", "true"], {"AFFRUN_RUN": "rank0"}, "already running"),
        (["--nproc-per-node", "99", "--", "true"], {}, ""),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], extra: dict[str, str], message: str) -> None:
    proc = subprocess.run([*AFFRUN, *argv], capture_output=True, text=True, timeout=60, env=env(**extra))
    assert proc.returncode == 2
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("affrun: error: ")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_warns_about_another_binder() -> None:
    proc = subprocess.run([*AFFRUN, "--nproc-per-node", "1", "--dry-run", "--", "deepspeed", "--bind_cores_to_rank",
                           "t.py", "--enable_cpu_affinity"], capture_output=True, text=True, timeout=60, env=env())
    warnings = [ln for ln in proc.stderr.splitlines() if "double-binding" in ln]
    assert proc.returncode == 0 and len(warnings) == 1 and "--bind_cores_to_rank" in warnings[0]
