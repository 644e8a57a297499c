"""``affrun sbatch`` without a cluster: rendering, quoting (checked by running the script with real bash),
golden scripts, errors, Slurm step facts and the GPU mapping inside a Slurm step.

The cluster tests are in ``test_slurm_cluster.py``.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

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
from launcher.options.record import Options
from launcher.slurm.script import SbatchSpec, builtin_template, render, template_variables
from launcher.topology.gpus import resolve_visible
from launcher.topology.model import GPU
from tests.sbatch_script import GOLDEN

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------- quoting


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
        options=Options(loader_cores=2, mem_policy="preferred"),
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


# ---------------------------------------------------------------------------- templates


def test_every_template_variable_is_documented() -> None:
    readme = (ROOT / "templates" / "README.md").read_text()
    for name in template_variables(SbatchSpec(command=("train.py",))):
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


# ---------------------------------------------------------------------------- errors


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
    rank = make_plan(topo, Options(spill="none").request(1)).ranks[0]
    assert rank.gpu == 0 and rank.gpu_pci == "0000:b1:00.0"
    assert set(rank.cpus) <= {4, 5, 6, 7}
    # By default node 0, which hosts no rank, adds its cores as loader cores; compute stays by GPU 1.
    rank = make_plan(topo, Options().request(1)).ranks[0]
    assert (rank.gpu_pci, rank.compute_cpus, rank.loader_cpus) == ("0000:b1:00.0", (4, 5, 6, 7), (0, 1, 2, 3))

