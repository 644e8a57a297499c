"""The JSON contract of affrun plan/topology and the two-node, four-GPU fake machine it is checked on."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakesys import FakeGPU, FakeMachine, uniform, write_tree

RANK_KEYS = {
    "local_rank": int,
    "cpus": list,
    "compute_cores": list,
    "loader_cpus": list,
    "gpu": (int, type(None)),
    "gpu_pci": (str, type(None)),
    "numa_nodes": list,
    "mem_nodes": list,
    "threads": int,
    "shared": bool,
    "reasons": list,
    "warnings": list,
    "env": dict,
    "unset": list,
    "notes": list,
    "mem_policy": str,
    "main_cpus": list,
    "thread_plan": dict,
}

# A rank's thread plan (launcher.plan.threads.ThreadPlan.to_dict): each home, the pools, the workers.
HOME_KEYS = {"role": str, "cpus": str, "threads": int, "pinned": bool, "why": str}
THREAD_PLAN_KEYS = {"local_rank": int, "main": dict, "omp": dict, "interop": dict, "pin_memory": dict,
                    "nccl_proxy": dict, "pools": dict, "workers": list}


PLAN_KEYS = {"mode": str, "smt": bool, "gpu_order": str, "ranks": list, "warnings": list}


TOPOLOGY_KEYS = {
    "packages": int,
    "numa_nodes": list,
    "cores": list,
    "cpus": list,
    "gpus": list,
    "l3_groups": list,
    "online": str,
    "offline": str,
    "source": str,
    "warnings": list,
    "cpu": (dict, type(None)),
    "priority_cores": dict,
}


GPU_KEYS = {
    "index": int,
    "physical_index": int,
    "pci": str,
    "vendor": str,
    "numa_node": (int, type(None)),
    "cpus": list,
    "uuid": (str, type(None)),
}


def machine() -> FakeMachine:
    """2 sockets x 8 cores, SMT2 (siblings c and c+16), node 0 = 0-7,16-23, node 1 = 8-15,24-31; 4 NVIDIA GPUs,
    0 and 1 on node 0, 2 and 3 on node 1; plus a CPU-less node 2 (HBM-like)."""
    m = uniform(packages=2, cores_per_package=8, threads=2)
    m.cpuless_nodes = [2]
    m.gpus = [
        FakeGPU(pci=f"0000:{bus}:00.0", numa_node=i // 2, uuid=f"GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd")
        for i, bus in enumerate(["18", "2a", "9a", "ab"])
    ]
    return m


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_tree(tmp_path_factory.mktemp("cli") / "root", machine()))


def check_types(obj: dict[str, Any], keys: dict[str, Any], where: str) -> None:
    missing = set(keys) - set(obj)
    assert not missing, f"{where}: missing keys {sorted(missing)}"
    for key, kind in keys.items():
        assert isinstance(obj[key], kind), f"{where}.{key} is {type(obj[key]).__name__}"
        if kind is int:
            assert not isinstance(obj[key], bool), f"{where}.{key} is a bool"


def check_plan_contract(data: dict[str, Any], smt: bool = False) -> None:
    check_types(data, PLAN_KEYS, "plan")
    assert all(isinstance(w, str) for w in data["warnings"])
    for rank in data["ranks"]:
        where = f"rank {rank['local_rank']}"
        check_types(rank, RANK_KEYS, where)
        assert all(isinstance(c, int) for c in rank["cpus"])
        assert set(rank["loader_cpus"]) <= set(rank["cpus"]), where
        compute = {p for core in rank["compute_cores"] for p in core}
        assert compute | set(rank["loader_cpus"]) == set(rank["cpus"]), where
        units = len(compute) if smt else len(rank["compute_cores"])
        assert rank["threads"] == units, where
        assert rank["env"]["OMP_NUM_THREADS"] == str(units), where
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in rank["env"].items()), where
        assert all(isinstance(n, str) for n in rank["notes"] + rank["reasons"] + rank["unset"]), where
        threads = rank["thread_plan"]
        check_types(threads, THREAD_PLAN_KEYS, f"{where}.thread_plan")
        for role in ("main", "omp", "interop", "pin_memory", "nccl_proxy"):
            check_types(threads[role], HOME_KEYS, f"{where}.thread_plan.{role}")
        assert all(isinstance(v, int) and v >= 1 for v in threads["pools"].values()), where
        assert rank["main_cpus"] == [] or set(rank["main_cpus"]) in [set(c) for c in rank["compute_cores"]], where

