"""The startup hook ``affrun-startup.pth``: how it is installed, what it costs when off, and what it decides."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from launcher.base.cpulist import parse_cpulist
from launcher.bind.handoff import BOOT
from launcher.context.launchers import python_program
from launcher.context.local_rank import SOURCES, TASK_IDENTITY, task_identity
from launcher.context.run_role import BoundCheck, decide
from launcher.errors import LaunchError
from tests.conftest import ROOT
from tests.launch import clean_env
from tests.run_dry import dry_run

PTH = ROOT / "build_backend" / "affrun-startup.pth"
MODULE = ROOT / "build_backend" / "_affrun_startup.py"
HEAVY = ("click", "psutil", "yaml", "cpuinfo", "submitit", "torch", "numpy", "argparse")
SPAWN = [sys.executable, "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=4, pipe_handle=6)",
         "--multiprocessing-fork"]
SCRIPT = [sys.executable, "train.py"]


# ------------------------------------------------------------------------------------------- decisions (pure)
def bound(environ: dict[str, str], nproc: int) -> tuple[dict[str, str], BoundCheck]:
    """``environ`` whose binding marker (if any) is of the plan checked, and a check the process passes: it runs
    within its rank's CPUs (tests/system/test_hostile_hook.py holds the cases where it does not)."""
    marked = {**environ, "AFFRUN_PLAN_ID": "p"} if "AFFRUN_LOCAL_RANK" in environ else environ
    return marked, BoundCheck("p", (frozenset(range(8)),) * nproc, frozenset({0}))


@pytest.mark.parametrize(
    ("environ", "argv", "action", "rank"),
    [
        ({"AFFRUN_RUN": "launcher"}, [sys.executable, "/usr/bin/torchrun", "t.py"], "launcher", None),
        ({"AFFRUN_RUN": "rank0"}, SCRIPT, "rank", 0),  # Lightning's rank 0, a single-process job
        ({"AFFRUN_RUN": "launcher", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, SCRIPT, "rank", 1),
        ({"AFFRUN_RUN": "launcher", "LOCAL_RANK": "1"}, SCRIPT, "rank", 1),  # Lightning: no LOCAL_WORLD_SIZE
        ({"AFFRUN_RUN": "launcher", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, SCRIPT,
         "rank", 1),
        ({"AFFRUN_RUN": "rank0", "AFFRUN_LOCAL_RANK": "0", "LOCAL_RANK": "1"}, SCRIPT, "rank", 1),  # started by rank 0
        ({"AFFRUN_RUN": "rank0", "AFFRUN_LOCAL_RANK": "0"}, SPAWN, "worker", 0),  # DataLoader worker of rank 0
        ({"AFFRUN_RUN": "launcher", "AFFRUN_LOCAL_RANK": "1", "LOCAL_RANK": "1"}, SPAWN, "worker", 1),
        ({"AFFRUN_RUN": "launcher", "AFFRUN_LOCAL_RANK": "1", "LOCAL_RANK": "1"},
         [sys.executable, "-c", "from multiprocessing.forkserver import main; main(3, 4)"], "worker", 1),
        ({"AFFRUN_RUN": "launcher", "AFFRUN_LOCAL_RANK": "1", "LOCAL_RANK": "1"}, SCRIPT, "inherit", 1),  # bound
        ({"AFFRUN_RUN": "rank0", "AFFRUN_LOCAL_RANK": "0"}, [sys.executable, "eval.py"], "inherit", 0),
        ({"AFFRUN_RUN": "launcher", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, [sys.executable, "-c", BOOT, "exec"],
         "skip", None),
        ({"AFFRUN_RUN": "rank0"}, [sys.executable, "/venv/bin/affrun", "doctor"], "skip", None),
    ],
)
def test_decisions(environ: dict[str, str], argv: list[str], action: str, rank: int | None) -> None:
    marked, check = bound(environ, 2)
    decision = decide(marked, argv, check)
    assert (decision.action, decision.rank) == (action, rank), decision.reason


# A Slurm batch script's task (or an srun task) that runs `affrun run`, and what affrun run recorded of it.
TASK = {"SLURM_JOB_ID": "7", "SLURM_LOCALID": "0", "SLURM_PROCID": "0", "SLURM_STEP_TASKS_PER_NODE": "1",
        "SLURM_TASK_PID": "500"}
RECORDED = {"AFFRUN_RUN_TASK": json.dumps(task_identity(TASK))}
BELOW = {"AFFRUN_RUN": "launcher", "AFFRUN_LAUNCHER_PID": "100"}  # the top launcher's hook wrote its pid
DS_LAUNCH = [sys.executable, "-u", "-m", "deepspeed.launcher.launch", "--world_info=e30=", "t.py"]


@pytest.mark.parametrize(
    ("environ", "argv", "nproc", "action", "rank"),
    [
        # accelerate's simple launcher: its one process has no rank variable
        (BELOW, SCRIPT, 1, "rank", 0),
        ({**BELOW, "ACCELERATE_USE_CPU": "True"}, SCRIPT, 2, "rank", 0),
        ({**BELOW, "ACCELERATE_USE_CPU": "True"}, [sys.executable, "-m", "mypkg.train"], 2, "rank", 0),
        (BELOW, SCRIPT, 2, "launcher", None),  # several ranks: a launcher's helper, not a rank
        ({**BELOW, "AFFRUN_LAUNCHER_PID": "200"}, [sys.executable, "/venv/bin/accelerate", "launch"], 1, "launcher",
         None),  # the launcher itself, re-exec'd
        ({"AFFRUN_RUN": "launcher"}, SCRIPT, 1, "launcher", None),  # --top launcher: the top process
        # the helpers of multi-process launchers stay unbound, even in a one-rank plan
        (BELOW, DS_LAUNCH, 1, "launcher", None),
        (BELOW, [sys.executable, "/venv/bin/torchrun", "--nproc-per-node", "1", "t.py"], 1, "launcher", None),
        (BELOW, [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"], 1, "launcher", None),
        (BELOW, SPAWN, 1, "launcher", None),
        (BELOW, [sys.executable, "-c", "from multiprocessing.resource_tracker import main;main(5)"], 1, "launcher",
         None),
        ({**BELOW, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, SCRIPT, 1, "rank", 0),  # torchrun's rank
        ({**BELOW, "AFFRUN_LOCAL_RANK": "0"}, SCRIPT, 1, "inherit", 0),  # below the bound rank
        # inside a scheduler's task: its variables describe affrun run's task, not a rank
        ({"AFFRUN_RUN": "launcher", **TASK, **RECORDED}, [sys.executable, "/venv/bin/accelerate", "launch"], 2,
         "launcher", None),
        ({**BELOW, **TASK, **RECORDED}, DS_LAUNCH, 2, "launcher", None),
        ({**BELOW, **TASK, **RECORDED}, SCRIPT, 1, "rank", 0),  # accelerate's one process, in a batch script
        ({**BELOW, **TASK, **RECORDED, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, SCRIPT, 2, "rank", 1),
        ({**BELOW, **TASK, **RECORDED, "SLURM_TASK_PID": "600", "SLURM_STEP_ID": "3"}, SCRIPT, 2, "rank", 0),  # srun
        ({**BELOW, **TASK, **RECORDED, "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2"}, SCRIPT, 2, "rank", 1),
        ({"AFFRUN_RUN": "launcher", **TASK}, SCRIPT, 2, "rank", 0),  # not recorded: a rank, as before
        # --top rank0 (one affrun run per task): the task's variable is the rank, as before
        ({"AFFRUN_RUN": "rank0", **TASK, **RECORDED, "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2"},
         SCRIPT, 2, "rank", 1),
    ],
)
def test_decisions_below_a_launcher(environ: dict[str, str], argv: list[str], nproc: int, action: str,
                                    rank: int | None) -> None:
    marked, check = bound(environ, nproc)
    decision = decide(marked, argv, check, pid=200)
    assert (decision.action, decision.rank) == (action, rank), decision.reason


def test_task_identity_covers_every_rank_variable() -> None:
    assert [rank_var for rank_var, _ in SOURCES] == list(TASK_IDENTITY)
    assert all(names[0] == rank_var for rank_var, names in TASK_IDENTITY.items())


@pytest.mark.parametrize(
    ("argv", "kind", "value"),
    [
        ([sys.executable, "t.py", "-c", "x"], "script", "t.py"),
        ([sys.executable, "-u", "-X", "dev", "-W", "ignore", "-m", "deepspeed.launcher.launch"], "module",
         "deepspeed.launcher.launch"),
        ([sys.executable, "-um", "pkg.main", "-c"], "module", "pkg.main"),
        ([sys.executable, "-Bc", "pass"], "code", "pass"),
        ([sys.executable, "-Xdev", "t.py"], "script", "t.py"),
        ([sys.executable, "-"], "stdin", ""),
        ([sys.executable], "stdin", ""),
        ([sys.executable, "-I", "--", "t.py"], "script", "t.py"),
        ([sys.executable, "--", "-I"], "script", "-I"),  # after "--" a word is the script, whatever it looks like
    ],
)
def test_python_program(argv: list[str], kind: str, value: str) -> None:
    assert python_program(argv) == (kind, value)


@pytest.mark.parametrize(("args", "site"), [
    (["-I", "-u", "t.py"], ("-I",)), (["-sE", "-c", "pass"], ("-sE",)), (["-W", "I", "-Sc", "x"], ("-S",)),
    (["-X", "dev", "-m", "pkg"], ()), (["-I", "--", "-S"], ("-I",)), (["t.py", "-I"], ()),
])
def test_site_options_are_the_flags_before_the_program(args: list[str], site: tuple[str, ...]) -> None:
    """What ``affrun run``'s probe passes on to decide whether site runs: read by the same walk as the hook's."""
    from launcher.launch.run_target import site_options

    assert site_options(args) == site


@pytest.mark.parametrize("environ", [{"AFFRUN_RUN": "yes"}, {"AFFRUN_RUN": "rank0", "LOCAL_RANK": "x"},
                                     {"AFFRUN_RUN": "launcher", "AFFRUN_RUN_TASK": "{not json"},
                                     {"AFFRUN_RUN": "launcher", "AFFRUN_RUN_TASK": '{"SLURM_LOCALID": 0}'},
                                     {"AFFRUN_RUN": "rank0", "LOCAL_RANK": "5"},
                                     {"AFFRUN_RUN": "rank0", "AFFRUN_LOCAL_RANK": "zero"}])
def test_bad_variables_are_errors(environ: dict[str, str]) -> None:
    with pytest.raises(LaunchError):
        decide(environ, SCRIPT, bound(environ, 2)[1])


# ------------------------------------------------------------------------------------------- installed hook
def test_hook_is_installed_in_this_environment() -> None:
    """tests/run_all.sh installs affrun editable (pip install -e): the build backend put the .pth in site-packages."""
    installed = Path(sysconfig.get_paths()["purelib"]) / PTH.name
    assert installed.read_text() == PTH.read_text()
    assert (installed.parent / MODULE.name).is_file()  # what the line imports, beside it


def test_off_without_the_variable() -> None:
    code = "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] == 'launcher'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=clean_env(),
                         check=True).stdout
    assert out.strip() == "[]"


def test_on_binds_before_user_code_and_loads_nothing_heavy() -> None:
    env = dry_run("run", "--nproc-per-node", "1", "--cpus", "0").variables
    code = ("import json, os, sys; print(json.dumps({'mask': sorted(os.sched_getaffinity(0)), "
            "'omp': os.environ.get('OMP_NUM_THREADS'), 'mods': sorted({m.split('.')[0] for m in sys.modules})}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=clean_env(**env), check=True).stdout
    got = json.loads(out)
    plan = json.loads(env["AFFRUN_PLAN"])["plan"]["ranks"][0]
    assert got["mask"] == plan["cpus"] and got["omp"] == str(plan["threads"])
    assert set(got["mods"]).isdisjoint(set(HEAVY) - {"argparse"}), got["mods"]


@pytest.mark.parametrize("extra", [{"AFFRUN_RUN": "bogus"}, {"AFFRUN_RUN": "rank0", "AFFRUN_PLAN": "{not json"},
                                   {"AFFRUN_RUN": "rank0"}, {"AFFRUN_RUN": "launcher", "LOCAL_RANK": "7"},
                                   {"AFFRUN_RUN": "launcher", "AFFRUN_RUN_TASK": "[1"}])
def test_garbage_is_one_line_and_exit_2(extra: dict[str, str]) -> None:
    env = clean_env(**{**dry_run("run", "--nproc-per-node", "1", "--cpus", "0").variables, **extra})
    if "AFFRUN_PLAN" not in extra and extra.get("AFFRUN_RUN") == "rank0":
        env.pop("AFFRUN_PLAN")
    proc = subprocess.run([sys.executable, "-c", "print('user code ran')"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("affrun: error: ") and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.slow
def test_regular_wheel_carries_the_hook(tmp_path: Path) -> None:
    """A regular (non-editable) wheel has the .pth at its top, listed in RECORD; installed in a fresh venv, it
    binds a process under affrun run's variables."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # pip --python would install elsewhere
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(ROOT)], check=True, timeout=300, capture_output=True, env=env)
    (wheel,) = tmp_path.glob("affrun-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        (record,) = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
        lines = zf.read(record).decode().splitlines()
        for source in (PTH, MODULE):
            data = zf.read(source.name)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert data == source.read_bytes() and f"{source.name},sha256={digest},{len(data)}" in lines
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", str(wheel)], check=True, timeout=300, capture_output=True, env=env)
    env = dry_run("run", "--nproc-per-node", "1", "--cpus", "0").variables
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                         capture_output=True, text=True, timeout=60, env=clean_env(**env), check=True).stdout
    assert parse_cpulist(out.strip()[1:-1].replace(" ", "")) == frozenset(
        json.loads(env["AFFRUN_PLAN"])["plan"]["ranks"][0]["cpus"])


def test_the_hook_removes_the_same_place_variables_as_the_env_policy_names() -> None:
    """One list (launcher.env.variables.PLACE_VARIABLES): the hook's worker path kept a copy of it once."""
    import inspect

    import launcher.context.run_role as run_role
    import launcher.startup as startup

    assert not hasattr(startup, "PLACEMENT_VARIABLES") and not hasattr(run_role, "PLACEMENT_VARIABLES")
    assert "PLACE_VARIABLES" in inspect.getsource(startup.bind_as_worker)
