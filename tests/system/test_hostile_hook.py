"""Hostile input to the startup hook (issue 18): a process that only believes it is bound, the generic name
``launcher``, closed stdout/stderr, plan strings the environment cannot hold, and plans no planner could have made.

Every case runs real interpreters with the real hook (``affrun run``'s variables, or ``affrun run`` itself), and
compares what the process really runs with (``/proc/self/status``) with the plan ``affrun run`` made.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given

from launcher.base.cpulist import parse_cpulist
from launcher.bind.handoff import ParentPlan
from launcher.bind.wire import read_job
from launcher.errors import LaunchError
from tests.conftest import ROOT, need
from tests.errors import refused
from tests.launch import clean_env
from tests.plan_cases import SETTINGS, cases, plan_or_error
from tests.plan_check import check_handoff
from tests.run_dry import dry_run
from tests.system.test_hostile_input import affrun

ALLOWED = frozenset(os.sched_getaffinity(0))
PROBE = ("import json, os\n"
         "mask = open('/proc/self/status').read().split('Cpus_allowed_list:')[1].split()[0]\n"
         "print(json.dumps({'mask': mask, 'omp': os.environ.get('OMP_NUM_THREADS'),"
         " 'rank': os.environ.get('AFFRUN_LOCAL_RANK')}))\n")
USER_CODE = "print('user code ran')"


def run_env(*options: str) -> dict[str, str]:
    """The variables ``affrun run OPTIONS`` gives its command (from its --dry-run)."""
    return dry_run("run", *options).variables


def python(code: str, env: dict[str, str], *, shell_suffix: str = "", cwd: Path | None = None,
           exe: str = sys.executable) -> subprocess.CompletedProcess[str]:
    """``exe -c code`` with the hook on (``env`` added to a clean environment); ``shell_suffix`` (``2>&-``) makes
    bash start it with redirections."""
    argv = [exe, "-c", code]
    if shell_suffix:
        argv = ["bash", "-c", f"exec {shlex.join(argv)} {shell_suffix}"]
    return subprocess.run(argv, env=clean_env(**env), capture_output=True, text=True, timeout=120, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def rank_lines(stderr: str) -> dict[int, dict[str, str]]:
    """The rank lines affrun run prints (``affrun: rank 0/2 host H cpus 0 numa 0 ... omp 1 ...``), by rank."""
    out: dict[int, dict[str, str]] = {}
    for line in stderr.splitlines():
        if line.startswith("affrun: rank "):
            words = line.split()
            fields = dict(zip(words[3::2], words[4::2]))
            out[int(words[2].split("/")[0])] = fields
    return out


def mutate(env: dict[str, str], change: Callable[[dict[str, Any]], object]) -> dict[str, str]:
    data = json.loads(env["AFFRUN_PLAN"])
    change(data)
    return {**env, "AFFRUN_PLAN": json.dumps(data)}


def two_ranks() -> dict[str, str]:
    need(len(ALLOWED) >= 2, "needs 2 CPUs")
    return run_env("--nproc-per-node", "2")


# -------------------------------------------------------------------- 1. a rank that believes it is bound
@pytest.mark.parametrize("inherited", [{"AFFRUN_LOCAL_RANK": "0"}, {"AFFRUN_LOCAL_RANK": "1"},
                                       {"AFFRUN_LOCAL_RANK": "0", "AFFRUN_PLAN_ID": "0badc0de"}],
                         ids=["rank0", "rank1", "foreign-plan-id"])
def test_an_inherited_marker_is_not_proof_of_binding(tmp_path: Path, inherited: dict[str, str]) -> None:
    """rank 0 of ``affrun run`` runs on its rank's CPUs with its thread count, whatever marker it inherited."""
    two_ranks()
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    proc = affrun("run", "--nproc-per-node", "2", "--", sys.executable, str(probe), env=inherited)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    line = rank_lines(proc.stderr)[0]
    assert parse_cpulist(got["mask"]) == parse_cpulist(line["cpus"]) and got["omp"] == line["omp"], (got, line)
    assert got["rank"] == "0"


def test_affrun_run_under_affrun_exec_binds_its_rank(tmp_path: Path) -> None:
    """The issue's case: ``affrun exec`` bound the shell (all CPUs, its own thread count); ``affrun run`` inside
    it plans 2 ranks, and its rank 0 must really be on rank 0's CPUs, not left on every CPU."""
    two_ranks()
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    inner = shlex.join([sys.executable, "-m", "launcher", "run", "--nproc-per-node", "2", "--", sys.executable,
                        str(probe)])
    proc = affrun("exec", "--", "bash", "-c", inner, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    line = rank_lines(proc.stderr)[0]
    assert parse_cpulist(got["mask"]) == parse_cpulist(line["cpus"]) != ALLOWED, (got, line)
    assert got["omp"] == line["omp"], (got, line)


def test_a_marker_of_this_plan_on_other_cpus_is_not_proof() -> None:
    """Even the right plan's identity proves nothing when the process does not run on that rank's CPUs (a copied
    environment): it is bound afresh."""
    env = two_ranks()
    plan_id = read_job(env["AFFRUN_PLAN"]).identity
    proc = python(PROBE, {**env, "AFFRUN_LOCAL_RANK": "0", "AFFRUN_PLAN_ID": plan_id})
    assert proc.returncode == 0, proc.stderr
    rank0 = json.loads(env["AFFRUN_PLAN"])["plan"]["ranks"][0]
    got = json.loads(proc.stdout)
    assert parse_cpulist(got["mask"]) == frozenset(rank0["cpus"]) and got["omp"] == str(rank0["threads"]), got


@pytest.mark.parametrize("marker", [{"AFFRUN_LOCAL_RANK": "99"}, {"AFFRUN_LOCAL_RANK": "2"}])
def test_a_marker_naming_a_rank_outside_the_plan_is_an_error(marker: dict[str, str]) -> None:
    two_ranks()
    proc = affrun("run", "--nproc-per-node", "2", "--", sys.executable, "-c", USER_CODE, env=marker)
    refused(proc, "AFFRUN_LOCAL_RANK")
    assert "user code ran" not in proc.stdout


@pytest.mark.torch
@pytest.mark.slow
def test_lightning_under_affrun_exec_ranks_do_not_overlap(tmp_path: Path) -> None:
    """Lightning's rank 0 is the script; it starts ranks 1..N-1. Under an outer ``affrun exec`` rank 0 once kept
    every CPU while rank 1 bound itself onto part of them."""
    from tests.system.test_run_launchers import PROGRAMS, have

    need(have("pytorch_lightning"), "pytorch-lightning is not installed")
    two_ranks()
    probe = tmp_path / "probe"
    probe.mkdir()
    inner = shlex.join([sys.executable, "-m", "launcher", "run", "--nproc-per-node", "2", "--", sys.executable,
                        str(PROGRAMS / "lightning_train.py"), "spawn"])
    proc = affrun("exec", "--", "bash", "-c", inner, env={"PROBE_DIR": str(probe)}, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = rank_lines(proc.stderr)
    ranks = {int(r["local_rank"]): r for r in (json.loads(p.read_text()) for p in probe.iterdir())
             if r["kind"] == "rank"}
    assert sorted(ranks) == [0, 1]
    masks = [parse_cpulist(ranks[i]["mask"]) for i in (0, 1)]
    assert masks == [parse_cpulist(lines[i]["cpus"]) for i in (0, 1)], (masks, lines)
    assert not masks[0] & masks[1], masks
    assert [ranks[i]["OMP_NUM_THREADS"] for i in (0, 1)] == [lines[i]["omp"] for i in (0, 1)]


# ------------------------------------------------------------------------------- 2. the name `launcher`
@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Fresh virtual environments with affrun installed from this checkout (no dependencies: the hook needs
    none): from a regular wheel, and from an editable one, both made by the project's build backend."""
    base = tmp_path_factory.mktemp("hook-venvs")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # pip --python would install elsewhere
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(base / "regular"), str(ROOT)], check=True, timeout=600, capture_output=True, env=env)
    subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'build_backend'); import affrun_build; "
                    "affrun_build.build_editable(sys.argv[1])", str(base / "editable")], check=True, timeout=600,
                   capture_output=True, cwd=ROOT, env=env)
    out: dict[str, Path] = {}
    for kind in ("regular", "editable"):
        (wheel,) = (base / kind).glob("affrun-*.whl")
        venv = base / f"venv-{kind}"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120, env=env)
        subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                        "--no-deps", str(wheel)], check=True, timeout=600, capture_output=True, env=env)
        out[kind] = venv / "bin" / "python"
    return out


def in_venv(exe: Path, argv: list[str], extra: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = clean_env(**extra)
    env.pop("PYTHONPATH", None)
    env.update({k: v for k, v in extra.items() if k == "PYTHONPATH"})
    return subprocess.run([str(exe), *argv], env=env, capture_output=True, text=True, timeout=120, cwd=cwd,
                          stdin=subprocess.DEVNULL)


USERS_LAUNCHER = "def start():\n    return 'the user\\'s launcher'\n"
USERS_SCRIPT = "import launcher\nprint(launcher.start())\n" + PROBE


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["regular", "editable"])
@pytest.mark.parametrize("where", ["beside the script", "on PYTHONPATH"])
def test_a_users_launcher_neither_breaks_the_hook_nor_is_shadowed(venvs: dict[str, Path], tmp_path: Path,
                                                                   kind: str, where: str) -> None:
    env = run_env("--nproc-per-node", "1", "--reserve", str(min(ALLOWED))) if len(ALLOWED) > 1 else run_env()
    (tmp_path / "script.py").write_text(USERS_SCRIPT)
    if where == "beside the script":
        (tmp_path / "launcher.py").write_text(USERS_LAUNCHER)
    else:
        (tmp_path / "lib" / "launcher").mkdir(parents=True)
        (tmp_path / "lib" / "launcher" / "__init__.py").write_text(USERS_LAUNCHER)
        env["PYTHONPATH"] = str(tmp_path / "lib")
    proc = in_venv(venvs[kind], ["script.py"], env, tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    first, probe = proc.stdout.splitlines()
    assert first == "the user's launcher"
    rank0 = json.loads(env["AFFRUN_PLAN"])["plan"]["ranks"][0]
    got = json.loads(probe)
    assert parse_cpulist(got["mask"]) == frozenset(rank0["cpus"]) and got["omp"] == str(rank0["threads"]), got


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["regular", "editable"])
def test_the_hook_leaves_no_launcher_module_behind(venvs: dict[str, Path], tmp_path: Path, kind: str) -> None:
    """Off (no AFFRUN_RUN): nothing of affrun is imported. On: the process is bound, and ``sys.modules`` has no
    ``launcher`` entry afterwards, so the user's later ``import launcher`` resolves as it would without affrun."""
    code = "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in ('launcher', '_affrun_startup')))"
    off = in_venv(venvs[kind], ["-c", code], {}, tmp_path)
    assert off.returncode == 0 and off.stdout.strip() == "[]", off
    on = in_venv(venvs[kind], ["-c", code], run_env("--nproc-per-node", "1"), tmp_path)
    assert on.returncode == 0 and on.stdout.strip() == "['_affrun_startup']", on


# ---------------------------------------------------------------------------- 3. closed stdout or stderr
@pytest.mark.parametrize("suffix", ["2>&-", ">&- 2>&-"])
def test_a_bad_variable_with_closed_streams_still_stops_the_process(suffix: str) -> None:
    env = {**run_env("--nproc-per-node", "1"), "AFFRUN_RUN": "bogus"}
    proc = python(USER_CODE, env, shell_suffix=suffix)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert proc.stderr == ""


def test_a_verbose_rank_with_closed_stderr_writes_nothing_on_stdout() -> None:
    """The rank line of --verbose goes to stderr; with stderr closed it goes nowhere, not into the user's stdout."""
    env = run_env("--nproc-per-node", "1", "--verbose")
    proc = python(PROBE, env, shell_suffix="2>&-")
    assert proc.returncode == 0, proc.stdout
    got = json.loads(proc.stdout)  # the probe's line alone
    rank0 = json.loads(env["AFFRUN_PLAN"])["plan"]["ranks"][0]
    assert parse_cpulist(got["mask"]) == frozenset(rank0["cpus"])


# ------------------------------------------------------------------ 4. strings the environment cannot hold
def _rank0(d: dict[str, Any]) -> dict[str, Any]:
    rank: dict[str, Any] = d["plan"]["ranks"][0]
    return rank


STRINGS: dict[str, Callable[[dict[str, Any]], object]] = {
    "gpu_pci NUL": lambda d: _rank0(d).update(gpu_pci="0000:3b:00.0\0"),
    "gpu_pci surrogate": lambda d: _rank0(d).update(gpu_pci="0000:3b:00.0\ud800"),
    "user value NUL": lambda d: d.update(user_env={"OMP_NUM_THREADS": "1\0"}),
    "user name NUL": lambda d: d.update(user_env={"OMP_NUM\0THREADS": "1"}),
    "user name =": lambda d: d.update(user_env={"OMP=PLACES": "1"}),
    "user name empty": lambda d: d.update(user_env={"": "1"}),
    "user name unknown": lambda d: d.update(user_env={"LD_PRELOAD": "/tmp/x.so"}),
    "reason NUL": lambda d: _rank0(d).update(reasons=["a\0b"]),
    "plan warning NUL": lambda d: d["plan"].update(warnings=["\0"]),
}


@pytest.mark.parametrize("change", list(STRINGS.values()), ids=list(STRINGS))
def test_a_plan_string_the_environment_cannot_hold_is_refused(change: Callable[[dict[str, Any]], object]) -> None:
    env = mutate(run_env("--nproc-per-node", "1"), change)
    proc = python(PROBE, env)
    refused(proc, "AFFRUN_PLAN")
    assert proc.stdout == ""
    # affrun exec under torchrun reads the same variable: the same refusal
    refused(affrun("exec", "--", "true", env={"AFFRUN_PLAN": env["AFFRUN_PLAN"], "LOCAL_RANK": "0",
                                              "LOCAL_WORLD_SIZE": "1"}), "AFFRUN_PLAN")


# ------------------------------------------------------------ 5. plans no planner could have made
def _one_cpu_rank(d: dict[str, Any]) -> None:
    _rank0(d).update(threads=65536)


def _loader_is_everything(d: dict[str, Any]) -> None:
    rank = _rank0(d)
    rank.update(loader_cpus=list(rank["cpus"]))


def _no_compute(d: dict[str, Any]) -> None:
    _rank0(d).update(compute_cores=[])


def _empty_core(d: dict[str, Any]) -> None:
    _rank0(d).update(compute_cores=[[]])


def _loader_overlaps_compute(d: dict[str, Any]) -> None:
    rank = _rank0(d)
    rank.update(loader_cpus=[rank["cpus"][0]])


def _cpus_outside_cores(d: dict[str, Any]) -> None:
    ranks = d["plan"]["ranks"]  # a CPU in the mask that is neither compute nor loader
    ranks[0].update(cpus=sorted(ranks[0]["cpus"] + ranks[1]["cpus"]))
    del ranks[1], d["env"][1]


def _unshared_overlap(d: dict[str, Any]) -> None:
    ranks = d["plan"]["ranks"]  # rank 1 on rank 0's CPUs, neither of them shared
    ranks[1].update({k: ranks[0][k] for k in ("cpus", "compute_cores", "loader_cpus", "threads")})


IMPOSSIBLE: dict[str, Callable[[dict[str, Any]], None]] = {
    "65536 threads on one CPU": _one_cpu_rank, "loader CPUs are all CPUs": _loader_is_everything,
    "no compute core": _no_compute, "an empty core": _empty_core, "loader overlaps compute": _loader_overlaps_compute,
    "CPU neither compute nor loader": _cpus_outside_cores, "two unshared ranks on one CPU": _unshared_overlap,
}


@pytest.mark.parametrize("change", list(IMPOSSIBLE.values()), ids=list(IMPOSSIBLE))
def test_a_plan_no_planner_could_make_is_refused(change: Callable[[dict[str, Any]], None]) -> None:
    env = mutate(two_ranks(), change)
    with pytest.raises(LaunchError, match="not a plan written by affrun"):
        read_job(env["AFFRUN_PLAN"])
    proc = python(PROBE, env)  # the hook
    refused(proc, "AFFRUN_PLAN")
    assert proc.stdout == ""
    exec_env = {"AFFRUN_PLAN": env["AFFRUN_PLAN"], "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    refused(affrun("exec", "--", "true", env=exec_env), "AFFRUN_PLAN")  # affrun exec under torchrun


# What only the planner decides is not re-derived by the rank: a plan that says otherwise is applied as written.
AS_WRITTEN: dict[str, Callable[[dict[str, Any]], object]] = {
    "spill CPUs with spill none": lambda d: (d["plan"].update(spill="none"), _rank0(d).update(spill_nodes=[0])),
    "reserved CPU in a rank": lambda d: d["plan"].update(reserved=[_rank0(d)["cpus"][0]]),
    "a NCCL_PROXY_CPUSET of the user's": lambda d: d["env"][0]["set"].update(NCCL_PROXY_CPUSET="0"),
}


@pytest.mark.parametrize("change", list(AS_WRITTEN.values()), ids=list(AS_WRITTEN))
def test_a_plan_with_other_planner_choices_is_applied_as_written(change: Callable[[dict[str, Any]], object]) -> None:
    env = mutate(run_env("--nproc-per-node", "1"), change)
    proc = python(PROBE, env)  # the hook binds it as rank 0
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rank"] == "0"


def test_bind_rank_refuses_an_impossible_plan_and_applies_nothing() -> None:
    """Under affrun run, bind_rank reads AFFRUN_PLAN too: a refused plan leaves the mask and variables as they were."""
    env = mutate(two_ranks(), _one_cpu_rank)
    code = ("import json, os, sys\n"
            "os.environ.update(AFFRUN_RUN='rank0', AFFRUN_PLAN=sys.argv[1])\n"
            "import launcher\n"
            "try:\n    launcher.bind_rank(0, 2, quiet=True)\nexcept launcher.AffrunError as e:\n    err = str(e)\n"
            "else:\n    err = ''\n"
            "print(json.dumps({'err': err, 'mask': sorted(os.sched_getaffinity(0)),"
            " 'omp': os.environ.get('OMP_NUM_THREADS')}))\n")
    proc = subprocess.run([sys.executable, "-c", code, env["AFFRUN_PLAN"]], capture_output=True, text=True,
                          timeout=120, env=clean_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert "AFFRUN_PLAN" in got["err"] and "AFFRUN_THREADS=65536" in got["err"], got
    assert frozenset(got["mask"]) == ALLOWED and got["omp"] is None, got


def test_a_memory_node_this_machine_lacks_is_refused_not_dropped() -> None:
    """A plan whose rank names NUMA node 7 (this machine has fewer) for membind: the kernel refuses the policy with
    EINVAL, and the fallback once dropped it silently. Refused before anything is applied."""
    need(os.path.exists("/sys/devices/system/node/online"), "no NUMA information in sysfs")
    online = parse_cpulist(Path("/sys/devices/system/node/online").read_text().strip())
    missing = max(online) + 7

    def change(d: dict[str, Any]) -> None:
        _rank0(d).update(numa_nodes=[missing], mem_nodes=[missing])
        d.update(mem_policy="membind")

    env = mutate(run_env("--nproc-per-node", "1"), change)
    proc = python(PROBE, env)
    refused(proc, f"NUMA node(s) {missing}")
    assert proc.stdout == ""


@SETTINGS
@given(cases())
def test_every_plan_the_planner_makes_passes_the_check(case: Any) -> None:
    machine, request = case
    plan = plan_or_error(machine.topo, request)
    if plan is not None:
        check_handoff(ParentPlan(plan, "rank", "safe", "none", "auto", {}, False))
