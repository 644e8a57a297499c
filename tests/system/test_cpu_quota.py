"""CPU quotas: cgroup v2 ``cpu.max`` and v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us`` read into the model, the
planner's thread cap, the doctor finding, on fake trees and on this machine's own cgroup hierarchy."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from launcher.doctor.diagnose import check_environment
from launcher.doctor.facts import Facts
from launcher.env.policy import rank_environment
from launcher.options.record import Options
from launcher.plan.planner import make_plan
from launcher.topology import load_topology
from launcher.topology.cgroup import find_cpu_quota
from launcher.topology.model import Topology
from tests.fakesys import FakeGPU, FakeMachine, uniform, write_tree
from tests.launch import affrun, clean_env, run


def dgx_h100() -> FakeMachine:
    """2 x 56 cores, SMT2 (224 CPUs), GPUs 0-3 on node 0 and 4-7 on node 1."""
    m = uniform(packages=2, cores_per_package=56, threads=2)
    m.gpus = [FakeGPU(pci=f"0000:{0x18 + 0x10 * i:02x}:00.0", numa_node=i // 4) for i in range(8)]
    return m


def small() -> FakeMachine:
    """2 x 8 cores, SMT2 (32 CPUs), GPUs 0, 1 on node 0 and 2, 3 on node 1."""
    m = uniform(packages=2, cores_per_package=8, threads=2)
    m.gpus = [FakeGPU(pci=f"0000:{0x18 + 0x10 * i:02x}:00.0", numa_node=i // 2) for i in range(4)]
    return m


def pod(tmp_path: Path, machine: FakeMachine | None = None, **quota: object) -> Topology:
    m = machine or small()
    for key, value in quota.items():
        setattr(m, key, value)
    return load_topology(fsroot=str(write_tree(tmp_path / "root", m)), environ={})


@pytest.fixture(scope="module")
def h100_pod(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DGX H100 tree whose cgroup has an 8-CPU limit (cpu.max 800000 100000), written once."""
    m = dgx_h100()
    m.cpu_max = "800000 100000"
    return write_tree(tmp_path_factory.mktemp("h100") / "root", m)


def omp_threads(topo: Topology, nproc: int) -> list[int]:
    plan = make_plan(topo, Options().request(nproc))
    return [int(rank_environment(r, local_world_size=nproc, user_env={}).set["OMP_NUM_THREADS"]) for r in plan.ranks]


def test_cgroup_v2_cpu_max_caps_threads_to_the_quota(h100_pod: Path) -> None:
    # A Kubernetes pod with an 8-CPU limit on a DGX H100 sees all 224 CPUs in its mask. 8 ranks would start
    # 8 x 14 = 112 OpenMP threads; under the quota each gets 8 // 8 = 1, and the warning gives the figures.
    topo = load_topology(fsroot=str(h100_pod), environ={})
    assert (topo.cpu_quota, topo.cpu_quota_source) == (8.0, "cgroup2 /sys/fs/cgroup/job/cpu.max: 800000 100000")
    assert len(topo.allowed) == 224
    plan = make_plan(topo, Options().request(8))
    assert [r.threads for r in plan.ranks] == [1] * 8
    assert omp_threads(topo, 8) == [1] * 8
    assert (
        "CPU quota of 8 CPUs (cgroup2 /sys/fs/cgroup/job/cpu.max: 800000 100000) is below the 224 allowed CPUs: "
        "threads capped at 1 per rank (8 ranks x 1 = 8, was 112)"
    ) in plan.warnings
    # 2 ranks: 28 compute cores each (56 threads in all) become 4 + 4. The masks are unchanged.
    plan = make_plan(topo, Options().request(2))
    assert [r.threads for r in plan.ranks] == [4, 4]
    assert any("(2 ranks x 4 = 8, was 56)" in w for w in plan.warnings)
    assert len(plan.ranks[0].cpus) == 112


def test_cgroup_v1_cfs_quota(tmp_path: Path) -> None:
    # cgroup v1 (cpu,cpuacct hierarchy): 250000 / 100000 = 2.5 CPUs; 2 ranks (GPUs 0 and 1, 4 + 4 cores of
    # node 0) get 1 thread each (2.5 // 2).
    topo = pod(tmp_path, cfs_quota=("250000", "100000"))
    assert topo.cpu_quota == 2.5
    assert topo.cpu_quota_source == (
        "cgroup /sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us: 250000, cpu.cfs_period_us: 100000"
    )
    assert omp_threads(topo, 2) == [1, 1]
    # More ranks than the quota holds CPUs (4 + 4 + 8 cores): still 1 thread each, and the warning says it does
    # not fit.
    plan = make_plan(topo, Options().request(3))
    assert [r.threads for r in plan.ranks] == [1, 1, 1]
    assert any("(3 ranks x 1 = 3, was 16); even 1 thread per rank exceeds it" in w for w in plan.warnings)


def test_no_limit_or_a_limit_above_the_cpus_changes_nothing(tmp_path: Path) -> None:
    assert pod(tmp_path / "a", cpu_max="max 100000").cpu_quota is None
    assert pod(tmp_path / "b", cfs_quota=("-1", "100000")).cpu_quota is None
    topo = pod(tmp_path / "c", cpu_max="3200000 100000")  # 32 CPUs: as many as the machine has
    assert topo.cpu_quota == 32.0
    plan = make_plan(topo, Options().request(4))
    assert [r.threads for r in plan.ranks] == [4] * 4
    assert not any("CPU quota" in w for w in plan.warnings)


def test_the_tightest_ancestor_wins_and_garbage_is_no_limit(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "root", FakeMachine(cores=[(0,), (1,)], node_of_core=[0, 0], package_of_core=[0, 0],
                                                     cpu_max="max 100000"))
    (root / "sys/fs/cgroup/cpu.max").write_text("150000 100000\n")  # the parent limits the job to 1.5 CPUs
    quota = find_cpu_quota(str(root))
    assert quota is not None and (quota.cpus, quota.source) == (1.5, "cgroup2 /sys/fs/cgroup/cpu.max: 150000 100000")
    for junk in ("", "max", "²00000 100000", "100000 0", "-5 100000", "9" * 40 + " 100000"):
        (root / "sys/fs/cgroup/cpu.max").write_text(junk + "\n")
        assert find_cpu_quota(str(root)) is None, junk


def test_doctor_reports_the_quota(tmp_path: Path, h100_pod: Path) -> None:
    topo = load_topology(fsroot=str(h100_pod), environ={})
    facts = Facts(rank_cpus=topo.allowed, local_size=8)
    (finding,) = [f for f in check_environment({"OMP_NUM_THREADS": "14"}, topo, facts) if f.id == "cpu-quota"]
    assert finding.severity == "error"
    assert finding.message == (
        "a CPU quota of 8 CPUs (cgroup2 /sys/fs/cgroup/job/cpu.max: 800000 100000) is below the 224 allowed CPUs; "
        "OMP_NUM_THREADS=14 × 8 rank(s) = 112 threads"
    )
    assert finding.env_fix == {"OMP_NUM_THREADS": "1"}
    (finding,) = [f for f in check_environment({"OMP_NUM_THREADS": "1"}, topo, facts) if f.id == "cpu-quota"]
    assert finding.severity == "warning"
    unlimited = pod(tmp_path / "u", cpu_max="max 100000")
    assert not [f for f in check_environment({}, unlimited, facts) if f.id == "cpu-quota"]


def test_doctor_thread_advice_agrees_with_the_quota_and_the_plan(h100_pod: Path) -> None:
    # 8 ranks (one per GPU) share the 224 CPUs = 112 cores: 14 cores each, but the 8-CPU quota holds 1 thread per
    # rank. Every finding that suggests OMP_NUM_THREADS gives the planner's capped figure (before, cpu-quota said
    # 1 and omp-threads-unset said 14).
    proc = affrun("doctor", "--fsroot", str(h100_pod), "--json")
    found = {f["id"]: f for f in json.loads(proc.stdout)["findings"]}
    topo = load_topology(fsroot=str(h100_pod), environ={})
    assert found["cpu-quota"]["env_fix"] == found["omp-threads-unset"]["env_fix"] == {"OMP_NUM_THREADS": "1"}
    assert omp_threads(topo, 8) == [1] * 8
    assert found["omp-threads-unset"]["fix"].startswith("export OMP_NUM_THREADS=1 (a CPU quota of 8 CPUs for 8 rank(s))")
    # 2 ranks: 56 cores each, 8 // 2 = 4 threads under the quota. OMP_NUM_THREADS=1 is then worth raising, to 4.
    facts = Facts(rank_cpus=topo.allowed, local_size=2, ranks_sharing=2)
    found = {f.id: f for f in check_environment({}, topo, facts)}
    assert found["cpu-quota"].env_fix == found["omp-threads-unset"].env_fix == {"OMP_NUM_THREADS": "4"}
    assert omp_threads(topo, 2) == [4, 4]
    (one,) = [f for f in check_environment({"OMP_NUM_THREADS": "1"}, topo, facts) if f.id == "omp-threads-one"]
    assert one.message.startswith("OMP_NUM_THREADS=1 on a rank that owns 56 cores")
    assert one.env_fix == {"OMP_NUM_THREADS": "4"}
    # Without the quota the advice is the cores per rank, as before.
    unlimited = load_topology(fsroot=str(write_tree(h100_pod.parent / "unlimited", dgx_h100())), environ={})
    found = {f.id: f for f in check_environment({}, unlimited, facts)}
    assert "cpu-quota" not in found and found["omp-threads-unset"].env_fix == {"OMP_NUM_THREADS": "56"}


def test_plan_json_and_snapshot_carry_the_quota(tmp_path: Path, h100_pod: Path) -> None:
    root = str(h100_pod)
    proc = affrun("plan", "--fsroot", root, "--json", "--nproc-per-node", "2")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert [r["threads"] for r in plan["ranks"]] == [4, 4]
    assert any(w.startswith("CPU quota of 8 CPUs") for w in plan["warnings"])
    snap = tmp_path / "snap.json"
    proc = affrun("topology", "--fsroot", root, "--save", str(snap))
    assert proc.returncode == 0, proc.stderr
    topo = load_topology(topology_file=str(snap), environ={})
    assert (topo.cpu_quota, topo.cpu_quota_source) == (8.0, "cgroup2 /sys/fs/cgroup/job/cpu.max: 800000 100000")


# ------------------------------------------------------------------------------------ this machine's cgroups
def _real_cpu_cgroup() -> tuple[Path, str] | None:
    """(directory for a new child cgroup, its kind) of this machine's cpu controller, where root can make one."""
    if os.geteuid() != 0:
        return None
    mounts = Path("/proc/mounts").read_text().splitlines()
    for line in mounts:
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup" and "cpu" in fields[3].split(","):
            return Path(fields[1]), "v1"
    for line in mounts:
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup2":
            base = Path(fields[1])
            try:  # a child has cpu.max only where the parent hands the cpu controller down
                enabled = (base / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            if "cpu" in enabled:
                return base, "v2"
    return None


def test_a_real_cgroup_quota_caps_the_live_plan(tmp_path: Path) -> None:
    found = _real_cpu_cgroup()
    if found is None:
        pytest.skip("no cgroup cpu controller this process can create a child in (needs root)")
    base, kind = found
    group = base / f"affrun-test-{os.getpid()}"
    group.mkdir()
    try:
        if kind == "v1":
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text("100000")  # 1 CPU
        else:
            (group / "cpu.max").write_text("100000 100000")
        allowed = len(os.sched_getaffinity(0))
        # The shell joins the cgroup, then becomes affrun: the live topology is read from inside it.
        script = (f"echo $$ > {shlex.quote(str(group / 'cgroup.procs'))} && exec {shlex.quote(sys.executable)} "
                  "-m launcher plan --json --nproc-per-node 1 --no-gpu")
        proc = run(["sh", "-c", script], env=clean_env())
        assert proc.returncode == 0, proc.stderr
        plan = json.loads(proc.stdout)
        if allowed > 1:  # 1 rank on every allowed core would take them all; the 1-CPU quota caps it at 1
            assert plan["ranks"][0]["threads"] == 1
            assert any(w.startswith("CPU quota of 1 CPUs (cgroup") and f"below the {allowed} allowed CPUs" in w
                       for w in plan["warnings"]), plan["warnings"]
        else:
            assert not any("CPU quota" in w for w in plan["warnings"])
    finally:
        group.rmdir()


@pytest.mark.parametrize("value", ['"lots"', "-1", "1e400", "true", "[8]"])
def test_a_bad_quota_in_a_snapshot_is_one_line_and_exit_2(tmp_path: Path, value: str) -> None:
    root = write_tree(tmp_path / "root", small())
    snap = tmp_path / "snap.json"
    assert affrun("topology", "--fsroot", str(root), "--save", str(snap)).returncode == 0
    data = snap.read_text()
    assert '"cpu_quota": null' in data
    snap.write_text(data.replace('"cpu_quota": null', f'"cpu_quota": {value}'))
    proc = affrun("plan", "--topology", str(snap))
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("affrun: error: ") and "cpu_quota" in line


def test_a_bad_spill_choice_is_one_line_and_exit_2(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "root", small())
    proc = affrun("exec", "--fsroot", str(root), "--spill", "everywhere", "--", "true")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [proc.stderr.strip()]  # one line
    assert proc.stderr.startswith("affrun: error: argument --spill: invalid choice: 'everywhere'")
