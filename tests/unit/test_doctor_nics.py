"""The doctor's network checks (issue 29, part 4) on a DGX H100-like fake tree (tests/fakesys.py ``dgx_like``:
2 packages of 8 cores, node 0 = CPUs 0-7, node 1 = 8-15; GPU i behind its own switch with one compute NIC,
``mlx5_0,3,5,4`` on package 0 and ``mlx5_9,6,11,10`` on package 1; storage NICs ``mlx5_1``, ``mlx5_2`` (down),
``mlx5_7``, ``mlx5_8``), with the answers derived by hand; and the NCCL version and thread analysis of a live
rank on records (the live part runs real processes in tests/system/test_doctor_nccl.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.doctor.diagnose import check_environment
from launcher.doctor.facts import Facts
from launcher.doctor.findings import Finding
from launcher.doctor.nic_checks import parse_nccl_list
from launcher.topology import load_topology
from launcher.topology.model import Topology
from tests.fakesys import dgx_like, write_tree

GPU0 = "0000:1b:00.0"  # GPU 0: node 0, its NIC mlx5_0 behind the same switch


@pytest.fixture(scope="module")
def dgx(tmp_path_factory: pytest.TempPathFactory) -> Topology:
    return load_topology(fsroot=str(write_tree(tmp_path_factory.mktemp("dgx"), dgx_like())), environ={})


def found(topo: Topology, env: dict[str, str], rank_cpus: str = "0-7") -> dict[str, Finding]:
    from launcher.base.cpulist import parse_cpulist

    facts = Facts(rank_cpus=parse_cpulist(rank_cpus), per_rank_mask=True)
    return {f.id: f for f in check_environment(env, topo, facts, host=False)}


def test_nccl_list_syntax() -> None:
    assert parse_nccl_list("mlx5_0:1,mlx5_3") == (False, False, ["mlx5_0", "mlx5_3"])
    assert parse_nccl_list("^=mlx5_1") == (True, True, ["mlx5_1"])
    assert parse_nccl_list("=eth0") == (False, True, ["eth0"])


def test_ib_hca_prefix_lists_what_it_also_selects_and_the_exact_form(dgx: Topology) -> None:
    # mlx5_1 (a storage NIC) is a prefix of mlx5_10 and mlx5_11 (compute NICs of GPUs 7 and 6).
    f = found(dgx, {"NCCL_IB_HCA": "mlx5_1"})["nccl-ib-hca-prefix"]
    assert "mlx5_1 also selects mlx5_10, mlx5_11" in f.message
    assert "NCCL_IB_HCA==mlx5_1" in f.fix and f.env_fix == {"NCCL_IB_HCA": "=mlx5_1"}
    # an exclusion is a prefix match too: ^mlx5_1 drops mlx5_10 and mlx5_11 as well
    f = found(dgx, {"NCCL_IB_HCA": "^mlx5_1:1"})["nccl-ib-hca-prefix"]
    assert "excludes" in f.why and f.env_fix == {"NCCL_IB_HCA": "^=mlx5_1:1"}
    # the exact form, names that are no other device's prefix, and a mere prefix (mlx5: every NIC, as meant)
    for value in ("=mlx5_1", "mlx5_0,mlx5_3", "mlx5"):
        assert "nccl-ib-hca-prefix" not in found(dgx, {"NCCL_IB_HCA": value}), value
    # NCCL_SOCKET_IFNAME is matched against the interfaces (eno1), not the RDMA devices
    assert "nccl-ib-hca-prefix" not in found(dgx, {"NCCL_SOCKET_IFNAME": "mlx5_1"})


def test_nic_far_names_the_nearest(dgx: Topology) -> None:
    # mlx5_3 is GPU 1's NIC: another host bridge on GPU 0's node (numa-node); mlx5_0 shares GPU 0's switch.
    env = {"AFFRUN_GPU_PCI": GPU0, "UCX_NET_DEVICES": "mlx5_3:1"}
    f = found(dgx, env)["nic-far"]
    assert f.message == f"UCX_NET_DEVICES names mlx5_3 (numa-node), but mlx5_0 is nearer to the rank's GPU {GPU0} (switch)"
    assert "nic-far" not in found(dgx, {**env, "UCX_NET_DEVICES": "mlx5_0:1"})
    assert "nic-far" not in found(dgx, {**env, "UCX_NET_DEVICES": "all"})
    # AFFRUN_NIC too, and the GPU by LOCAL_RANK when affrun did not say: local rank 4 -> GPU 4 (package 1)
    f = found(dgx, {"LOCAL_RANK": "4", "AFFRUN_NIC": "mlx5_0:1"}, "8-15")["nic-far"]
    assert "AFFRUN_NIC names mlx5_0 (system), but mlx5_9 is nearer" in f.message


def test_rank_off_its_gpus_node(dgx: Topology) -> None:
    # GPU 0 is on node 0 (CPUs 0-7); a rank on 8-15 has none of them
    f = found(dgx, {"AFFRUN_GPU_PCI": GPU0}, "8-15")["rank-off-gpu-node"]
    assert f.message == f"the rank's CPUs 8-15 hold no CPU of its GPU {GPU0}'s node 0 (CPUs 0-7)"
    assert "rank-off-gpu-node" not in found(dgx, {"AFFRUN_GPU_PCI": GPU0}, "6-9")
    assert "rank-off-gpu-node" not in found(dgx, {}, "8-15")  # no GPU known: nothing to say


def test_doctor_cli_reports_them(dgx: Topology, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from launcher.cli import cli

    root = write_tree(tmp_path / "root", dgx_like())
    env = {"NCCL_IB_HCA": "mlx5_1", "AFFRUN_GPU_PCI": GPU0, "AFFRUN_CPUS": "8-15", "UCX_NET_DEVICES": "mlx5_9:1"}
    result = CliRunner().invoke(cli, ["doctor", "--fsroot", str(root), "--json"], env=env)
    import json

    ids = {f["id"] for f in json.loads(result.output)["findings"]}
    assert {"nccl-ib-hca-prefix", "nic-far", "rank-off-gpu-node"} <= ids, result.output


# ------------------------------------------------------------------------------------------- NCCL in a live rank
def test_nccl_version_from_the_name_or_the_string(tmp_path: Path) -> None:
    from launcher.doctor.nccl_live import nccl_library, nccl_version

    assert nccl_library(["/usr/lib/libc.so.6", "/x/libnccl.so.2.29.3"]) == "/x/libnccl.so.2.29.3"
    assert nccl_version("/x/libnccl.so.2.29.3") == (2, 29, 3)
    lib = tmp_path / "libnccl.so.2"
    lib.write_bytes(b"\0" * 4096 + b"NCCL version 2.21.5+cuda12.4\0" + b"\0" * 100)
    assert nccl_version(str(lib)) == (2, 21, 5)
    lib.write_bytes(b"no version here")
    assert nccl_version(str(lib)) is None
    assert nccl_version(str(tmp_path / "missing.so")) is None
    assert nccl_version(str(tmp_path)) is None  # a directory


def test_nccl_threads_on_records() -> None:
    from launcher.doctor.gpu import GpuReport
    from launcher.doctor.live import JobAudit, ProcessRecord, ThreadRecord
    from launcher.doctor.nccl_live import nccl_findings

    def thread(tid: int, name: str, cpu: int) -> ThreadRecord:
        return ThreadRecord(tid, name, frozenset({cpu}), cpu, {cpu: 10}, 0, 10, 0, 100)

    def rank(environ: dict[str, str], *threads: ThreadRecord) -> tuple[JobAudit, ProcessRecord]:
        p = ProcessRecord(10, 1, "python", ["python"], environ, {t.tid: t for t in threads}, role="rank", rank=0)
        return JobAudit(10, 1.0, 0.1, 10, [p], GpuReport(False, ""), frozenset(range(4))), p

    topo = load_topology(fsroot=str(write_tree(Path(__import__("tempfile").mkdtemp()), dgx_like())), environ={})
    audit, p = rank({"AFFRUN_COMPUTE_CPUS": "0-2", "AFFRUN_LOADER_CPUS": "3"}, thread(10, "python", 0),
                    thread(11, "NCCL Progress 0", 1))
    (f,) = nccl_findings(audit, p, topo)
    assert f.id == "nccl-threads-shared" and "sharing cores of CPUs 1 with the OpenMP team" in f.message
    audit, p = rank({"AFFRUN_COMPUTE_CPUS": "0-1", "AFFRUN_COMM_CPUS": "2", "NCCL_PROXY_CPUSET": "2"},
                    thread(10, "python", 0), thread(11, "NCCL Service 0", 2))
    out = nccl_findings(audit, p, topo, (2, 30, 0), "/x/libnccl.so.2")
    assert [x.id for x in out] == ["nccl-loaded", "nccl-threads"]
    assert out[0].message == "NCCL 2.30.0 is loaded (/x/libnccl.so.2)"
    assert [x.id for x in nccl_findings(audit, p, topo, (2, 29, 2), "/x/l")][:2] == ["nccl-loaded", "nccl-mask-leak"]
    assert "nccl-mask-leak" not in {x.id for x in nccl_findings(audit, p, topo, (2, 29, 8), "/x/l")}


def test_comm_and_loader_cpus_are_not_the_teams(dgx: Topology) -> None:
    # affrun exec --comm-cores 1 on CPUs 0-1: OMP_NUM_THREADS=1 is the team's one core, not "1 of 2 cores"
    env = {"OMP_NUM_THREADS": "1", "AFFRUN_CPUS": "0-1", "AFFRUN_COMM_CPUS": "1"}
    assert "omp-threads-one" not in found(dgx, env, "0-1")
    assert "omp-threads-one" not in found(dgx, {**env, "AFFRUN_COMM_CPUS": "", "AFFRUN_LOADER_CPUS": "1"}, "0-1")
    assert "omp-threads-one" in found(dgx, {"OMP_NUM_THREADS": "1"}, "0-1")
