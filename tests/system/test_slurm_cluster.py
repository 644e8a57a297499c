"""``affrun sbatch`` against the project's real local Slurm cluster (``tests/slurm/``): 2 virtual nodes with 2
fake GPUs each, started by ``tests/run_all.sh``.

Each job's tasks write what they really got (``tests/data/slurm/report.py``): their CPU mask, the step's cpuset,
affrun's variables and their argv as bytes. The expected binding is computed here by the planner from the same
fake sysfs tree and the GPU variables Slurm gave the task. The fake tree is this machine's CPUs split into two
NUMA nodes, GPU 0 on the first and GPU 1 on the second, so "near its own GPU" has a visible meaning.

Without the cluster these tests skip with the reason, and fail under ``CI=true`` (or with ``AFFRUN_SLURM=1``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from launcher.base.choices import SpillChoice
from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.options.record import Options
from launcher.plan.planner import RankPlan, make_plan
from launcher.topology import load_topology
from tests.conftest import need
from tests.fakesys import FakeGPU, FakeMachine, write_tree

pytestmark = pytest.mark.slurm

REPORT = Path(__file__).resolve().parents[1] / "data" / "slurm" / "report.py"
AFFRUN = f"{shlex.quote(sys.executable)} -m launcher"  # the checkout under test, inside the job too
JOB_TIMEOUT = 150
WALL: dict[str, float] = {}

# Arguments a shell could misread; "CANARY" becomes a path that must never be created.
# The first words would be eaten or parsed by a careless launcher: click drops a first "--", argparse matches "--a"
# and "--aff" against --affrun-*, "--n" against --nnodes/--nproc-per-node, and reads "-m" as torchrun's own flag.
HOSTILE = ["--", "--a", "1", "--aff", "--n", "2", "-m", "--nproc-per-node", "3", "--affrun-dry-run", "two words", "", "it's", 'say "hi"', "$(touch CANARY)", "`touch CANARY`", "; touch CANARY",
           "line one\nline two", "*", "?[ab]", "ünïcødé ✓", "$HOME ${IFS}", "\\", "--nnodes=9", "-c", "#SBATCH -N 9"]


@dataclass(frozen=True)
class Cluster:
    nodes: tuple[str, ...]
    partition: str


def _sinfo() -> tuple[Cluster | None, str]:
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return None, "Slurm client commands are not installed (start it: bash tests/slurm/start-slurm.sh)"
    try:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%T|%G|%P"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return None, "sinfo did not answer in 20 s"
    if proc.returncode != 0:
        return None, f"no Slurm controller answers (sinfo: {proc.stderr.strip()}); start it: bash tests/slurm/start-slurm.sh"
    nodes: list[str] = []
    partition = ""
    for line in proc.stdout.split():
        name, state, gres, part = line.split("|")
        count = gres.rsplit(":", 1)[-1].split("(")[0]
        if gres.startswith("gpu") and count.isdigit() and int(count) >= 2 and state.rstrip("*") in (
                "idle", "mixed", "allocated", "completing"):
            nodes.append(name)
            partition = part.rstrip("*")
    nodes = sorted(set(nodes))
    if len(nodes) < 2:
        return None, f"the cluster needs 2 nodes with 2 GPUs each, sinfo shows: {proc.stdout.strip()!r}"
    return Cluster(tuple(nodes[:2]), partition), ""


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    found, reason = _sinfo()
    if found is None and os.environ.get("AFFRUN_SLURM") == "1":
        pytest.fail(f"AFFRUN_SLURM=1 but the cluster is not usable: {reason}")
    need(found is not None, reason)
    assert found is not None
    return found


@pytest.fixture(scope="module")
def machine() -> FakeMachine:
    cpus = sorted(os.sched_getaffinity(0))
    need(len(cpus) >= 2, "the fake 2-NUMA machine needs at least 2 CPUs")
    half = len(cpus) // 2
    m = FakeMachine(cores=[(c,) for c in cpus], node_of_core=[0] * half + [1] * (len(cpus) - half),
                    package_of_core=[0] * len(cpus), l3_of_core=[0] * half + [1] * (len(cpus) - half))
    m.gpus = [FakeGPU(pci="0000:17:00.0", numa_node=0, uuid="GPU-fake-0"),
              FakeGPU(pci="0000:b1:00.0", numa_node=1, uuid="GPU-fake-1")]
    return m


@pytest.fixture(scope="module")
def fsroot(tmp_path_factory: pytest.TempPathFactory, machine: FakeMachine) -> Path:
    return write_tree(tmp_path_factory.mktemp("slurm-fsroot"), machine)


@pytest.fixture
def outdir(tmp_path: Path) -> Iterator[Path]:
    out = tmp_path / "reports"
    out.mkdir()
    yield out


def node_cpus(machine: FakeMachine, pci: str) -> set[int]:
    """The CPUs of the NUMA node the fake GPU ``pci`` sits on."""
    gpu = next(g for g in machine.gpus if g.pci == pci)
    return {pu for ci, core in enumerate(machine.cores) if machine.node_of_core[ci] == gpu.numa_node for pu in core}


def submit(tag: str, args: list[str], outdir: Path, *, wait: bool = True) -> subprocess.CompletedProcess[str]:
    name = f"affrun-test-{tag}"
    argv = [sys.executable, "-m", "launcher", "sbatch", "--job-name", name, "--time", "5",
            "--output", str(outdir / "job-%j.out"), *args]
    argv[argv.index("--"):argv.index("--")] = ["--submit", *(["--wait"] if wait else [])]
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=JOB_TIMEOUT, cwd=outdir)
    except subprocess.TimeoutExpired:
        subprocess.run(["scancel", "--name", name], timeout=30)
        raise
    WALL[tag] = time.monotonic() - start
    print(f"job {tag}: {WALL[tag]:.1f} s wall (submit to exit)")
    return proc


def job_log(outdir: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(outdir.glob("job-*.out")))


def reports(outdir: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(outdir.glob("rank*.json"))]


def setup_line(fsroot: Path, outdir: Path, *extra: str) -> str:
    return " ".join(["export", f"AFFRUN_FSROOT={shlex.quote(str(fsroot))}", f"REPORT_DIR={shlex.quote(str(outdir))}", *extra])


def expected_rank(fsroot: Path, env: dict[str, str], local_rank: int, nproc: int, spill: SpillChoice = "loader",
                  ) -> RankPlan:
    """What the planner promises this rank, given the GPU variables Slurm gave its task."""
    names = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_ID", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
    gpu_env = {k: env[k] for k in names if k in env}
    topo = load_topology(fsroot=str(fsroot), environ=gpu_env)
    return make_plan(topo, Options(spill=spill).request(nproc)).ranks[local_rank]


def check_rank(report: dict[str, object], fsroot: Path, machine: FakeMachine, local_rank: int, nproc: int,
               words: list[str], spill: SpillChoice = "loader") -> set[int]:
    env = report["env"]
    assert isinstance(env, dict)
    allowed = set(report["allowed"])  # type: ignore[arg-type]
    want = expected_rank(fsroot, env, local_rank, nproc, spill)
    where = f"rank {env.get('RANK', env.get('SLURM_PROCID'))} on {env.get('SLURMD_NODENAME')}"
    assert allowed == set(want.cpus), f"{where}: Cpus_allowed {sorted(allowed)}, plan {want.cpus}"
    assert env["AFFRUN_CPUS"] == format_cpulist(allowed)
    assert env["AFFRUN_GPU"] == str(want.gpu), f"{where}: GPU {env['AFFRUN_GPU']}, plan {want.gpu}"
    assert env["AFFRUN_GPU_PCI"] == want.gpu_pci
    assert allowed <= node_cpus(machine, str(want.gpu_pci)), f"{where}: CPUs {allowed} are not near GPU {want.gpu_pci}"
    assert allowed <= parse_cpulist(str(report["cpuset"])), f"{where}: CPUs outside the step's cpuset {report['cpuset']}"
    assert env["AFFRUN_LOCAL_WORLD_SIZE"] == str(nproc)
    assert report["argv_hex"] == [os.fsencode(w).hex() for w in words], f"{where}: argv changed"
    return allowed


def hostile_words(outdir: Path) -> tuple[list[str], Path]:
    canary = outdir.parent / "canary"
    return [w.replace("CANARY", str(canary)) for w in HOSTILE] + ["\udcff\udcfe"], canary  # + raw bytes ff fe


# ---------------------------------------------------------------------------- sbatch --test-only


def every_option(cluster: Cluster, style: str) -> list[str]:
    return ["--style", style, "--nodes", "2", "--gpus-per-node", "fake:2", "--ntasks-per-node", "2",
            "--cpus-per-task", "1", "--time", "0:05:00", "--partition", cluster.partition, "--account", "root",
            "--qos", "normal", "--constraint", "affrun", "--job-name", "affrun test only", "--output", "/tmp/%x-%j.out",
            "--error", "/tmp/%x-%j.err", "--mem", "100M", "--exclusive", "--sbatch-line", "--comment=affrun",
            "--sbatch-line", "#SBATCH --signal=USR1@60", "--setup", "module list 2>/dev/null || true",
            "--rdzv-port", "29555", "--affrun", AFFRUN, "--mode", "exclusive", "--loader-cores", "0",
            "--gpu-order", "rank", "--mem-policy", "none", "--omp-bind", "core", "--env-policy", "override"]


@pytest.mark.parametrize("style", ["torchrun", "srun", "custom"])
def test_sbatch_test_only_accepts_every_template_with_every_option(cluster: Cluster, tmp_path: Path, style: str) -> None:
    args = every_option(cluster, "srun" if style == "custom" else style)
    if style == "custom":
        template = tmp_path / "custom.sbatch"
        template.write_text("{{shebang}}\n{{sbatch_directives}}\nset -eu\n{{setup}}\n"
                            "exec srun --ntasks-per-node={{ranks_per_node}} -c {{cpus_per_task}} --cpu-bind=none "
                            "{{affrun}} exec {{affrun_options}} -- {{command}}\n")
        args += ["--template", str(template)]
    script = tmp_path / "job.sbatch"
    made = subprocess.run([sys.executable, "-m", "launcher", "sbatch", *args, "-o", str(script), "--", "train.py", "x"],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    for line in ("#SBATCH --exclusive", "#SBATCH --constraint=affrun", "#SBATCH --comment=affrun"):
        assert line in script.read_text()
    proc = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "to start at" in proc.stderr and "on nodes" in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------- end to end


def test_srun_style_two_nodes_one_task_per_gpu(cluster: Cluster, fsroot: Path, machine: FakeMachine, outdir: Path) -> None:
    words, canary = hostile_words(outdir)
    proc = submit("srun", ["--style", "srun", "--nodes", "2", "--gpus-per-node", "2", "--exclusive",
                           "--affrun", AFFRUN, "--mem-policy", "none", "--setup", setup_line(fsroot, outdir),
                           "--", sys.executable, str(REPORT), *words], outdir)
    assert proc.returncode == 0, f"{proc.stderr}\n{job_log(outdir)}"
    assert proc.stdout.strip().isdigit(), proc.stdout
    found = reports(outdir)
    assert len(found) == 4, job_log(outdir)
    by_node: dict[str, list[set[int]]] = {}
    for report in found:
        env = report["env"]
        assert isinstance(env, dict)
        local = int(env["SLURM_LOCALID"])
        cpus = check_rank(report, fsroot, machine, local, 2, words)
        by_node.setdefault(env["SLURMD_NODENAME"], []).append(cpus)
        assert env["AFFRUN_LOCAL_RANK"] == str(local)
        # torch's env:// needs these; srun sets none of them, affrun exec derives them per task
        assert (env["RANK"], env["WORLD_SIZE"]) == (env["SLURM_PROCID"], "4")
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(local), "2")
    assert sorted(by_node) == sorted(cluster.nodes)
    for sets in by_node.values():
        assert len(sets) == 2 and not sets[0] & sets[1], f"ranks of one node overlap: {sets}"
    assert not canary.exists()
    assert job_log(outdir).count("affrun: rank ") == 4  # --verbose: one binding line per task


def test_torchrun_style_two_nodes_gloo_rendezvous(cluster: Cluster, fsroot: Path, machine: FakeMachine,
                                                   outdir: Path) -> None:
    need(importlib.util.find_spec("torch") is not None, "torch is not installed (pip install -e '.[test]')")
    words, canary = hostile_words(outdir)
    proc = submit("torchrun", ["--nodes", "2", "--gpus-per-node", "2", "--exclusive", "--affrun", AFFRUN,
                               "--mem-policy", "none", "--setup", setup_line(fsroot, outdir, "REPORT_GLOO=1"),
                               "--", str(REPORT), *words], outdir)
    assert proc.returncode == 0, f"{proc.stderr}\n{job_log(outdir)}"
    found = reports(outdir)
    assert len(found) == 4, job_log(outdir)
    world = 4
    nodes: dict[str, list[set[int]]] = {}
    for report in found:
        env = report["env"]
        assert isinstance(env, dict)
        assert report["world_size"] == world
        assert report["allreduce"] == world * (world + 1) // 2  # every rank took part in one gloo all-reduce
        cpus = check_rank(report, fsroot, machine, int(env["LOCAL_RANK"]), 2, words)
        assert env["SLURM_NNODES"] == "2" and env["SLURM_LOCALID"] == "0"  # one srun task per node
        nodes.setdefault(env["SLURMD_NODENAME"], []).append(cpus)
    assert sorted(nodes) == sorted(cluster.nodes)
    assert {int(r["env"]["GROUP_RANK"]) for r in found} == {0, 1}  # type: ignore[index]
    for sets in nodes.values():
        assert len(sets) == 2 and not sets[0] & sets[1], f"ranks of one node overlap: {sets}"
    assert not canary.exists()


def test_rank_sits_near_its_own_gpu_when_visible_indices_are_relative(cluster: Cluster, fsroot: Path,
                                                                      machine: FakeMachine, outdir: Path) -> None:
    """Another job holds the node's first GPU: ours gets global GPU 1, which it sees as CUDA_VISIBLE_DEVICES=0
    (ConstrainDevices=yes). affrun must place the rank by GPU 1, not by GPU 0."""
    node = cluster.nodes[0]
    blocker = subprocess.run(["sbatch", "--parsable", "-w", node, "-N1", "-n1", "-c1", "--gpus-per-node=1",
                              "-J", "affrun-test-blocker", "-t", "5", "-o", "/dev/null", "--wrap", "sleep 120"],
                             capture_output=True, text=True, timeout=30)
    assert blocker.returncode == 0, blocker.stderr
    blocker_id = blocker.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["squeue", "-h", "-j", blocker_id, "-o", "%T"], capture_output=True, text=True,
                             timeout=30).stdout.strip() != "RUNNING":
            assert time.monotonic() < deadline, "the blocker job did not start"
            time.sleep(0.3)
        proc = submit("relative-gpu", ["--style", "srun", "--nodes", "1", "--gpus-per-node", "1",
                                       "--sbatch-line", f"--nodelist={node}", "--affrun", AFFRUN,
                                       "--mem-policy", "none", "--spill", "none",
                                       "--setup", setup_line(fsroot, outdir),
                                       "--", sys.executable, str(REPORT), "x"], outdir)
    finally:
        subprocess.run(["scancel", blocker_id], timeout=30)
    assert proc.returncode == 0, f"{proc.stderr}\n{job_log(outdir)}"
    (report,) = reports(outdir)
    env = report["env"]
    assert isinstance(env, dict)
    assert env["SLURM_STEP_GPUS"] == "1", f"scenario not set up: the job got GPU {env['SLURM_STEP_GPUS']}"
    constrained = env["CUDA_VISIBLE_DEVICES"] == "0"
    print(f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} for global GPU 1 "
          f"({'relative: device cgroup constrained' if constrained else 'global'})")
    # --spill none: the question is which GPU's node the rank sits on. With the default spill the one rank would
    # also take node 0's core as a loader core, and the blocker job holds that CPU.
    check_rank(report, fsroot, machine, 0, 1, ["x"], spill="none")
    assert env["AFFRUN_GPU"] == "0" and env["AFFRUN_GPU_PCI"] == machine.gpus[1].pci


def test_failing_job_exit_code_propagates_through_submit_wait(cluster: Cluster, outdir: Path) -> None:
    script = outdir / "exit3.sbatch"  # -o FILE with --submit: the file is written, then submitted
    proc = submit("exit3", ["--style", "srun", "--nodes", "1", "--ntasks-per-node", "1", "--affrun", AFFRUN,
                            "--no-gpu", "--mem-policy", "none", "-o", str(script),
                            "--", sys.executable, "-c", "import sys; sys.exit(3)"], outdir)
    assert proc.returncode == 3, f"{proc.stderr}\n{job_log(outdir)}"
    assert proc.stdout.strip().isdigit()
    assert "sys.exit(3)" in script.read_text()
    missing = submit("exit127", ["--style", "srun", "--nodes", "1", "--ntasks-per-node", "1", "--affrun", AFFRUN,
                                 "--no-gpu", "--mem-policy", "none", "--", "/nonexistent/prog"], outdir)
    assert missing.returncode == 127, f"{missing.stderr}\n{job_log(outdir)}"


def test_the_default_script_runs_this_affrun_with_none_on_the_jobs_path(cluster: Cluster, outdir: Path) -> None:
    """No --affrun-command: the script names the affrun that wrote it by absolute path (issue 21), and the job runs
    it with a PATH that has no affrun at all. With --affrun-command the given command is what the job runs."""
    script = outdir / "default.sbatch"
    bare_path = "export PATH=/usr/bin:/bin:/usr/sbin:/sbin"
    proc = submit("default-affrun", ["--style", "srun", "--nodes", "1", "--ntasks-per-node", "1", "--no-gpu",
                                     "--mem-policy", "none", "--setup", bare_path, "-o", str(script),
                                     "--", sys.executable, "-c", "import os; print('bound to', os.environ['AFFRUN_CPUS'])"],
                  outdir)
    assert proc.returncode == 0, f"{proc.stderr}\n{job_log(outdir)}"
    text = script.read_text()
    written = next(line.split()[0] for line in text.splitlines() if line.startswith("  ") and " exec " in line)
    assert os.path.isabs(written) and os.access(written, os.X_OK), text
    assert "bound to " in job_log(outdir)
    chosen = outdir / "chosen.sbatch"
    proc = submit("chosen-affrun", ["--style", "srun", "--nodes", "1", "--ntasks-per-node", "1", "--no-gpu",
                                    "--affrun-command", AFFRUN, "--mem-policy", "none", "-o", str(chosen),
                                    "--", "true"], outdir)
    assert proc.returncode == 0, f"{proc.stderr}\n{job_log(outdir)}"
    assert f"  {AFFRUN} exec" in chosen.read_text()


def test_submit_without_wait_prints_the_job_id(cluster: Cluster, outdir: Path) -> None:
    proc = submit("nowait", ["--style", "srun", "--nodes", "1", "--ntasks-per-node", "1", "--affrun", AFFRUN,
                             "--no-gpu", "--", "true"], outdir, wait=False)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    assert job.isdigit()
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30)
    assert f"JobId={job} JobName=affrun-test-nowait" in shown.stdout, shown.stderr


# ---------------------------------------------------------------------------- affrun run inside a batch script
def test_affrun_run_in_a_batch_script_binds_the_ranks_not_the_launcher(cluster: Cluster, outdir: Path) -> None:
    """The batch script has SLURM_LOCALID=0: `affrun run -- torchrun` leaves torchrun's agent unbound and binds
    its two ranks as planned; `affrun run -- srun -n 2 python` binds srun's two tasks, task 0 included (a new
    step: its SLURM_LOCALID=0 is a rank, not the batch script's)."""
    need(importlib.util.find_spec("torch") is not None, "torch is not installed (pip install -e '.[test]')")
    programs = Path(__file__).resolve().parents[1] / "programs"
    bin_dir = Path(sys.executable).parent
    run = f"{AFFRUN} run --nproc-per-node 2 --mem-policy none"
    probe = {name: outdir / name for name in ("torchrun", "srun")}
    for path in probe.values():
        path.mkdir()
    script = outdir / "run.sh"
    script.write_text("\n".join([
        "#!/bin/bash",
        "grep Cpus_allowed_list: /proc/self/status > allowed.txt; env | grep ^SLURM_LOCALID= > task.txt",
        f"{run} --dry-run > plan.txt",
        f"PROBE_DIR={probe['torchrun']} {run} -- {bin_dir / 'torchrun'} --standalone --nproc-per-node 2 "
        f"{programs / 'rank_probe_plain.py'}",
        f"PROBE_DIR={probe['srun']} {run} -- srun --cpu-bind=none -N1 -n2 {sys.executable} "
        f"{programs / 'rank_probe_plain.py'}",
        "",
    ]))
    proc = subprocess.run(["sbatch", "--wait", "--parsable", "-p", cluster.partition, "-N1", "-n2", "--time", "5",
                           "--job-name", "affrun-test-run", "--chdir", str(outdir),
                           "--output", str(outdir / "job-%j.out"), str(script)],
                          capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, f"{proc.stderr}\n{job_log(outdir)}"
    assert (outdir / "task.txt").read_text().strip() == "SLURM_LOCALID=0"  # what made the launcher rank 0 before
    batch_mask = parse_cpulist((outdir / "allowed.txt").read_text().split()[1])
    (line,) = [ln for ln in (outdir / "plan.txt").read_text().splitlines() if ln.startswith("AFFRUN_PLAN=")]
    planned = json.loads(line.removeprefix("AFFRUN_PLAN="))["plan"]["ranks"]
    assert len(planned) == 2
    for name, key in (("torchrun", "LOCAL_RANK"), ("srun", "SLURM_LOCALID")):
        records = ranks_of(probe[name])
        ranks = {int(r[key]): r for r in records}
        assert sorted(ranks) == [0, 1], (name, records, job_log(outdir))
        for rank in planned:
            got = ranks[rank["local_rank"]]
            assert parse_cpulist(got["mask"]) == frozenset(rank["cpus"]), (name, got, rank)
            assert got["OMP_NUM_THREADS"] == str(rank["threads"]), (name, got, rank)
            assert got["AFFRUN_LOCAL_RANK"] == str(rank["local_rank"]), (name, got)
    agents = [a for r in ranks_of(probe["torchrun"]) for a in r["ancestors"][:1]]
    assert len(agents) == 2 and all("torchrun" in " ".join(a["argv"]) for a in agents), agents
    assert all(parse_cpulist(a["mask"]) == batch_mask for a in agents), (agents, batch_mask)  # agent unbound


def ranks_of(probe: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(probe.iterdir())]
