"""``affrun sbatch`` without a cluster: rendering, quoting (checked by running the script with real bash),
golden scripts, errors, Slurm step facts and the GPU mapping inside a Slurm step.

The cluster tests are in ``test_slurm_cluster.py``.
"""

from __future__ import annotations

import difflib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.base.slurm_step import (
    cpu_bind_masks,
    expand_counts,
    parse_version,
    slurm_global_visible,
    slurm_gpu_ids,
    srun_inherits_cpus_per_task,
    step_cpus_for_planning,
    tasks_on_node,
)
from launcher.errors import ConfigError
from launcher.options.plan_options import PlanOptions
from launcher.slurm.script import TEMPLATE_VARIABLES, SbatchSpec, builtin_template, render
from launcher.topology.gpus import resolve_visible
from launcher.topology.model import GPU

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "data" / "sbatch"

# Every kind of argument a shell could misread. CANARY is replaced by a path that must never be created.
HOSTILE = [
    "two words",
    "",
    "it's",
    'say "hi"',
    "$(touch CANARY)",
    "`touch CANARY`",
    "; touch CANARY",
    "a && touch CANARY",
    "| touch CANARY",
    "line one\nline two",
    "trailing newline\n",
    "*",
    "?[ab]*",
    "{a,b}",
    "~",
    "$HOME ${IFS} $1 $@",
    "\\",
    "'\"'",
    "\t tab",
    "ünïcødé ✓ 日本",
    "#SBATCH --nodes=99",
    "--",
    "--nnodes=9",
    "-c",
    "!!",
    "%j %x",
]


def hostile(canary: Path) -> list[str]:
    return [a.replace("CANARY", str(canary)) for a in HOSTILE]


def run_affrun(*args: str | bytes, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, env=env, cwd=cwd, timeout=60)


def write_recorders(bin_dir: Path, record: Path) -> None:
    """``srun`` and ``scontrol`` that only record what bash gave them: the rest of the script is really run."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    srun = bin_dir / "srun"
    srun.write_text(f"#!{sys.executable}\nimport os, sys\n"
                    f"open({str(record)!r}, 'wb').write(b'\\0'.join(os.fsencode(a) for a in sys.argv[1:]))\n")
    scontrol = bin_dir / "scontrol"
    scontrol.write_text("#!/bin/sh\nprintf 'n1\\nn2\\n'\n")
    srun.chmod(0o755)
    scontrol.chmod(0o755)


def run_script(script: Path, tmp: Path) -> list[bytes]:
    """Run the batch script with bash as a job would, and return the argv its ``exec srun`` received."""
    record = tmp / "srun.argv"
    record.unlink(missing_ok=True)
    write_recorders(tmp / "bin", record)
    env = {
        "PATH": f"{tmp / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp),
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_NNODES": "2",
        "SLURM_JOB_ID": "4242",
        "SLURM_CPUS_ON_NODE": "8",
    }
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, timeout=30, cwd=tmp)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return record.read_bytes().split(b"\0")


def after(argv: list[bytes], marker: bytes) -> list[bytes]:
    return argv[argv.index(marker) + 1 :]


# ---------------------------------------------------------------------------- quoting


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


# ---------------------------------------------------------------------------- goldens


def full_spec(style: str) -> SbatchSpec:
    return SbatchSpec(
        command=("train.py", "--data", "/scratch/my data", "--note", "it's $HOME"),
        style=style,
        nodes=2,
        gpus_per_node="a100:4",
        cpus_per_task=32,
        time="02:00:00",
        partition="gpu",
        account="proj42",
        qos="normal",
        constraint="a100&ib",
        job_name="llm pretrain",
        output="logs/%x-%j.out",
        error="logs/%x-%j.err",
        mem="200G",
        exclusive=True,
        sbatch_lines=("--mail-type=END", "#SBATCH --signal=USR1@120"),
        setup=("module load cuda/12.4", "source ~/venvs/train/bin/activate"),
        rdzv_port=29500,
        affrun="affrun",
        plan=PlanOptions(loader_cores=2),
        mem_policy="preferred",
    )


@pytest.mark.parametrize("name,spec", [
    ("torchrun-full", full_spec("torchrun")),
    ("srun-full", full_spec("srun")),
    ("torchrun-minimal", SbatchSpec(command=("train.py",))),
    ("srun-minimal", SbatchSpec(command=("python", "train.py"), style="srun", gpus_per_node="2")),
])
def test_golden(name: str, spec: SbatchSpec) -> None:
    text = render(spec).replace("affrun 0.1.0", "affrun VERSION")
    from launcher import __version__

    text = text.replace(f"affrun {__version__},", "affrun VERSION,")
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("AFFRUN_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(path), "rendered"))
        pytest.fail(f"rendered script differs from {path} (AFFRUN_UPDATE_GOLDEN=1 rewrites it):\n{diff}")


def test_golden_scripts_are_valid_bash() -> None:
    for path in sorted(GOLDEN.glob("*.sbatch")):
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{path}: {proc.stderr}"


# ---------------------------------------------------------------------------- templates


def test_every_template_variable_is_documented() -> None:
    readme = (ROOT / "templates" / "README.md").read_text()
    for name in TEMPLATE_VARIABLES:
        assert f"`{{{{{name}}}}}`" in readme, name


def test_builtin_templates_are_the_shipped_files() -> None:
    for style in ("torchrun", "srun"):
        assert builtin_template(style).read_bytes() == (ROOT / "templates" / f"{style}.sbatch").read_bytes()


def test_templates_ship_in_the_wheel_config() -> None:
    """templates/ is the package launcher.templates (a symlink), and its files are package data."""
    link = ROOT / "launcher" / "templates"
    assert link.is_symlink() and os.readlink(link) == "../templates"
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["packages"]["find"]["include"] == ["launcher*"]
    assert {"*.sbatch", "*.md"} <= set(config["package-data"]["launcher.templates"])
    from importlib.resources import files

    assert files("launcher.templates").joinpath("srun.sbatch").read_text() == (ROOT / "templates" / "srun.sbatch").read_text()


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


# ---------------------------------------------------------------------------- errors


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


def test_directive_quoting_for_spaces() -> None:
    text = render(SbatchSpec(command=("x",), job_name="my job", output="/a b/%j.out"))
    assert '#SBATCH --job-name="my job"' in text
    assert '#SBATCH --output="/a b/%j.out"' in text


def test_check_spec_rejects_empty_affrun() -> None:
    with pytest.raises(ConfigError, match="--affrun"):
        render(SbatchSpec(command=("x",), affrun="  "))


# ---------------------------------------------------------------------------- Slurm step facts


def test_expand_counts() -> None:
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("72(x2),36") == [72, 72, 36]
    assert expand_counts("4") == [4]
    with pytest.raises(ValueError):
        expand_counts("2(x),1")


def test_tasks_on_node() -> None:
    assert tasks_on_node({"SLURM_STEP_TASKS_PER_NODE": "2(x2),1", "SLURM_NODEID": "2"}) == 1
    assert tasks_on_node({"SLURM_STEP_TASKS_PER_NODE": "2(x2),1", "SLURM_NODEID": "1"}) == 2
    assert tasks_on_node({"SLURM_TASKS_PER_NODE": "3", "SLURM_NODEID": "0"}) == 3
    assert tasks_on_node({"SLURM_NTASKS_PER_NODE": "4"}) == 4
    assert tasks_on_node({}) is None


def test_slurm_gpu_ids_step_wins_and_job_gpus_is_ignored_in_a_step() -> None:
    # measured: an srun step on n2 inherits the batch node's SLURM_JOB_GPUS=1, but its own GPUs are SLURM_STEP_GPUS=0
    assert slurm_gpu_ids({"SLURM_STEP_ID": "0", "SLURM_JOB_GPUS": "1", "SLURM_STEP_GPUS": "0"}) == ((0,), "SLURM_STEP_GPUS")
    assert slurm_gpu_ids({"SLURM_STEP_ID": "0", "SLURM_JOB_GPUS": "1"}) is None
    assert slurm_gpu_ids({"SLURM_JOB_GPUS": "2,3"}) == ((2, 3), "SLURM_JOB_GPUS")
    assert slurm_gpu_ids({"SLURM_JOB_GPUS": "MIG-abc"}) is None
    assert slurm_gpu_ids({}) is None


def test_cpu_bind_masks() -> None:
    env = {"SLURM_CPU_BIND_TYPE": "mask_cpu:", "SLURM_CPU_BIND_LIST": "0x1,0x2,0xF0"}
    assert cpu_bind_masks(env) == [frozenset({0}), frozenset({1}), frozenset({4, 5, 6, 7})]
    assert cpu_bind_masks({"SLURM_CPU_BIND_TYPE": "map_cpu:", "SLURM_CPU_BIND_LIST": "3,7"}) == [frozenset({3}), frozenset({7})]
    assert cpu_bind_masks({"SLURM_CPU_BIND_TYPE": "none", "SLURM_CPU_BIND_LIST": ""}) is None


def test_every_task_of_a_node_plans_over_the_same_cpus() -> None:
    # measured on the test cluster: srun -n2 without --cpu-bind=none gives masks {0} and {1}, cpuset 0-1
    bound = {"SLURM_STEP_ID": "0", "SLURM_LOCALID": "0", "SLURM_CPU_BIND_TYPE": "mask_cpu:",
             "SLURM_CPU_BIND_LIST": "0x1,0x2"}
    cpuset = frozenset({0, 1})
    plans = {step_cpus_for_planning({**bound, "SLURM_LOCALID": str(i)}, frozenset({i}), cpuset)[0] for i in (0, 1)}
    assert plans == {cpuset}
    # no cgroup (task/affinity only): the union of the node's task masks
    assert step_cpus_for_planning(bound, frozenset({1}), None)[0] == cpuset
    # --cpu-bind=none: the mask is the cpuset already
    unbound = {"SLURM_STEP_ID": "0", "SLURM_LOCALID": "1", "SLURM_CPU_BIND_TYPE": "none", "SLURM_CPU_BIND_LIST": ""}
    assert step_cpus_for_planning(unbound, cpuset, cpuset) == (cpuset, None)
    # not in a step (batch script, plain shell): the process mask, as it is
    assert step_cpus_for_planning({}, frozenset({1}), cpuset) == (frozenset({1}), None)
    note = step_cpus_for_planning(bound, frozenset({0}), cpuset)[1]
    assert note is not None and "planning over the step's cpuset 0-1" in note


def test_versions() -> None:
    assert parse_version("slurm 22.05.8") == (22, 5, 8)
    assert parse_version("slurm-wlm 23.02.5") == (23, 2, 5)
    assert parse_version("none") is None
    assert not srun_inherits_cpus_per_task((22, 5, 8))
    assert not srun_inherits_cpus_per_task((23, 2, 4))
    assert srun_inherits_cpus_per_task((23, 2, 5))
    assert srun_inherits_cpus_per_task((21, 8, 8))
    assert srun_inherits_cpus_per_task((24, 5, 0))


# ---------------------------------------------------------------------------- GPUs inside a Slurm step


def gpus(n: int) -> list[GPU]:
    return [GPU(index=i, pci=f"0000:{i + 1:02x}:00.0", vendor="nvidia", numa_node=i % 2, cpus=frozenset({i}),
                uuid=f"GPU-{i}") for i in range(n)]


@pytest.mark.parametrize("env,expected", [
    # device cgroup constrained: indices count within the step's GPUs
    ({"CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "3"}, (3,)),
    ({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "2,3"}, (2, 3)),
    ({"CUDA_VISIBLE_DEVICES": "1,0", "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "2,3"}, (3, 2)),
    # batch step: SLURM_JOB_GPUS
    ({"CUDA_VISIBLE_DEVICES": "0", "SLURM_JOB_GPUS": "1"}, (1,)),
    # not constrained: the indices are the global ids already
    ({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "2,3"}, (2, 3)),
    ({"CUDA_VISIBLE_DEVICES": "3", "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "2,3"}, (3,)),
    # in a step, the inherited SLURM_JOB_GPUS of the batch node is not used
    ({"CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_ID": "0", "SLURM_JOB_GPUS": "3"}, (0,)),
    # UUIDs are unambiguous
    ({"CUDA_VISIBLE_DEVICES": "GPU-2", "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "2"}, (2,)),
    # Slurm ids beyond this machine's GPUs (e.g. MIG instances): taken as they are
    ({"CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "9"}, (0,)),
    # no Slurm: plain
    ({"CUDA_VISIBLE_DEVICES": "1"}, (1,)),
])
def test_resolve_visible_in_slurm(env: dict[str, str], expected: tuple[int, ...]) -> None:
    assert resolve_visible(gpus(4), env)[0] == expected


def test_slurm_global_visible_keeps_non_numeric() -> None:
    env = {"SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "1"}
    assert slurm_global_visible("GPU-1", env, 4) is None
    assert slurm_global_visible("0", env, 4) == "1"
    assert slurm_global_visible("", env, 4) is None


def test_rank_gets_cores_near_its_own_gpu_in_a_constrained_step(tmp_path: Path) -> None:
    """The job was given global GPU 1 only; CUDA_VISIBLE_DEVICES=0. Rank 0 must sit by GPU 1, not GPU 0."""
    from launcher.plan.planner import make_plan
    from launcher.topology import load_topology
    from tests.fakesys import FakeGPU, FakeMachine, write_tree

    m = FakeMachine(cores=[(c,) for c in range(8)], node_of_core=[0] * 4 + [1] * 4, package_of_core=[0] * 4 + [1] * 4)
    m.gpus = [FakeGPU(pci="0000:17:00.0", numa_node=0), FakeGPU(pci="0000:b1:00.0", numa_node=1)]
    root = write_tree(tmp_path / "fs", m)
    env = {"CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "1", "SLURM_LOCALID": "0"}
    topo = load_topology(fsroot=str(root), environ=env)
    rank = make_plan(topo, PlanOptions(spill="none").request(1)).ranks[0]
    assert rank.gpu == 0 and rank.gpu_pci == "0000:b1:00.0"
    assert set(rank.cpus) <= {4, 5, 6, 7}
    # By default node 0, which hosts no rank, adds its cores as loader cores; compute stays by GPU 1.
    rank = make_plan(topo, PlanOptions().request(1)).ranks[0]
    assert (rank.gpu_pci, rank.compute_cpus, rank.loader_cpus) == ("0000:b1:00.0", (4, 5, 6, 7), (0, 1, 2, 3))

