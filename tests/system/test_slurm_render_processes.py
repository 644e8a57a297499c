"""test_slurm_render: the tests that start processes or load real runtimes (tests/system). The in-process ones are tests/unit/test_slurm_render.py."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.slurm.script import SbatchSpec, render
from tests.sbatch_script import GOLDEN, after, hostile, run_affrun, run_script


@pytest.mark.parametrize("style", ["srun", "torchrun"])
def test_hostile_argv_reaches_the_command_byte_for_byte(tmp_path: Path, style: str) -> None:
    canary = tmp_path / "canary"
    words = hostile(canary)
    command = ["train.py", *words] if style == "torchrun" else ["python3", "train.py", *words]
    script = tmp_path / "job.sbatch"
    proc = run_affrun("sbatch", "--style", style, "--nodes", "2", "--gpus-per-node", "2", "-o", str(script),
                      "--", *command)
    assert proc.returncode == 0, proc.stderr
    argv = run_script(script, tmp_path)
    got = after(argv, b"train.py")
    assert got == [os.fsencode(w) for w in words]
    assert not canary.exists(), "an argument ran as shell code"
    # sbatch reads #SBATCH lines only before the first command: none may come from the arguments
    text = script.read_text()
    head = text.split("\nset -eu\n")[0]
    assert "--nodes=99" not in head


def test_non_utf8_bytes_survive(tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    raw = [b"\xff\xfe", b"caf\xe9", b"ok"]
    proc = run_affrun(b"sbatch", b"--style", b"srun", b"-o", os.fsencode(script), b"--", b"prog", *raw)
    assert proc.returncode == 0, proc.stderr
    assert after(run_script(script, tmp_path), b"prog") == raw


def test_printed_script_equals_written_script(tmp_path: Path) -> None:
    args = ["sbatch", "--style", "srun", "--gpus-per-node", "2", "--", "prog", "ünï", "a'b"]
    printed = run_affrun(*args)
    written = run_affrun(*args[:-4], "-o", str(tmp_path / "s.sbatch"), *args[-4:])
    assert printed.returncode == written.returncode == 0
    assert printed.stdout == (tmp_path / "s.sbatch").read_bytes()
    assert os.access(tmp_path / "s.sbatch", os.X_OK)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0")), max_size=6))
def test_any_text_argv_round_trips(tmp_path_factory: pytest.TempPathFactory, words: list[str]) -> None:
    tmp = tmp_path_factory.mktemp("rt")
    script = tmp / "job.sbatch"
    script.write_text(render(SbatchSpec(command=("prog", *words), style="srun")))
    assert after(run_script(script, tmp), b"prog") == [w.encode() for w in words]


def test_options_reach_srun_and_affrun(tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    proc = run_affrun("sbatch", "--style", "srun", "--nodes", "2", "--gpus-per-node", "a100:4", "-c", "6",
                      "--mode", "numa", "--loader-cores", "1", "--reserve", "0", "--mem-policy", "none",
                      "--omp-bind", "core", "--affrun", "/opt/venv/bin/affrun", "-o", str(script), "--", "prog", "x")
    assert proc.returncode == 0, proc.stderr
    argv = [a.decode() for a in run_script(script, tmp_path)]
    assert "--cpu-bind=none" in argv
    assert "--ntasks-per-node=4" in argv
    assert "--cpus-per-task=6" in argv
    i = argv.index("/opt/venv/bin/affrun")
    assert argv[i + 1] == "exec"
    passed = argv[i + 2 : argv.index("--", i)]
    for flag in ("--mode", "numa", "--loader-cores", "1", "--reserve", "0", "--mem-policy", "none",
                 "--omp-bind", "core", "--verbose"):
        assert flag in passed
    assert argv[argv.index("--", i) + 1 :] == ["prog", "x"]


def test_torchrun_style_rendezvous_on_first_node(tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    proc = run_affrun("sbatch", "--nodes", "2", "--gpus-per-node", "4", "--rdzv-port", "29400", "-o", str(script),
                      "--", "train.py", "--lr", "0.1")
    assert proc.returncode == 0, proc.stderr
    argv = [a.decode() for a in run_script(script, tmp_path)]
    assert argv[:5] == ["--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=8", "--cpu-bind=none", "--kill-on-bad-exit=1"]
    assert "--nnodes=2" in argv and "--nproc-per-node=4" in argv
    assert "--rdzv-endpoint=n1:29400" in argv  # the first host of `scontrol show hostnames`
    assert "--rdzv-backend=c10d" in argv and "--rdzv-id=4242" in argv
    assert argv[-3:] == ["train.py", "--lr", "0.1"]


def test_default_port_and_cpus_come_from_the_job(tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    assert run_affrun("sbatch", "--style", "srun", "--gpus-per-node", "2", "-o", str(script), "--", "p").returncode == 0
    argv = [a.decode() for a in run_script(script, tmp_path)]
    assert "--cpus-per-task=4" in argv  # SLURM_CPUS_ON_NODE=8 shared by 2 tasks
    text = script.read_text()
    assert "export SRUN_CPUS_PER_TASK=$cpus_per_task" in text
    assert 'MASTER_PORT="$(( 20000 + SLURM_JOB_ID % 10000 ))"' in text


def test_golden_scripts_are_valid_bash() -> None:
    for path in sorted(GOLDEN.glob("*.sbatch")):
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{path}: {proc.stderr}"


def test_custom_template(tmp_path: Path) -> None:
    template = tmp_path / "mine.sbatch"
    template.write_text("{{shebang}}\n{{sbatch_directives}}\necho {{ranks_per_node}} {{ command }}\n")
    proc = run_affrun("sbatch", "--template", str(template), "--gpus-per-node", "3", "--", "a b", "c")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().splitlines()[-1] == "echo 3 'a b' c"


def test_custom_template_unknown_variable(tmp_path: Path) -> None:
    template = tmp_path / "bad.sbatch"
    template.write_text("#!/bin/bash\nsrun {{comand}}\n")
    proc = run_affrun("sbatch", "--template", str(template), "--", "x")
    assert proc.returncode == 2
    err = proc.stderr.decode()
    assert err.startswith(f"affrun: error: {template}: unknown template variable {{{{comand}}}}")
    assert "command" in err and "Traceback" not in err


@pytest.mark.parametrize("args,message", [
    (["--wait", "--", "x"], "--wait needs --submit"),
    (["--"], "no training command"),
    (["--", "python", "train.py"], "--style torchrun: torchrun runs the script with Python itself"),
    (["--job-name", "a\nb", "--", "x"], "cannot contain a newline"),
    (["--partition", 'a"b', "--", "x"], "cannot contain a double quote"),
    (["--sbatch-line", "mail-type=END", "--", "x"], "expected an sbatch option"),
    (["--gpus-per-node", "four", "--", "x"], "--gpus-per-node 'four'"),
    (["--template", "/nonexistent/t.sbatch", "--", "x"], "--template /nonexistent/t.sbatch"),
    (["--config", "/nonexistent/c.yaml", "--", "x"], "/nonexistent/c.yaml: configuration file not found"),
    (["--affrun", '"', "--", "x"], """--affrun-command '"': not a valid shell command: No closing quotation"""),
    (["--affrun", "affrun\\", "--", "x"], "not a valid shell command: No escaped character"),
    (["--affrun", "  ", "--", "x"], "--affrun-command: empty command"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    proc = run_affrun("sbatch", *args, env={**os.environ, "AFFRUN_CONFIG": ""})
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 or err.startswith("Usage:")


@pytest.mark.parametrize("args,message", [
    (["--reserve", "x"], "--reserve 'x': not a cpu list"),
    (["--map", "a;b"], "--map 'a;b': expected one cpu list per rank"),
    (["--gpus", "0,1", "--no-gpu"], "--gpus names GPUs for the ranks, --no-gpu plans without GPUs"),
    (["--mode", "numa", "--map", "0;1"], "which --mode numa would ignore"),
    (["--mode", "map"], "--mode map needs --map"),
    (["--ntasks-per-node", "2", "--map", "0;1;2"], "--map gives 3 entries for 2 rank(s) per node"),
    (["--gpus-per-node", "4", "--gpus", "0,1"], "--gpus gives 2 entries for 4 rank(s) per node"),
    (["--gpus-per-node", "2", "--gpus", "0,2"], "--gpus names GPU 2, but the job asks for 2 GPU(s) per node"),
])
def test_planning_options_are_refused_before_submitting(tmp_path: Path, args: list[str], message: str) -> None:
    """Options every node would refuse after the queue wait: exit 2 at once, and sbatch is never run."""
    record = tmp_path / "sbatch.ran"
    sbatch = tmp_path / "sbatch"
    sbatch.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(record))}\necho 1\n")
    sbatch.chmod(0o755)
    env = {**os.environ, "AFFRUN_CONFIG": "", "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    proc = run_affrun("sbatch", "--submit", "-c", "1", *args, "--", "train.py", env=env)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.startswith("affrun: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not record.exists(), "sbatch ran for options that fail on every node"


@pytest.mark.parametrize("style", ["srun", "torchrun"])
def test_ranks_per_node_default_to_one_per_map_or_gpus_entry(tmp_path: Path, style: str) -> None:
    """Like ``affrun plan``: with no --ntasks-per-node and no GPUs asked for, each --map / --gpus entry is a rank."""
    command = ["python3", "train.py"] if style == "srun" else ["train.py"]
    for option in (["--map", "0;1;2"], ["--gpus", "0,1,2"]):
        script = tmp_path / "job.sbatch"
        proc = run_affrun("sbatch", "--style", style, "-c", "1", *option, "-o", str(script), "--", *command)
        assert proc.returncode == 0, proc.stderr
        argv = run_script(script, tmp_path)
        if style == "srun":
            assert b"--ntasks-per-node=3" in script.read_bytes()
        else:
            assert b"--nproc-per-node=3" in argv
        assert os.fsencode(option[1]) in argv  # the option reaches affrun in the job unchanged


def test_submit_without_sbatch_on_path(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}
    proc = run_affrun("sbatch", "--submit", "--exclusive", "--", "x", env=env)
    assert proc.returncode == 2
    assert proc.stderr.decode().strip() == "affrun: error: sbatch not found on PATH (is this a Slurm login node?)"


def test_note_when_the_job_asks_for_no_cpus() -> None:
    proc = run_affrun("sbatch", "--", "x")
    assert proc.returncode == 0
    assert proc.stderr.decode().startswith("affrun: note: no --cpus-per-task and no --exclusive")
    assert run_affrun("sbatch", "-c", "8", "--", "x").stderr == b""
