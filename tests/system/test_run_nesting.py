"""A sub-job under ``affrun run`` (issue 26, item 8): a script bound by ``affrun run``'s hook that launches
``affrun exec`` or ``affrun torchrun`` itself. The inner launcher is a job of its own: its ranks run with its own
binding (within the CPUs the outer rank was given), and no rank dies on ``AFFRUN_PLAN``, which the inner launcher
takes away from the command it execs. Real processes throughout: the outer ``affrun run``, the script, the inner
launcher (as ``python -m launcher`` and as the venv's console script) and its ranks, which report their real mask.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need
from tests.launch import clean_env
from tests.system.test_hostile_input import affrun

CPUS = sorted(os.sched_getaffinity(0))
CONSOLE = Path(sys.executable).parent / "affrun"
# An inner rank's report: its LOCAL_RANK, its real mask, what binding marks it.
# One write(2) per line: two ranks share the pipe, and an unbuffered print writes the text and its newline apart.
REPORT = ("import os, json; os.write(1, ('INNER ' + json.dumps([os.environ.get('LOCAL_RANK'), "
          "sorted(os.sched_getaffinity(0)), os.environ.get('AFFRUN_LOCAL_RANK')]) + '\\n').encode())")


def outer_script(tmp: Path, inner: list[str]) -> Path:
    """The user's script: it runs ``inner`` (an affrun launcher) and exits with its status."""
    (tmp / "inner.py").write_text(REPORT + "\n")
    path = tmp / "outer.py"
    path.write_text("import subprocess, sys\n"
                    f"sys.exit(subprocess.run({inner!r}, cwd={str(tmp)!r}).returncode)\n")
    return path


def affrun_words(form: str) -> list[str]:
    if form == "console":
        need(CONSOLE.exists(), "this venv has no affrun console script")
        return [sys.executable, str(CONSOLE)]
    return [sys.executable, "-m", "launcher"]


def inner_reports(stdout: str) -> list[tuple[str | None, list[int], str | None]]:
    return [tuple(json.loads(ln[len("INNER "):])) for ln in stdout.splitlines() if ln.startswith("INNER ")]


INNER = {
    # a sub-job of one process, no options: one rank on everything the outer rank has
    "exec": (["exec", "--", sys.executable, "inner.py"], [(None, "all", "0")]),
    # a rank of a two-rank sub-job, given on the command line
    "exec rank 1 of 2": (["exec", "--local-rank", "1", "--nproc-per-node", "2", "--", sys.executable, "inner.py"],
                         [(None, "second", "1")]),
    "exec --cpus": (["exec", "--cpus", "first", "--", sys.executable, "inner.py"], [(None, "first", "0")]),
}


def cpus_of(name: str) -> list[int]:
    return {"all": CPUS, "first": CPUS[:1], "second": CPUS[1:2]}[name]


@pytest.mark.parametrize("top", ["rank0", "launcher"])
@pytest.mark.parametrize("form", ["module", "console"])
@pytest.mark.parametrize("case", list(INNER))
def test_affrun_exec_under_affrun_run_binds_with_its_own_plan(tmp_path: Path, case: str, form: str, top: str) -> None:
    need(len(CPUS) >= 2, "two ranks need two allowed CPUs")
    words, expected = INNER[case]
    words = [str(CPUS[0]) if w == "first" else w for w in words]
    script = outer_script(tmp_path, [*affrun_words(form), *words])
    proc = affrun("run", "--top", top, "--nproc-per-node", "1", "--", sys.executable, str(script), cwd=tmp_path)
    assert proc.returncode == 0 and "affrun: error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    got = inner_reports(proc.stdout)
    assert got == [(rank, cpus_of(cpus), bound) for rank, cpus, bound in expected], (got, proc.stderr)


@pytest.mark.torch
@pytest.mark.parametrize("form", ["module", "console"])
def test_affrun_torchrun_under_affrun_run_binds_its_ranks(tmp_path: Path, form: str) -> None:
    need(len(CPUS) >= 2, "two ranks need two allowed CPUs")
    script = outer_script(tmp_path, [*affrun_words(form), "torchrun", "--nproc-per-node", "2", "inner.py"])
    proc = affrun("run", "--nproc-per-node", "1", "--", sys.executable, str(script), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0 and "affrun: error" not in proc.stderr, proc.stderr[-3000:]
    got = sorted(inner_reports(proc.stdout), key=lambda r: str(r[0]))
    # torchrun's two ranks, each on one CPU of its own (never two ranks on one CPU), bound by affrun torchrun
    assert [(r[0], r[2]) for r in got] == [("0", "0"), ("1", "1")], proc.stderr[-3000:]
    assert len(got[0][1]) == len(got[1][1]) == 1 and got[0][1] != got[1][1]


def test_a_rank_an_affrun_binding_execd_is_left_alone_by_the_hook(tmp_path: Path) -> None:
    """Whatever started it: a process that an affrun binding exec'd (its plan taken away, AFFRUN_PLAN_ID kept) is
    not killed by the hook over the missing AFFRUN_PLAN, even when AFFRUN_RUN came down to it (here through an
    ``affrun exec`` whose own interpreter ran no hook: ``-S``)."""
    import click  # affrun's parser: -S leaves site-packages out

    checkout = os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.path.dirname(os.path.dirname(click.__file__))])
    env = clean_env(AFFRUN_RUN="launcher", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", PYTHONPATH=checkout)
    proc = subprocess.run([sys.executable, "-S", "-m", "launcher", "exec", "--", sys.executable, "-c", REPORT],
                          env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0 and "affrun: error" not in proc.stderr, proc.stderr
    assert inner_reports(proc.stdout)[0][2] == "0"


@pytest.mark.parametrize(("launch", "depth"), [pytest.param("torchrun", 1, marks=pytest.mark.torch), ("exec", 1), ("exec", 2)])
def test_affrun_exec_inside_a_rank_of_two_is_a_sub_job_on_that_rank_s_cpus(tmp_path: Path, launch: str,
                                                                           depth: int) -> None:
    """Each of two ranks (``affrun torchrun``, or ``affrun exec`` under srun-like variables) runs ``affrun exec --
    CMD``: the LOCAL_RANK/LOCAL_WORLD_SIZE it inherited are its own binding's, so the sub-job is one rank on that
    rank's CPUs (it was "rank 0 of 2" packed into one CPU: an error, and a false warning of a collapsed mask).
    ``depth`` 2: the sub-job runs ``affrun exec`` again; it passed the launcher's variables on and recorded that it
    consumed them (``AFFRUN_SUBJOB_OF``), so the inner one is one rank as well."""
    need(len(CPUS) >= 2, "two ranks need two allowed CPUs")
    target = "inner.py"
    for level in range(depth):
        script = outer_script(tmp_path, [*affrun_words("module"), "exec", "--", sys.executable, target])
        if level < depth - 1:
            target = f"level{level}.py"
            script = script.rename(tmp_path / target)
    if launch == "torchrun":
        procs = [affrun("torchrun", "--nproc-per-node", "2", str(script), cwd=tmp_path, timeout=300)]
    else:
        procs = [affrun("exec", "--", sys.executable, str(script), cwd=tmp_path, env={
            "SLURM_LOCALID": str(rank), "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NTASKS": "2",
            "SLURM_PROCID": str(rank)}) for rank in (0, 1)]
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "affrun: error" not in proc.stderr and "collapsed" not in proc.stderr, proc.stderr[-3000:]
    got = sorted((r for p in procs for r in inner_reports(p.stdout)), key=lambda r: str(r[1]))
    assert [len(r[1]) for r in got] == [1, 1] and got[0][1] != got[1][1], got  # each on its own rank's one CPU
    assert [r[2] for r in got] == ["0", "0"], got  # each the one rank of its sub-job
