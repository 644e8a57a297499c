"""``affrun doctor`` without --pid: the environment and machine checks, their JSON contract and exit status.

The checks are pure functions of (environment, topology, facts): most cases state the facts and a machine
written as a fake sysfs tree. The facts themselves are then checked against the real thing: torch's bundled
libgomp is what ``import torch`` loads, the memory-policy probe sees a real seccomp refusal, numactl and srun
are the installed ones.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from launcher.base.slurm_step import parse_version, srun_inherits_cpus_per_task, version_text
from launcher.doctor.diagnose import check_environment
from launcher.doctor.facts import (
    Facts,
    gather_facts,
    numa_binding_source,
    rank_view,
)
from launcher.doctor.findings import CATALOGUE, Finding
from launcher.doctor.main_place import main_thread_place
from launcher.topology.model import Topology
from launcher.topology.sysfs import read_sysfs
from tests.conftest import need
from tests.doctor_run import doctor
from tests.fakesys import FakeGPU, uniform, write_tree
from tests.launch import clean_env

ALL = frozenset(range(64))


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Topology:
    """2 sockets × 16 cores × 2 threads (CPUs 0-63, siblings c and c+32), one NUMA node per socket."""
    return read_sysfs(str(write_tree(tmp_path_factory.mktemp("big"), uniform(2, 16, threads=2))))


def ids(findings: list[Finding]) -> list[str]:
    return [f.id for f in findings]


def by_id(findings: list[Finding], fid: str) -> Finding:
    matches = [f for f in findings if f.id == fid]
    assert len(matches) == 1, f"expected one {fid}, got {ids(findings)}"
    return matches[0]


def facts(cpus: frozenset[int] = ALL, sharing: int = 1, openmp: tuple[str, ...] = ("libgomp",), **kw: object) -> Facts:
    return Facts(rank_cpus=cpus, ranks_sharing=sharing, per_rank_mask=sharing == 1, local_size=sharing,
                 local_size_source="test", openmp=openmp, **kw)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- KMP_AFFINITY
@pytest.mark.parametrize(
    ("value", "expected", "severity"),
    [
        ("disabled", "kmp-affinity-disabled", "error"),
        ("granularity=fine,disabled", "kmp-affinity-disabled", "error"),
        ("", "kmp-affinity-empty", "warning"),
        ("   ", "kmp-affinity-empty", "warning"),
        ("granularity=fine,compactt", "kmp-affinity-malformed", "warning"),
        ("compact,scatter", "kmp-affinity-malformed", "warning"),
        ("granularity=fine,explicit,proclist=[0,1,70]", "kmp-proclist-outside", "error"),
    ],
)
def test_dangerous_kmp_affinity_under_libiomp5(big: Topology, value: str, expected: str, severity: str) -> None:
    found = check_environment({"KMP_AFFINITY": value}, big, facts(openmp=("libiomp5",)), host=False)
    f = by_id(found, expected)
    assert f.severity == severity
    assert f.env_fix == {"KMP_AFFINITY": "granularity=fine"}
    assert "KMP_AFFINITY" in f.message and f.fix and f.why


@pytest.mark.parametrize("value", ["granularity=fine", "none", "granularity=core,compact,1,0", "verbose,scatter",
                                   "granularity=fine,explicit,proclist=[0-3]"])
def test_good_kmp_affinity_is_not_a_problem(big: Topology, value: str) -> None:
    found = check_environment({"KMP_AFFINITY": value, "OMP_NUM_THREADS": "8"}, big,
                              facts(cpus=frozenset(range(8)), openmp=("libiomp5",)), host=False)
    assert not [f for f in found if f.id.startswith("kmp-")]


def test_disabled_mentions_the_fork_abort_of_recent_intel_openmp(big: Topology) -> None:
    new = by_id(check_environment({"KMP_AFFINITY": "disabled"}, big,
                                  facts(openmp=("libiomp5",), intel_openmp_version="2026.2.0"), host=False),
                "kmp-affinity-disabled")
    old = by_id(check_environment({"KMP_AFFINITY": "disabled"}, big,
                                  facts(openmp=("libiomp5",), intel_openmp_version="2024.2.1"), host=False),
                "kmp-affinity-disabled")
    assert "Aborted" in new.why and "2026.2.0" in new.why
    assert "Aborted" not in old.why
    assert "none" in new.fix


def test_kmp_is_ignored_by_libgomp(big: Topology) -> None:
    env = {"KMP_AFFINITY": "granularity=fine,compact", "KMP_BLOCKTIME": "0"}
    found = check_environment(env, big, facts(openmp=("libgomp",)), host=False)
    f = by_id(found, "kmp-ignored-by-libgomp")
    assert f.severity == "warning"
    assert "KMP_AFFINITY=granularity=fine,compact" in f.message and "KMP_BLOCKTIME=0" in f.message
    assert "OMP_WAIT_POLICY=PASSIVE" in f.fix
    # libgomp alone: the value cannot bind anything, so no kmp-affinity-* and no collapse risk from it
    assert ids(found) == ["kmp-ignored-by-libgomp"]
    # affrun's own value (a granularity, no type) is not reported
    assert check_environment({"KMP_AFFINITY": "granularity=fine"}, big, facts(), host=False) == []
    # with the OMP_* counterparts set, the ignored value is only informational
    covered = {"KMP_AFFINITY": "compact", "OMP_PROC_BIND": "close", "OMP_PLACES": "{0:64}"}
    assert by_id(check_environment(covered, big, facts(), host=False), "kmp-ignored-by-libgomp").severity == "info"


def test_kmp_disabled_under_libgomp_alone_says_what_still_reads_it(big: Topology) -> None:
    f = by_id(check_environment({"KMP_AFFINITY": "disabled"}, big, facts(openmp=("libgomp",)), host=False),
              "kmp-ignored-by-libgomp")
    for reader in ("numpy or MKL builds linked to libiomp5", "conda", "intel-openmp", "LLVM libomp"):
        assert reader in f.why, f.why


def test_kmp_is_judged_when_libiomp5_is_only_installed(big: Topology) -> None:
    """torch uses libgomp, but intel-openmp is installed: MKL programs read KMP_AFFINITY, torch ignores it."""
    found = check_environment({"KMP_AFFINITY": "disabled"}, big,
                              facts(openmp=("libgomp",), other_openmp=("libiomp5",)), host=False)
    assert sorted(ids(found)) == ["kmp-affinity-disabled", "kmp-ignored-by-libgomp"]
    assert "installed" in by_id(found, "kmp-affinity-disabled").message


# ----------------------------------------------------------------------------- thread counts
def test_ranks_times_threads_oversubscribe(big: Topology) -> None:
    f = by_id(check_environment({"OMP_NUM_THREADS": "16"}, big, facts(sharing=8), host=False), "omp-oversubscribed")
    assert f.severity == "error"
    assert "16 × 8 ranks = 128 threads on 64 CPUs" in f.message
    assert f.env_fix == {"OMP_NUM_THREADS": "4"}  # 32 cores / 8 ranks


def test_threads_beyond_cores_but_within_hardware_threads_is_a_warning(big: Topology) -> None:
    f = by_id(check_environment({"OMP_NUM_THREADS": "8"}, big, facts(sharing=8), host=False), "omp-oversubscribed")
    assert f.severity == "warning" and "32 cores (64 hardware threads)" in f.message
    assert check_environment({"OMP_NUM_THREADS": "4"}, big, facts(sharing=8), host=False) == []


def test_per_rank_thread_count_against_the_rank_mask(big: Topology) -> None:
    rank = frozenset([*range(4), *range(32, 36)])  # 4 cores, 8 PUs
    assert by_id(check_environment({"MKL_NUM_THREADS": "12"}, big, facts(cpus=rank), host=False),
                 "omp-oversubscribed").severity == "error"
    assert check_environment({"OMP_NUM_THREADS": "4"}, big, facts(cpus=rank), host=False) == []


def test_unset_threads_with_shared_cpus(big: Topology) -> None:
    f = by_id(check_environment({}, big, facts(sharing=4), host=False), "omp-threads-unset")
    assert "64 threads, 256 in all" in f.message
    assert f.env_fix == {"OMP_NUM_THREADS": "8"}
    assert check_environment({}, big, facts(sharing=1), host=False) == []


def test_one_thread_on_a_big_rank(big: Topology) -> None:
    torchrun = {"OMP_NUM_THREADS": "1", "TORCHELASTIC_RUN_ID": "x"}
    f = by_id(check_environment(torchrun, big, facts(sharing=4), host=False), "omp-threads-one")
    assert f.severity == "warning" and "owns 8 cores" in f.message and "torchrun" in f.message
    small = frozenset([0, 1, 32, 33])
    assert by_id(check_environment({"OMP_NUM_THREADS": "1"}, big, facts(cpus=small), host=False),
                 "omp-threads-one").severity == "info"
    assert check_environment({"OMP_NUM_THREADS": "1"}, big, facts(cpus=frozenset([0, 32])), host=False) == []


@pytest.mark.parametrize("value", ["0", "-2", "four", ""])
def test_invalid_thread_count(big: Topology, value: str) -> None:
    f = by_id(check_environment({"OMP_NUM_THREADS": value}, big, facts(), host=False), "omp-threads-invalid")
    assert f.env_fix == {"OMP_NUM_THREADS": "32"}


# ----------------------------------------------------------------------------- binding variables, collapse risk
@pytest.mark.parametrize(
    ("env", "openmp", "place"),
    [
        ({"OMP_PLACES": "cores"}, ("libgomp",), {0, 32}),
        ({"OMP_PLACES": "threads", "OMP_PROC_BIND": "close"}, ("libgomp",), {0}),
        ({"OMP_PLACES": "sockets"}, ("libgomp",), set(range(16)) | set(range(32, 48))),
        ({"OMP_PROC_BIND": "true"}, ("libgomp",), {0}),
        ({"OMP_PROC_BIND": "spread"}, ("libiomp5",), {0, 32}),
        ({"GOMP_CPU_AFFINITY": "4-7"}, ("libgomp",), {4}),
        ({"OMP_PLACES": "{9},{10}"}, ("libgomp",), {9}),
        ({"OMP_PLACES": "{4:4}:2:4"}, ("libgomp",), {4, 5, 6, 7}),  # place intervals
        ({"OMP_PLACES": "{70},{2:2:2}"}, ("libgomp",), {2, 4}),  # a place outside the mask is dropped
        ({"KMP_AFFINITY": "granularity=fine,compact"}, ("libiomp5",), {0}),
        ({"KMP_AFFINITY": "compact"}, ("libiomp5",), {0, 32}),  # granularity defaults to core
        ({"KMP_AFFINITY": "explicit,proclist=[5,6]"}, ("libiomp5",), {5}),
        ({"KMP_AFFINITY": "granularity=fine,logical"}, ("libiomp5",), {0}),  # old names of compact still bind
        ({"KMP_AFFINITY": "physical"}, ("libiomp5",), {0, 32}),
    ],
)
def test_main_thread_place(big: Topology, env: dict[str, str], openmp: tuple[str, ...], place: set[int]) -> None:
    found = main_thread_place(env, ALL, big, facts(openmp=openmp))
    assert found is not None and found[1] == frozenset(place)


@pytest.mark.parametrize(
    ("env", "openmp"),
    [
        ({}, ("libgomp",)),
        ({"OMP_PROC_BIND": "false", "OMP_PLACES": "cores"}, ("libgomp",)),
        ({"KMP_AFFINITY": "compact"}, ("libgomp",)),  # libgomp ignores it
        ({"KMP_AFFINITY": "none", "OMP_PLACES": "cores"}, ("libiomp5",)),  # the KMP type wins in libiomp5
        ({"OMP_PLACES": "{0:64}"}, ("libgomp",)),  # one place holding the whole mask
        ({"OMP_PLACES": "{0-63}"}, ("libgomp",)),  # not OpenMP: libgomp drops it and, without OMP_PROC_BIND, binds nothing
    ],
)
def test_no_main_thread_binding(big: Topology, env: dict[str, str], openmp: tuple[str, ...]) -> None:
    found = main_thread_place(env, ALL, big, facts(openmp=openmp))
    assert found is None or found[1] == ALL


def test_invalid_places_with_proc_bind_pin_the_main_thread(big: Topology) -> None:
    """libgomp rejects OMP_PLACES={0-63} and, with OMP_PROC_BIND set, binds one thread per CPU from the first."""
    found = main_thread_place({"OMP_PLACES": "{0-63}", "OMP_PROC_BIND": "close"}, ALL, big, facts(openmp=("libgomp",)))
    assert found is not None and found[1] == frozenset([min(ALL)])


def test_collapse_risk_is_an_error_when_ranks_share_the_mask(big: Topology) -> None:
    env = {"OMP_PLACES": "cores", "OMP_PROC_BIND": "close", "OMP_NUM_THREADS": "4"}
    shared = by_id(check_environment(env, big, facts(sharing=8), host=False), "collapse-risk")
    assert shared.severity == "error" and "all 8 local ranks pin their main thread to CPU 0,32" in shared.message
    assert shared.env_fix == {"OMP_PLACES": None, "OMP_PROC_BIND": None}
    alone = by_id(check_environment(env, big, facts(sharing=1), host=False), "collapse-risk")
    assert alone.severity == "warning" and "worker_init_fn" in alone.fix


@pytest.mark.parametrize(("openmp", "when", "children"), [
    (("libgomp", "libiomp5"), "at its first parallel region", "libiomp5 gives a fork()ed child"),
    (("libiomp5",), "at its first parallel region", "libiomp5 gives a fork()ed child"),
    (("libgomp", "libomp"), "under torch: at `import torch`", "forked DataLoader workers too"),
])
def test_collapse_risk_says_what_the_runtime_that_reads_kmp_affinity_does(
        big: Topology, openmp: tuple[str, ...], when: str, children: str) -> None:
    """Measured with torch 2.13 (docs/design.md §3): libiomp5 binds at its first parallel region and gives forked
    children their full mask back; LLVM libomp binds at import torch and every child keeps the one CPU."""
    env = {"KMP_AFFINITY": "granularity=fine,compact", "OMP_NUM_THREADS": "4"}
    f = by_id(check_environment(env, big, facts(openmp=openmp), host=False), "collapse-risk")
    assert when in f.message and children in f.why
    assert "spawn or forkserver workers" in f.why if "libiomp5" in openmp else "fork()ed" not in f.why
    if "libgomp" in openmp:  # OMP_PLACES: torch's libgomp binds at its load, before the other runtime
        gomp = by_id(check_environment({"OMP_PLACES": "cores", "OMP_NUM_THREADS": "4"}, big, facts(openmp=openmp),
                                       host=False), "collapse-risk")
        assert "at `import torch`" in gomp.message and "(libgomp)" in gomp.why


def test_affrun_rank_binding_has_no_collapse_risk(big: Topology) -> None:
    """affrun's --omp-bind rank: one place holding the rank's CPUs; --omp-bind core is informational."""
    rank = frozenset([0, 1, 32, 33])
    env = {"AFFRUN_CPUS": "0-1,32-33", "OMP_PLACES": "{0,1,32,33}", "OMP_PROC_BIND": "close",
           "KMP_AFFINITY": "granularity=fine", "OMP_NUM_THREADS": "2"}
    assert check_environment(env, big, facts(cpus=rank), host=False) == []
    core = {**env, "OMP_PLACES": "{0,32},{1,33}", "AFFRUN_OMP_BIND": "core"}
    f = by_id(check_environment(core, big, facts(cpus=rank), host=False), "collapse-risk")
    assert f.severity == "info" and f.env_fix == {}


def test_places_outside_the_mask_and_malformed(big: Topology) -> None:
    rank = frozenset(range(4))
    found = check_environment({"OMP_PLACES": "{0},{7}", "OMP_PROC_BIND": "closer", "OMP_NUM_THREADS": "2"}, big,
                              facts(cpus=rank), host=False)
    assert by_id(found, "places-outside-mask").env_fix == {"OMP_PLACES": None}
    assert by_id(found, "omp-binding-malformed").env_fix == {"OMP_PROC_BIND": None}


def test_two_openmp_runtimes(big: Topology) -> None:
    found = check_environment({}, big, facts(openmp=("libgomp", "libiomp5")), host=False)
    assert ids(found) == ["openmp-runtimes-mixed"]


# ----------------------------------------------------------------------------- host checks
def test_double_binding(big: Topology) -> None:
    source = numa_binding_source({"PET_NUMA_BINDING": "node"}, [])
    f = by_id(check_environment({"PET_NUMA_BINDING": "node"}, big, facts(numa_binding=source)), "double-binding")
    assert f.severity == "error" and "PET_NUMA_BINDING=node" in f.message
    chain = [(10, "bash"), (9, "/usr/bin/python3 /usr/bin/torchrun --numa-binding=exclusive --nproc-per-node 8 t.py")]
    assert "parent process 9" in (numa_binding_source({}, chain) or "")
    assert numa_binding_source({}, [(9, "/usr/bin/python3 /usr/bin/torchrun --nproc-per-node 8 t.py")]) is None


@pytest.mark.parametrize(("version", "affected"), [("21.08.8", False), ("22.05.0", True), ("22.05.8", True),
                                                   ("23.02.4", True), ("23.02.5", False), ("24.11.1", False)])
def test_slurm_versions_that_drop_cpus_per_task(version: str, affected: bool) -> None:
    parsed = parse_version(f"slurm {version}\n")
    assert parsed is not None and version_text(parsed) == version
    assert srun_inherits_cpus_per_task(parsed) is not affected


def test_srun_cpus_per_task(big: Topology) -> None:
    env = {"SLURM_CPUS_PER_TASK": "16"}
    f = by_id(check_environment(env, big, facts(slurm_version=(22, 5, 8))), "srun-cpus-per-task")
    assert f.env_fix == {"SRUN_CPUS_PER_TASK": "16"}
    assert "on Slurm 22.05.8" in f.message
    assert check_environment({**env, "SRUN_CPUS_PER_TASK": "16"}, big, facts(slurm_version=(22, 5, 8))) == []
    assert check_environment(env, big, facts(slurm_version=(23, 11, 0))) == []


def test_numactl_and_membind_by_numa_node_count(big: Topology, tmp_path: Path) -> None:
    one_node = read_sysfs(str(write_tree(tmp_path, uniform(1, 4))))
    probed = facts(host_probed=True, numactl=None, membind_error="set_mempolicy(MPOL_BIND) failed: EPERM")
    assert {f.id: f.severity for f in check_environment({}, big, probed)} == {
        "numactl-missing": "warning", "membind-blocked": "warning"}
    small = facts(cpus=frozenset(range(4)), host_probed=True, numactl=None, membind_error="EPERM")
    assert {f.id: f.severity for f in check_environment({}, one_node, small)} == {
        "numactl-missing": "info", "membind-blocked": "info"}


# ----------------------------------------------------------------------------- facts checked against the real thing
def test_rank_view() -> None:
    machine = frozenset(range(8))
    assert rank_view({"AFFRUN_CPUS": "2-3"}, frozenset({2, 3}), machine, 4, True) == (frozenset({2, 3}), 1, True)
    assert rank_view({}, frozenset({4, 5}), machine, 4, True) == (frozenset({4, 5}), 1, True)  # srun --cpu-bind
    assert rank_view({}, machine, machine, 4, True) == (machine, 4, False)  # plain torchrun rank
    assert rank_view({}, machine, machine, 4, False) == (machine, 4, False)  # before launch


def test_gathered_facts_of_this_machine(tmp_path: Path) -> None:
    from launcher.topology import load_topology

    topo = load_topology()
    f = gather_facts({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "PATH": os.environ["PATH"]}, topo, live=True)
    assert f.local_size == 2 and f.ranks_sharing == 2 and f.rank_cpus == frozenset(os.sched_getaffinity(0))
    assert f.host_probed and f.numactl == shutil.which("numactl")


def test_fail_on_levels() -> None:
    # omp-threads-one on a 2-core rank is "info": it fails only --fail-on info
    env = {**clean_env(), "OMP_NUM_THREADS": "1"}
    cpus = len(os.sched_getaffinity(0))
    need(cpus >= 2, "needs 2 CPUs")
    info = [f for f in json.loads(doctor("--json", env=env)[1])["findings"] if f["id"] == "omp-threads-one"]
    assert [f["severity"] for f in info] == ["info" if cpus < 4 else "warning"]
    assert doctor("--fail-on", "info", env=env)[0] == 1
    assert doctor("--fail-on", "error", env=env)[0] == 0


def test_usage_errors_exit_2() -> None:
    assert doctor("--duration", "2")[0] == 2
    assert doctor("--pid", "0")[0] == 2
    assert doctor("--fail-on", "fatal")[0] == 2
    code, out = doctor("--pid", str(2**22 + 12345))
    assert code == 2 and out.strip().endswith("no such process")
    code, out = doctor("--fsroot", "/nonexistent-root")
    assert code == 2 and "affrun: error:" in out


def test_ids_lists_the_catalogue() -> None:
    code, out = doctor("--ids")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == list(CATALOGUE)


def test_gpus_without_numa_node_and_mixed_models(tmp_path: Path) -> None:
    m = uniform(2, 4)
    m.gpus = [FakeGPU(pci="0000:17:00.0", numa_node=None), FakeGPU(pci="0000:65:00.0", numa_node=None)]
    root = write_tree(tmp_path, m)
    for pci, device in (("0000:17:00.0", "0x2330"), ("0000:65:00.0", "0x20b0")):  # H100 and A100
        (root / "sys/bus/pci/devices" / pci / "device").write_text(device + "\n")
    env = clean_env()
    data = json.loads(doctor("--fsroot", str(root), "--json", env=env)[1])
    found = {f["id"]: f for f in data["findings"]}
    assert found["gpu-numa-unknown"]["severity"] == "warning"
    assert "0x20b0" in found["cuda-device-order"]["message"]
    fixed = json.loads(doctor("--fsroot", str(root), "--json", env={**env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})[1])
    assert "cuda-device-order" not in {f["id"] for f in fixed["findings"]}
    (root / "sys/bus/pci/devices/0000:65:00.0/device").write_text("0x2330\n")  # same model: CUDA order is PCI order
    same = json.loads(doctor("--fsroot", str(root), "--json", env=env)[1])
    assert "cuda-device-order" not in {f["id"] for f in same["findings"]}


