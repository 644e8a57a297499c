"""The documented JSON contracts of ``affrun plan --json`` and ``affrun topology --json``, through click's
CliRunner and through a real ``affrun`` process, and the one-line errors with exit status 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from launcher.cli import cli
from tests import cli_contract
from tests.cli_contract import GPU_KEYS, TOPOLOGY_KEYS, check_plan_contract, check_types

root = cli_contract.root  # the module-scoped fixture shared with the system half


def clean_env(**extra: str) -> dict[str, str | None]:
    """CliRunner env: drop the caller's OpenMP/BLAS/GPU variables so the plan depends only on the test."""
    prefixes = ("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "AFFRUN_", "BLIS_", "NUMEXPR_", "OPENCV_FOR_THREADS",
                "RAYON_", "NCCL_PROXY")
    names = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(prefixes) or k in names}
    env.update(extra)
    return env


def invoke(args: list[str], **env: str) -> Result:
    return CliRunner().invoke(cli, args, env=clean_env(**env), catch_exceptions=False)


# ---------------------------------------------------------------------------------------------- plan --json
def test_plan_json_contract(root: str) -> None:
    result = invoke(["plan", "--fsroot", root, "--json", "--loader-cores", "1"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    check_plan_contract(data)
    # Default rank count: one per visible GPU; rank i uses GPU i, 2 ranks per node, 4 cores each, 1 for loaders.
    assert [(r["gpu"], r["numa_nodes"]) for r in data["ranks"]] == [(0, [0]), (1, [0]), (2, [1]), (3, [1])]
    r0 = data["ranks"][0]
    assert r0["cpus"] == [0, 1, 2, 3, 16, 17, 18, 19]
    assert r0["loader_cpus"] == [3, 19]
    assert r0["env"]["OMP_NUM_THREADS"] == "3"
    # the main thread's place holds the whole rank (workers inherit the loader core), the other threads the compute CPUs
    assert r0["env"]["OMP_PLACES"] == "{0,1,2,3,16,17,18,19},{0:3,16:3},{0:3,16:3}"
    assert r0["env"]["AFFRUN_GPU_PCI"] == r0["gpu_pci"] == "0000:18:00.0"
    assert r0["mem_policy"] == "preferred"  # two nodes with CPUs: auto means preferred
    assert data["mode"] == "exclusive" and data["gpu_order"] == "rank" and data["smt"] is False


def test_no_gpu_plans_one_rank_by_default(root: str) -> None:
    # --no-gpu plans a CPU-only job: the default rank count is then 1 (as affrun exec and run count), not one per GPU.
    result = invoke(["plan", "--fsroot", root, "--json", "--no-gpu"])
    assert result.exit_code == 0, result.output
    ranks = json.loads(result.stdout)["ranks"]
    assert len(ranks) == 1 and ranks[0]["gpu"] is None


def test_plan_json_and_table_say_where_spilled_cores_come_from(root: str) -> None:
    # 2 ranks: GPUs 0 and 1 are on node 0 (4 + 4 cores); node 1 hosts no rank, so its cores are cut 4 + 4 as
    # loader cores: rank 0 also gets 8-11 (+24-27) from node 1.
    result = invoke(["plan", "--fsroot", root, "--json", "--nproc-per-node", "2"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    check_plan_contract(data)
    r0 = data["ranks"][0]
    assert data["spill"] == "loader"
    assert (r0["spill_cpus"], r0["spill_nodes"], r0["loader_cpus"]) == ([8, 9, 10, 11, 24, 25, 26, 27], [1],
                                                                          [8, 9, 10, 11, 24, 25, 26, 27])
    assert r0["env"]["OMP_NUM_THREADS"] == "4" and r0["env"]["AFFRUN_LOADER_CPUS"] == "8-11,24-27"
    table = invoke(["plan", "--fsroot", root, "--nproc-per-node", "2"]).stdout.splitlines()
    assert table[0].split()[:4] == ["rank", "cpus", "loader", "spill"]
    assert table[1].split()[:5] == ["0", "0-3,8-11,16-19,24-27", "8-11,24-27", "8-11,24-27", "(node"]
    assert "spill loader" in table[3]
    none = json.loads(invoke(["plan", "--fsroot", root, "--json", "--nproc-per-node", "2", "--spill", "none"]).stdout)
    assert none["spill"] == "none" and none["ranks"][0]["spill_cpus"] == [] and none["ranks"][0]["cpus"] == [
        0, 1, 2, 3, 16, 17, 18, 19]


def test_plan_json_smt_counts_hardware_threads(root: str) -> None:
    result = invoke(["plan", "--fsroot", root, "--json", "--smt", "--nproc-per-node", "2", "--no-gpu"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    check_plan_contract(data, smt=True)
    assert [r["env"]["OMP_NUM_THREADS"] for r in data["ranks"]] == ["16", "16"]
    assert [r["gpu"] for r in data["ranks"]] == [None, None]


@pytest.mark.parametrize(
    "visible",
    ["2,0", "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd,GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"],
    ids=["indices", "uuids"],
)
def test_gpu_is_the_visible_index(root: str, visible: str) -> None:
    # CUDA_VISIBLE_DEVICES=2,0: visible GPU 0 is physical GPU 2 (bus 9a, node 1), visible 1 is physical 0.
    result = invoke(["plan", "--fsroot", root, "--json"], CUDA_VISIBLE_DEVICES=visible)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    check_plan_contract(data)
    assert [(r["gpu"], r["gpu_pci"], r["numa_nodes"]) for r in data["ranks"]] == [
        (0, "0000:9a:00.0", [1]),
        (1, "0000:18:00.0", [0]),
    ]
    assert [r["env"]["AFFRUN_GPU"] for r in data["ranks"]] == ["0", "1"]
    topo = json.loads(invoke(["topology", "--fsroot", root, "--json"], CUDA_VISIBLE_DEVICES=visible).stdout)
    assert [(g["index"], g["physical_index"], g["pci"]) for g in topo["gpus"]] == [
        (0, 2, "0000:9a:00.0"),
        (1, 0, "0000:18:00.0"),
    ]


def test_plan_json_reports_user_values(root: str) -> None:
    result = invoke(
        ["plan", "--fsroot", root, "--json", "--nproc-per-node", "1"],
        KMP_AFFINITY="disabled",
        OMP_NUM_THREADS="2",
    )
    data = json.loads(result.stdout)
    (rank,) = data["ranks"]
    assert rank["env"]["KMP_AFFINITY"] == "granularity=fine"
    assert rank["env"]["OMP_NUM_THREADS"] == "2"  # safe: fewer threads than cores, kept
    assert any(n.startswith("KMP_AFFINITY=disabled replaced") for n in rank["notes"])
    assert any(n.startswith("keeping OMP_NUM_THREADS=2") for n in rank["notes"])


# ---------------------------------------------------------------------------------------------- topology --json
def test_topology_json_contract(root: str) -> None:
    result = invoke(["topology", "--fsroot", root, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    check_types(data, TOPOLOGY_KEYS, "topology")
    assert data["packages"] == 2
    assert [n["id"] for n in data["numa_nodes"]] == [0, 1, 2]
    assert data["numa_nodes"][2]["cpus"] == []  # CPU-less nodes are listed
    for node in data["numa_nodes"]:
        assert isinstance(node["id"], int) and isinstance(node["cpus"], list) and isinstance(node["distances"], dict)
        assert all(isinstance(k, str) and isinstance(v, int) for k, v in node["distances"].items())
    assert data["cpus"] == list(range(32))
    assert data["cores"][0] == [0, 16] and len(data["cores"]) == 16
    assert len(data["gpus"]) == 4
    for gpu in data["gpus"]:
        check_types(gpu, GPU_KEYS, f"gpu {gpu['index']}")
        assert gpu["vendor"] in ("nvidia", "amd", "intel")
    assert [g["numa_node"] for g in data["gpus"]] == [0, 0, 1, 1]


def test_topology_cpus_narrows_the_allowed_set(root: str) -> None:
    data = json.loads(invoke(["topology", "--fsroot", root, "--json", "--cpus", "0-3,16-19"]).stdout)
    assert data["cpus"] == [0, 1, 2, 3, 16, 17, 18, 19]
    assert data["cores"] == [[0, 16], [1, 17], [2, 18], [3, 19]]
    assert data["numa_nodes"][1]["cpus"] == []


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nproc-per-node", "17"], "17 ranks but only 16 whole core(s) are available"),
        (["--nproc-per-node", "2", "--gpus", "0,9"], "GPU 9 does not exist: 4 GPU(s) are visible"),
        (["--nproc-per-node", "2", "--gpus", "0,x"], "--gpus '0,x': expected visible GPU indices"),
        (["--nproc-per-node", "2", "--map", "0-3;;"], "a rank has an empty cpu list"),
        (["--nproc-per-node", "2", "--map", "0-3"], "--map gives 1 CPU list(s) for 2 ranks"),
        (["--mode", "map"], "--mode map needs --map"),
        (["--mode", "numa", "--map", "0;1;2;3"], "--mode numa would ignore"),
        (["--reserve", "zero"], "--reserve 'zero': not a cpu list"),
        (["--cpus", "99"], "--cpus 99: none of these CPUs is allowed here"),
        (["--loader-cores", "8"], "--loader-cores 8 leaves rank 0 no compute core"),
    ],
)
def test_errors_are_one_line_with_exit_2(root: str, args: list[str], message: str) -> None:
    result = invoke(["plan", "--fsroot", root, "--json", *args])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("affrun: error: ") and message in lines[0], lines[0]


def test_missing_fsroot_is_an_error(tmp_path: Path) -> None:
    result = invoke(["topology", "--fsroot", str(tmp_path / "nowhere"), "--json"])
    assert result.exit_code == 2
    assert result.stderr.startswith("affrun: error: ") and len(result.stderr.splitlines()) == 1


# ---------------------------------------------------------------------------------------------- a real process


def test_plan_table_says_what_each_mode_shares(root: str) -> None:
    exclusive = invoke(["plan", "--fsroot", root])
    assert exclusive.exit_code == 0, exclusive.output
    rank0 = exclusive.stdout.splitlines()[1]
    assert "4 of node 0's 8 cores" in rank0 and "shared" not in rank0, exclusive.stdout
    numa = invoke(["plan", "--fsroot", root, "--mode", "numa"])
    assert "whole node 0, shared by 2 rank(s)" in numa.stdout.splitlines()[1], numa.stdout
