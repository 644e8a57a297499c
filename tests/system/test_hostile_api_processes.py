"""test_hostile_api: the tests that start processes or load real runtimes (tests/system). The in-process ones are tests/unit/test_hostile_api.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.errors import refused
from tests.sbatch_script import CONTROL_CASES
from tests.system.test_hostile_input import affrun


def sbatch(tmp_path: Path, *args: str, config: str = "") -> tuple[Any, Path]:
    """``affrun sbatch ARGS -o FILE`` through the real CLI (a site profile when ``config`` is given)."""
    script = tmp_path / "job.sbatch"
    env = {"AFFRUN_CONFIG": ""}
    if config:
        (tmp_path / "site.yaml").write_text(config, encoding="utf-8")
        env["AFFRUN_CONFIG"] = str(tmp_path / "site.yaml")
    split = args.index("--")
    return affrun("sbatch", *args[:split], "-o", str(script), *args[split:], env=env), script


@pytest.mark.parametrize("command", [["-m"], ["--no-python"], ["-c", "x"], [""], ["-m", ""], ["-h"],
                                     ["--no-python", "-m", "x"]],
                         ids=["-m", "--no-python", "-c x", "empty", "-m empty", "-h", "--no-python -m"])
@pytest.mark.torch
def test_sbatch_refuses_a_command_affrun_torchrun_refuses_in_the_job(tmp_path: Path, command: list[str]) -> None:
    """The job's own parse (affrun torchrun's) runs before the script is written: nothing is queued to fail."""
    proc, script = sbatch(tmp_path, "--", *command)
    refused(proc)
    assert not script.exists()


def test_sbatch_srun_style_refuses_an_empty_program(tmp_path: Path) -> None:
    proc, script = sbatch(tmp_path, "--style", "srun", "--", "", "x")
    refused(proc, "empty")
    assert not script.exists()


@pytest.mark.parametrize("key,text", CONTROL_CASES, ids=[f"{k}-{t!a}" for k, t in CONTROL_CASES])
def test_one_control_character_rule_for_the_command_line_and_the_profile(tmp_path: Path, key: str,
                                                                        text: str) -> None:
    """Unicode Cc, Zl and Zp (C1 controls and U+2028 too) are refused in every value written into the script,
    whether it came from a flag or from a YAML site profile; a tab is fine."""
    value = "--mail-type=END" + text if key == "sbatch-line" else text
    proc, script = sbatch(tmp_path, "--style", "srun", f"--{key}", value, "--", "prog")
    refused(proc, f"--{key}")
    assert not script.exists()
    escaped = value.encode("unicode_escape").decode().replace('"', '\\"')
    proc, script = sbatch(tmp_path, "--style", "srun", "--", "prog", config=f'defaults:\n  {key}: "{escaped}"\n')
    refused(proc, key)
    assert not script.exists()


@pytest.mark.parametrize("flag,value", [("--nodes", "1" * 26), ("--nodes", "\u0661"), ("--rdzv-port", "1_0"),
                                        ("--ntasks-per-node", " 2")])
def test_the_command_line_refuses_counts_the_profile_refuses(tmp_path: Path, flag: str, value: str) -> None:
    proc, script = sbatch(tmp_path, "--style", "srun", flag, value, "--", "prog")
    refused(proc, flag)
    assert not script.exists()
    proc, script = sbatch(tmp_path, "--style", "srun", "--", "prog",
                          config=f'defaults:\n  {flag[2:]}: {value if value.isascii() and value.isdigit() else repr(value)}\n')
    refused(proc, flag[2:])


@pytest.mark.parametrize("where", ["flag", "profile"])
def test_the_value_written_is_the_value_checked(tmp_path: Path, where: str) -> None:
    """gpus-per-node "4\\t" was checked as 4 and written with its tab; now it is 4, checked and written."""
    if where == "flag":
        proc, script = sbatch(tmp_path, "--style", "srun", "--gpus-per-node", "4\t", "--mem", " 4000 ", "--", "p")
    else:
        proc, script = sbatch(tmp_path, "--style", "srun", "--", "p",
                              config='defaults:\n  gpus-per-node: "4\\t"\n  mem: " 4000 "\n')
    assert proc.returncode == 0, proc.stderr
    lines = script.read_text().splitlines()
    assert "#SBATCH --gpus-per-node=4" in lines and "#SBATCH --mem=4000" in lines, lines[:12]
    assert "#SBATCH --ntasks-per-node=4" in lines


@pytest.mark.torch
def test_affrun_torchrun_refuses_an_empty_script_name() -> None:
    """The check sbatch borrows is affrun torchrun's own: '' is refused in one line, no worker started."""
    refused(affrun("torchrun", "--nproc-per-node", "1", ""), "empty")
