"""``affrun exec`` runs before every rank: its import path must not load heavy or optional packages (click, its
parser, is affrun's one dependency it loads)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import click
import pytest

HEAVY = ("click", "psutil", "yaml", "cpuinfo", "submitit", "torch", "numpy")
PARSER = {"click"}  # what the commands' parser loads: every command, exec included (issue 42)

PROBE = """
import json, sys
sys.argv = ["affrun"] + {argv!r}
from launcher.main import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}})), file=sys.stderr)
"""


@pytest.mark.parametrize(
    "argv",
    [["exec", "--dry-run", "--", "true"], ["exec", "--dry-run", "--nproc-per-node", "1", "--local-rank", "0", "--", "x"]],
)
def test_exec_path_loads_no_heavy_package(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stderr.strip().splitlines()[-1]))
    assert loaded.isdisjoint(set(HEAVY) - PARSER), sorted(loaded & set(HEAVY))
    assert "launcher" in loaded


@pytest.mark.parametrize("module", ["launcher.plan.planner", "launcher.env.policy", "launcher.topology", "launcher", "launcher.launch.exec_cmd",
                                    "launcher.startup", "launcher.launch.run_cmd", "launcher.bind.inprocess"])
def test_core_modules_load_no_heavy_package(module: str) -> None:
    code = f"import sys, json, {module}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(json.loads(proc.stdout))
    heavy = set(HEAVY) - (PARSER if module.startswith("launcher.launch") else set())
    assert loaded.isdisjoint(heavy), sorted(loaded & heavy)


RANK_PROBE = """
import os, sys
sys.argv = ["affrun"] + {argv!r}
os.environ.update({env!r})
before = set(sys.modules)
import launcher.main
try:
    launcher.main.main()
except SystemExit as exc:
    print(exc.code, sorted({{m.split(".")[0] for m in set(sys.modules) - before}}), file=sys.stderr)
"""
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# `python -S` has no site-packages: the probes find affrun, and click where this interpreter has it
PROBE_PATH = f"{ROOT}{os.pathsep}{os.path.dirname(os.path.dirname(click.__file__))}"


def _loaded_by_exec(argv: list[str], env: dict[str, str]) -> set[str]:
    """Top-level modules that `affrun exec ARGV` imports up to its execve (the command does not exist: the probe
    gets control back after everything but the exec). `python -S`: the development venv's editable finder,
    loaded by site, imports several of these modules itself, where an installed affrun's interpreter does not."""
    code = RANK_PROBE.format(argv=argv, env=env)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AFFRUN_", "LOCAL_", "SLURM_", "OMPI_", "PMI_"))}
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                          env={**clean, "PYTHONPATH": PROBE_PATH}, cwd=ROOT)
    status, _, loaded = proc.stderr.strip().splitlines()[-1].partition(" ")
    assert status == "127", proc.stderr
    return set(ast.literal_eval(loaded))


# A standalone rank plans, and the planner's records are the standard library's dataclasses (issue 19: about 15 ms,
# against the rank's own `import torch` of about a second); what it still leaves out is what it does not use.
STANDALONE_UNUSED = ("argparse", "shutil", "shlex")


def test_a_standalone_rank_imports_none_of_the_modules_it_does_not_use() -> None:
    """srun/mpirun/submitit: `affrun exec -- CMD` reads the topology and plans by itself."""
    for env in ({}, {"SLURM_STEP_ID": "0", "SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
                     "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}):
        loaded = _loaded_by_exec(["exec", "--", "/nonexistent/affrun-probe"], env)
        assert "launcher" in loaded
        assert loaded.isdisjoint(STANDALONE_UNUSED), sorted(loaded & set(STANDALONE_UNUSED))


def _modules_of_a_rank_under_a_parent_plan() -> set[str]:
    """affrun's modules that `affrun exec` imports, up to its execve, in a rank that applies its parent's record."""
    from launcher.bind.handoff import plan_job
    from launcher.options.record import Options

    _, parent = plan_job(Options(), 1)
    code = RANK_PROBE.replace('{{m.split(".")[0] for m in set(sys.modules) - before}}',
                              '{{m for m in set(sys.modules) - before if m.startswith(("launcher", "click"))}}')
    code = code.format(argv=["exec", "--", "/nonexistent/affrun-probe"],
                       env={"AFFRUN_PLAN": parent.to_env(), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AFFRUN_", "LOCAL_", "SLURM_", "OMPI_", "PMI_"))}
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                          env={**clean, "PYTHONPATH": PROBE_PATH}, cwd=ROOT)
    status, _, loaded = proc.stderr.strip().splitlines()[-1].partition(" ")
    assert status == "127", proc.stderr
    return set(ast.literal_eval(loaded))


def test_a_rank_under_a_parent_plan_imports_no_planner_topology_or_options() -> None:
    """The one channel (launcher.bind.wire): a rank applies its parent's record (launcher.plan.record) and
    re-derives nothing; with no option before `--` (every affrun torchrun worker) it loads no parser either."""
    modules = _modules_of_a_rank_under_a_parent_plan()
    assert {"launcher.bind.wire", "launcher.plan.record"} <= modules
    heavy = {m for m in modules if m.startswith(("launcher.plan", "launcher.topology", "launcher.options.record",
                                                  "launcher.bind.handoff", "launcher.env.policy", "launcher.cli",
                                                  "launcher.options.click", "click"))}
    assert not heavy - {"launcher.plan", "launcher.plan.record", "launcher.plan.request"}, sorted(heavy)


def test_exec_with_no_option_reads_what_click_reads() -> None:
    """`affrun exec -- CMD` skips the parser: the values it uses are those click parses from no option."""
    from launcher.launch.exec_cmd import command
    from launcher.launch.rank import defaults

    with command.make_context("exec", ["--", "true"]) as ctx:
        assert ctx.params == defaults()



def test_a_standalone_rank_reads_no_cpu_identity() -> None:
    """The CPU's identity (launcher.topology.cpu_identity, py-cpuinfo) is for ``affrun topology`` and ``affrun
    doctor``: a rank that reads the topology itself never reads /proc/cpuinfo for it."""
    code = RANK_PROBE.replace('{{m.split(".")[0] for m in set(sys.modules) - before}}', '{{m for m in sys.modules}}')
    code = code.format(argv=["exec", "--", "/nonexistent/affrun-probe"], env={})
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AFFRUN_", "LOCAL_", "SLURM_", "OMPI_", "PMI_"))}
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                          env={**clean, "PYTHONPATH": PROBE_PATH}, cwd=ROOT)
    status, _, loaded = proc.stderr.strip().splitlines()[-1].partition(" ")
    assert status == "127", proc.stderr
    modules = set(ast.literal_eval(loaded))
    assert "launcher.topology.sysfs" in modules  # it did read the topology
    assert not modules & {"launcher.topology.cpu_identity", "cpuinfo"}

