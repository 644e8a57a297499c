"""``affrun exec`` under an inherited plan (``AFFRUN_PLAN``) against its own command line.

Every option of the one option table given explicitly plans the rank here, from the command line alone: the
result is what the same command gives with no parent plan, never the parent's plan with the option dropped. A rank
count from the launcher's variables that is not the inherited plan's is one error line naming both.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.context.local_rank import SOURCES
from launcher.options.table import BINDING_OPTIONS, NPROC_OPTION, OptionSpec
from tests.fakesys import FakeGPU, uniform, write_tree
from tests.launch import affrun_argv, clean_env, run
from tests.run_dry import dry_run

RANK = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``parent``: the machine the inherited plan was made for (4 cores); ``here``: the one exec's options name
    (2 packages of 8 cores with SMT, a GPU on each package), so that no plan of the one is a plan of the other."""
    base = tmp_path_factory.mktemp("inherited")
    here = uniform(packages=2, cores_per_package=8, threads=2)
    here.gpus = [FakeGPU(pci="0000:17:00.0", numa_node=0), FakeGPU(pci="0000:b1:00.0", numa_node=1)]
    paths = {"parent": write_tree(base / "parent", uniform(packages=1, cores_per_package=4)),
             "here": write_tree(base / "here", here)}
    snapshot = base / "here.json"
    run(affrun_argv("topology", "--fsroot", str(paths["here"]), "--save", str(snapshot)), check=True)
    paths["snapshot"] = snapshot
    return paths


def inherited_plan(root: Path, nproc: int = 2) -> str:
    """The ``AFFRUN_PLAN`` a real parent hands down: ``affrun run``'s, read back by a shell it runs."""
    proc = run(affrun_argv("run", "--fsroot", str(root), "--nproc-per-node", str(nproc), "--", "sh", "-c",
                           'printf %s "$AFFRUN_PLAN"'), check=True)
    assert proc.stdout.startswith("{"), proc.stdout[:200]
    return proc.stdout


def values(spec: OptionSpec, trees: dict[str, Path]) -> list[list[str]]:
    """Command-line values for ``spec``, chosen by its kind so that an option added to the table is covered: a
    choice both as a value that is not its default and as its default given explicitly."""
    if spec is NPROC_OPTION:
        return [[spec.flag, "4"], [spec.flag, "2"]]  # another count, and the plan's own
    if spec.is_flag:
        return [[spec.flag]]
    if spec.count:
        return [[spec.flag, "1"]]
    if spec.choices:
        other = next(c for c in spec.choices if c != spec.default)
        return [[spec.flag, other], [spec.flag, str(spec.default)]]
    if spec.kind == "path":
        return [[spec.flag, str(trees["here"] if spec.dest == "fsroot" else trees["snapshot"])]]
    by_kind = {"cpus": "0-5", "gpus": "1,0", "cpu_map": "0-3;8-11"}
    assert spec.kind in by_kind, f"no test value for the option table's kind {spec.kind!r} ({spec.flag})"
    return [[spec.flag, by_kind[spec.kind]]]


CASES = [(spec.flag, i) for spec in (*BINDING_OPTIONS, NPROC_OPTION)
         for i in range(2 if spec.choices or spec is NPROC_OPTION else 1)]


def exec_dry(args: list[str], env: dict[str, str]) -> tuple[int, list[str], str]:
    proc = dry_run("exec", *args, env=env, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if not ln.startswith("note: planned here")]
    return proc.returncode, lines, proc.stdout + proc.stderr


@pytest.mark.parametrize(("flag", "which"), CASES, ids=[f"{f}-{i}" for f, i in CASES])
def test_every_table_option_plans_here_as_without_a_parent(trees: dict[str, Path], flag: str, which: int) -> None:
    spec = next(s for s in (*BINDING_OPTIONS, NPROC_OPTION) if s.flag == flag)
    option = values(spec, trees)[which]
    source = [] if spec.group == "topology" and spec.kind == "path" else ["--fsroot", str(trees["here"])]
    args = [*source, *option]
    parent = inherited_plan(trees["parent"])
    alone = exec_dry(args, RANK)
    under = exec_dry(args, {**RANK, "AFFRUN_PLAN": parent})
    assert alone[0] == 0, alone[2]
    assert under[:2] == alone[:2], f"{args}\nwithout a parent:\n{alone[2]}\nunder the parent's plan:\n{under[2]}"
    assert f"note: planned here for {', '.join(x for x in args if x.startswith('--'))}:" in under[2], under[2]


def test_a_tuned_file_plans_here_as_without_a_parent(trees: dict[str, Path], tmp_path: Path) -> None:
    """``--tuned FILE`` holds planning options: under an inherited plan it plans here by them, with the note, as
    the same options on the line do (the parent's plan was applied, and the file silently ignored)."""
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text("affrun-tuned: 1\noptions:\n  loader-cores: 1\n")
    args = ["--fsroot", str(trees["here"]), "--tuned", str(tuned)]
    alone = exec_dry(args, RANK)
    under = exec_dry(args, {**RANK, "AFFRUN_PLAN": inherited_plan(trees["parent"])})
    assert alone[0] == 0 and under[:2] == alone[:2], under[2]
    assert "AFFRUN_LOADER_CPUS=" in "\n".join(under[1]) and "note: planned here for --fsroot, --tuned:" in under[2]


def test_no_option_binds_by_the_inherited_plan(trees: dict[str, Path]) -> None:
    parent = inherited_plan(trees["parent"])
    code, lines, text = exec_dry([], {**RANK, "AFFRUN_PLAN": parent})
    assert code == 0 and "AFFRUN_CPUS=2-3" in lines, text  # rank 1 of 4 single-thread cores in 2: CPUs 2-3
    assert "planned here" not in text


def test_the_explicit_cpus_are_the_real_mask_of_the_command() -> None:
    """Not only a dry run: the command runs on the CPU given, not on the inherited plan's."""
    allowed = sorted(os.sched_getaffinity(0))
    parent = run(affrun_argv("run", "--nproc-per-node", "1", "--", "sh", "-c", 'printf %s "$AFFRUN_PLAN"'),
                 check=True).stdout
    env = clean_env(AFFRUN_PLAN=parent, LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    proc = run(affrun_argv("exec", "--cpus", str(allowed[-1]), "--", "grep", "Cpus_allowed_list", "/proc/self/status"),
               env=env, check=True)
    assert parse_cpulist(proc.stdout.split(":", 1)[1].strip()) == frozenset({allowed[-1]}), proc.stdout
    if len(allowed) > 1:  # the parent's one rank had them all
        assert format_cpulist(allowed) != format_cpulist([allowed[-1]])


@pytest.mark.parametrize(("rank_var", "size_var"), [s for s in SOURCES if s[0] != "SLURM_LOCALID"])
@pytest.mark.parametrize("size", [1, 3, 4])
def test_a_rank_count_that_is_not_the_plans_is_named(trees: dict[str, Path], rank_var: str, size_var: str,
                                                      size: int) -> None:
    parent = inherited_plan(trees["parent"])
    env = clean_env(AFFRUN_PLAN=parent, **{rank_var: "0", size_var: str(size)})
    proc = run(affrun_argv("exec", "--", "true"), env=env)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("affrun: error: ") and f"{size_var}={size}" in line and "2 rank(s)" in line, line


def test_a_slurm_task_count_that_is_not_the_plans_is_named(trees: dict[str, Path]) -> None:
    parent = inherited_plan(trees["parent"])
    env = clean_env(AFFRUN_PLAN=parent, SLURM_LOCALID="0", SLURM_STEP_TASKS_PER_NODE="3", SLURM_NODEID="0")
    proc = run(affrun_argv("exec", "--", "true"), env=env)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "SLURM_STEP_TASKS_PER_NODE" in line and "=3" in line and "2 rank(s)" in line, line
