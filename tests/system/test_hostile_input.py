"""Hostile input through the real CLI: one ``affrun: error:`` line and exit 2 within a bound, or the correct
result; never a traceback, a hang, a CPU in two ranks, or a lost argument.

The cases are the regression suite of issue 9 (found by fuzzing): every class has several members, not only the
first reproducer. The trees are copies of hwloc's real ones (``16em64t-4s2c2t-offlines``: 4 packages x 2 cores
x 2 threads, some CPUs offline), corrupted one file at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from launcher.bind.handoff import ParentPlan
from launcher.plan.planner import make_plan
from launcher.topology import load_topology
from launcher.topology.snapshot import to_snapshot
from tests.errors import refused
from tests.fakesys import FakeGPU, uniform, write_tree
from tests.launch import affrun_argv, clean_env

BOUND = 60.0  # seconds for one affrun process on a loaded 2-CPU machine; the real figure is well under one
TREE = "16em64t-4s2c2t-offlines"
ARGV_PROBE = Path(__file__).resolve().parents[1] / "programs" / "argv_probe.py"
CPU = "sys/devices/system/cpu"
NODE = "sys/devices/system/node"
# Words that a launcher must pass on untouched, in this order: click drops a first "--", argparse matches "--a" and
# "--aff" against --affrun-*, "--n" against --nnodes, and reads -m / --nproc-per-node as its own options.
WORDS: list[bytes] = [b"--", b"--a", b"1", b"--aff", b"--n", b"2", b"-m", b"--nproc-per-node", b"3", b"--",
                      b"--affrun-dry-run", b"-h", b"it's", b'say "hi"', b"$(touch CANARY)", b"`touch CANARY`",
                      b"line one\nline two", b"", b"\xff\xfe not utf-8", b"\xc3\xbcn\xc3\xafc\xc3\xb8d\xc3\xa9"]


# ---------------------------------------------------------------------------------------------- helpers
def affrun(*args: str | bytes, env: dict[str, str] | None = None, cwd: Path | None = None,
           timeout: float = BOUND) -> subprocess.CompletedProcess[str]:
    start = time.monotonic()
    proc = subprocess.run(affrun_argv(*args), env=clean_env(**(env or {})), capture_output=True, timeout=timeout,  # type: ignore[arg-type]
                          cwd=cwd, stdin=subprocess.DEVNULL)
    assert time.monotonic() - start < timeout
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(errors="replace"),
                                       proc.stderr.decode(errors="replace"))


def planned(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """A successful ``plan --json``: no traceback, and no CPU twice (in a rank, or in two unshared ranks)."""
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(proc.stdout)
    owner: dict[int, int] = {}
    for rank in data["ranks"]:
        cpus = rank["cpus"]
        assert len(cpus) == len(set(cpus)), f"rank {rank['local_rank']} lists a CPU twice: {cpus}"
        compute = [p for core in rank["compute_cores"] for p in core]
        assert len(compute) == len(set(compute)), f"rank {rank['local_rank']}: a PU in two cores: {compute}"
        if rank["shared"]:
            continue
        for cpu in cpus:
            assert owner.setdefault(cpu, rank["local_rank"]) == rank["local_rank"], f"CPU {cpu} in two ranks"
    return data


@pytest.fixture
def tree(hwloc_root: Callable[[str], Path], tmp_path: Path) -> Path:
    """A private copy of a real hwloc tree, to corrupt."""
    dest = tmp_path / "tree"
    shutil.copytree(hwloc_root(TREE), dest, symlinks=True)
    return dest


def plan_json(source: list[str], *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return affrun("plan", *source, "--json", *args, env=env)


def fifo(path: Path) -> Path:
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)
    return path


# ---------------------------------------------------------------------------------------------- one CPU in two cores
@pytest.mark.parametrize("damage", ["deleted", "dangling", "self-loop", "empty"])
@pytest.mark.parametrize("nproc", ["7", "8"])
def test_inconsistent_sibling_files_never_put_a_cpu_in_two_cores(tree: Path, damage: str, nproc: str) -> None:
    siblings = tree / CPU / "cpu0/topology/thread_siblings"
    siblings.unlink()
    if damage == "dangling":
        siblings.symlink_to("no-such-file")
    elif damage == "self-loop":
        siblings.symlink_to("thread_siblings")
    elif damage == "empty":
        siblings.write_text("")
    data = planned(plan_json(["--fsroot", str(tree)], "--nproc-per-node", nproc))
    assert len(data["ranks"]) == int(nproc)
    # cpu0 now reads as a core of its own while cpu8's siblings still name CPUs 0 and 8: 0 stays in the first core
    assert any("more than one core" in w for w in data["warnings"]), data["warnings"]


XML = """<?xml version="1.0" encoding="{encoding}"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" allowed_cpuset="0x0000000f"
          nodeset="0x00000001" complete_nodeset="0x00000001" allowed_nodeset="0x00000001">
    {distances}
    <object type="Package" os_index="0" cpuset="0x0000000f">
      <object type="NUMANode" os_index="{node}" cpuset="0x0000000f" nodeset="0x00000001" local_memory="1000000"/>
      <object type="Core" os_index="0" cpuset="0x00000003">
        <object type="PU" os_index="0" cpuset="0x00000001"/>
        <object type="PU" os_index="{pu}" cpuset="0x00000002"/>
      </object>
      <object type="Core" os_index="1" cpuset="0x0000000c">
        {extra}<object type="PU" os_index="2" cpuset="0x00000004"/>
        <object type="PU" os_index="3" cpuset="0x00000008"/>
      </object>
    </object>
  </object>
</topology>
"""


def xml_file(tmp_path: Path, **fields: str) -> list[str]:
    values = {"encoding": "UTF-8", "distances": "", "node": "0", "pu": "1", "extra": ""} | fields
    path = tmp_path / "topo.xml"
    path.write_text(XML.format(**values), encoding="utf-8")
    return ["--topology", str(path)]


def test_healthy_xml_plans(tmp_path: Path) -> None:
    assert [r["cpus"] for r in planned(plan_json(xml_file(tmp_path), "--nproc-per-node", "2"))["ranks"]] == [[0, 1], [2, 3]]


def test_one_pu_under_two_cores_in_xml_stays_in_the_first(tmp_path: Path) -> None:
    source = xml_file(tmp_path, extra='<object type="PU" os_index="0" cpuset="0x00000001"/>')
    for nproc in ("1", "2"):
        data = planned(plan_json(source, "--nproc-per-node", nproc, "--smt"))
        assert any("listed twice" in w and "where it is first listed" in w for w in data["warnings"])


def snapshot_of(tree: Path, tmp_path: Path, change: Callable[[dict[str, Any]], object]) -> list[str]:
    data = to_snapshot(load_topology(fsroot=str(tree), environ={}))
    change(data)
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(data))
    return ["--topology", str(path)]


def test_one_core_listed_twice_in_a_snapshot(tree: Path, tmp_path: Path) -> None:
    source = snapshot_of(tree, tmp_path, lambda d: d["cores"].append(dict(d["cores"][0])))
    cores = len(load_topology(fsroot=str(tree), environ={}).allowed_cores())
    data = planned(plan_json(source, "--nproc-per-node", str(cores)))
    assert any("more than one core" in w for w in data["warnings"])
    refused(plan_json(source, "--nproc-per-node", str(cores + 1)), "whole core")


# ---------------------------------------------------------------------------------------------- ids out of range
def test_cpu_and_node_directory_names_are_capped(tree: Path) -> None:
    assert not (tree / CPU / "online").exists()  # an old kernel's tree: per-CPU online files only
    big = tree / CPU / "cpu99999999999"
    shutil.copytree(tree / CPU / "cpu1", big, symlinks=True)
    refused(plan_json(["--fsroot", str(tree)]), "cpu99999999999", "above 65535")
    refused(affrun("exec", "--fsroot", str(tree), "--local-rank", "0", "--nproc-per-node", "1", "--", "true"),
            "above 65535")
    shutil.rmtree(big)
    (tree / NODE / "node5000").mkdir(parents=True)
    refused(plan_json(["--fsroot", str(tree)]), "node5000", "node id 5000")


@pytest.mark.parametrize(("fields", "needle"), [
    ({"pu": "99999999999"}, "CPU 99999999999"),
    ({"pu": "-7"}, "CPU -7"),
    ({"pu": "\u0661"}, "not an integer"),  # ARABIC-INDIC DIGIT ONE: int() takes it
    ({"pu": "1_0"}, "not an integer"),
    ({"node": "5000"}, "NUMA node 5000"),
    ({"node": "-1"}, "NUMA node -1"),
])
def test_xml_ids_out_of_range(tmp_path: Path, fields: dict[str, str], needle: str) -> None:
    refused(plan_json(xml_file(tmp_path, **fields)), needle)


@pytest.mark.parametrize(("change", "needle"), [
    (lambda d: d["cores"][0].update(pus=[99999999999]), "99999999999"),
    (lambda d: d["cores"][0].update(pus=[-1]), "-1"),
    (lambda d: d["cores"][0].update(pus=[10 ** 400]), "digits"),
    (lambda d: d["numa_nodes"][0].update(os_index=-3), "NUMA node -3"),
    (lambda d: d["cores"][0].update(numa_node=99999), "NUMA node 99999"),
    (lambda d: d["numa_nodes"][0].update(distances={"\u0661": 10}), "not a NUMA node id"),
    (lambda d: d.update(online="0-99999999"), "above 65535"),
    (lambda d: d.update(cpu_quota=10 ** 400), "cpu_quota"),  # no float holds it: a traceback before
])
def test_snapshot_ids_out_of_range(tree: Path, tmp_path: Path, change: Callable[[dict[str, Any]], object],
                                   needle: str) -> None:
    refused(plan_json(snapshot_of(tree, tmp_path, change)), needle)


# ---------------------------------------------------------------------------------------------- non-ASCII digits
@pytest.mark.parametrize("name", ["cpu①", "cpu²", "cpu\u0661", "node²", "node\u0661", "cpu1_0"])
def test_non_ascii_digit_entries_are_not_cpus_or_nodes(tree: Path, name: str) -> None:
    before = planned(plan_json(["--fsroot", str(tree)], "--nproc-per-node", "4"))
    kind = CPU if name.startswith("cpu") else NODE
    (tree / kind / name).mkdir(parents=True)
    after = planned(plan_json(["--fsroot", str(tree)], "--nproc-per-node", "4"))
    assert after["ranks"] == before["ranks"]


def test_non_ascii_distance_is_ignored(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", uniform(2, 2, nodes_per_package=1))
    (root / NODE / "node0/distance").write_text("10 \u00b2\n")
    (root / NODE / "node1/distance").write_text("\u0662\u0660 10\n")
    proc = affrun("topology", "--fsroot", str(root), "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert [n["distances"] for n in json.loads(proc.stdout)["numa_nodes"]] == [{}, {}]


def gpu_tree(tmp_path: Path, vendor: int = 0x10DE) -> Path:
    machine = uniform(2, 2, nodes_per_package=1)
    machine.gpus = [FakeGPU(pci=f"0000:{0x17 + 0x20 * i:02x}:00.0", numa_node=i, vendor=vendor) for i in range(2)]
    return write_tree(tmp_path / "gpus", machine)


@pytest.mark.parametrize("value", ["\u00b2", "\u2460", "\u0661", "0,\u00b2", "1_0", "+1", " 1"])
@pytest.mark.parametrize(("variable", "vendor"), [("CUDA_VISIBLE_DEVICES", 0x10DE), ("ROCR_VISIBLE_DEVICES", 0x1002),
                                                  ("HIP_VISIBLE_DEVICES", 0x1002)])
def test_gpu_visibility_with_non_ascii_digits(tmp_path: Path, variable: str, vendor: int, value: str) -> None:
    root = gpu_tree(tmp_path, vendor)
    data = planned(plan_json(["--fsroot", str(root)], "--nproc-per-node", "2", env={variable: value}))
    if value.strip().isascii() and value.strip().isdigit():
        return  # " 1" is a list of one well-formed index: GPU 1
    assert any(variable in w for w in data["warnings"]), data["warnings"]
    assert all(r["gpu"] in (None, 0) for r in data["ranks"])


@pytest.mark.parametrize("value", ["\u00b2", "\u0661", "0,\u00b2"])
def test_slurm_job_gpus_with_non_ascii_digits(tmp_path: Path, value: str) -> None:
    root = gpu_tree(tmp_path)
    data = planned(plan_json(["--fsroot", str(root)], "--nproc-per-node", "1",
                             env={"SLURM_JOB_GPUS": value, "CUDA_VISIBLE_DEVICES": "0"}))
    assert data["ranks"][0]["gpu"] == 0  # Slurm's list is unusable: CUDA_VISIBLE_DEVICES is taken as it is


def dry_exec(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return affrun("exec", "--dry-run", "--cpus", "0", *args, "--", "true", env=env)


@pytest.mark.parametrize("env", [
    {"SLURM_LOCALID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS_PER_NODE": "\u00b2"},
    {"SLURM_LOCALID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS_PER_NODE": "\u0661"},
    {"SLURM_LOCALID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "1(x99999999999)"},
    {"SLURM_LOCALID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "1(x\u0661)"},
    {"LOCAL_RANK": "\u0661", "LOCAL_WORLD_SIZE": "2"},
    {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "9" * 5000},
    {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1000000"},
])
def test_garbage_launcher_variables_are_one_line(env: dict[str, str]) -> None:
    refused(dry_exec(env=env))


def test_huge_slurm_repeat_count_is_bounded_and_falls_back() -> None:
    proc = dry_exec(env={"SLURM_LOCALID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "1(x99999999999)",
                         "SLURM_NTASKS_PER_NODE": "1"})
    assert proc.returncode == 0 and proc.stdout.startswith("affrun: rank 0/1 "), proc.stderr[-2000:]


# ---------------------------------------------------------------------------------------------- documents
@pytest.mark.parametrize(("fields", "needle"), [
    ({"encoding": "bogus"}, "cannot decode"),
    ({"encoding": "UTF-7"}, "cannot decode"),
    ({"encoding": "UTF-16"}, ""),  # declared UTF-16, written UTF-8: expat's own error
])
def test_xml_encodings(tmp_path: Path, fields: dict[str, str], needle: str) -> None:
    refused(plan_json(xml_file(tmp_path, **fields)), needle)


@pytest.mark.parametrize("latency", ["inf", "1e400", "nan", "-5", "\u0661", "1e"])
def test_hwloc1_latencies_that_are_not_finite_numbers(tmp_path: Path, latency: str) -> None:
    distances = f'<distances nbobjs="1" relative_depth="1" latency_base="10.0"><latency value="{latency}"/></distances>'
    refused(plan_json(xml_file(tmp_path, distances=distances)), "distances")


@pytest.mark.parametrize(("text", "needle"), [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"format": "affrun-topology/1", "online": ' + "9" * 5000 + "}", "not valid JSON"),
    ('{"format": "affrun-topology/1", "online": Infinity}', "Infinity"),
    ('{"format": "affrun-topology/1", "online": NaN}', "NaN"),
    ('{"format": "affrun-topology/1", "packages": [' + "[" * 50 + "]" * 50 + "]}", "bad topology snapshot"),
])
def test_snapshot_json_that_python_chokes_on(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "snap.json"
    path.write_text(text)
    refused(plan_json(["--topology", str(path)]), needle)


def test_snapshot_that_is_not_text(tmp_path: Path) -> None:
    path = tmp_path / "snap.json"
    path.write_bytes(b"\xff\xfe\x00{")
    refused(plan_json(["--topology", str(path)]), "not a text file")


def parent_plan(tree: Path) -> dict[str, Any]:
    from launcher.plan.planner import Request

    topo = load_topology(fsroot=str(tree), environ={})
    plan = make_plan(topo, Request(nproc=2))
    data: dict[str, Any] = json.loads(ParentPlan(plan, "rank", "safe", "none", "auto", {}, False).to_json())
    return data


def rank0(d: dict[str, Any]) -> dict[str, Any]:
    rank: dict[str, Any] = d["plan"]["ranks"][0]
    return rank


PLAN_DAMAGE: list[tuple[str, Callable[[dict[str, Any]], object], str]] = [
    ("bind", lambda d: d.update(bind="everywhere"), "bind must be one of"),
    ("env_policy", lambda d: d.update(env_policy="yolo"), "env_policy must be one of"),
    ("mem_policy", lambda d: d.update(mem_policy="auto"), "mem_policy must be one of"),
    ("mem_backend", lambda d: d.update(mem_backend="magic"), "mem_backend must be one of"),
    ("user_env", lambda d: d.update(user_env={"OMP_NUM_THREADS": 4}), "user_env"),
    ("user_env list", lambda d: d.update(user_env=["x"]), "user_env"),
    ("verbose", lambda d: d.update(verbose="yes"), "verbose"),
    ("negative cpu", lambda d: rank0(d).update(cpus=[-1]), "cpus[0]"),
    ("huge cpu", lambda d: rank0(d).update(cpus=[99999999999]), "cpus[0]"),
    ("cpu above cap", lambda d: rank0(d).update(cpus=[70000]), "cpus[0]"),
    ("bool cpu", lambda d: rank0(d).update(cpus=[True]), "cpus[0]"),
    ("negative node", lambda d: rank0(d).update(numa_nodes=[-1]), "numa_nodes[0]"),
    ("node above cap", lambda d: rank0(d).update(mem_nodes=[5000]), "mem_nodes[0]"),
    ("threads", lambda d: rank0(d).update(threads=0), "threads"),
    ("gpu", lambda d: rank0(d).update(gpu=-1), "gpu"),
    ("compute outside cpus", lambda d: rank0(d).update(compute_cores=[[12345]]), "COMPUTE_CPUS=12345"),
    ("two ranks one cpu", lambda d: d["plan"]["ranks"][1]["cpus"].append(rank0(d)["cpus"][0]), "both have CPU"),
    ("mode", lambda d: d["plan"].update(mode="turbo"), "plan.mode"),
    ("no ranks", lambda d: d["plan"].update(ranks=[]), "plan.ranks"),
    ("plan not an object", lambda d: d.update(plan=[1]), "plan must be an object"),
    ("missing key", lambda d: rank0(d).pop("cpus"), "missing \"cpus\""),
    ("another schema", lambda d: d.update(schema=2), "\"schema\" is 2, not 1"),
    ("rate beyond a float", lambda d: rank0(d).update(nic={
        "name": "mlx5_0", "port": 1, "device": "mlx5_0:1", "pci": "0000:17:00.0", "kind": "infiniband",
        "distance": "switch", "rate_gbps": 10 ** 400}), "rate_gbps must be a finite number"),
    ("no schema", lambda d: d.pop("schema"), "\"schema\" is None, not 1"),
]


@pytest.mark.parametrize(("change", "needle"), [(c, n) for _, c, n in PLAN_DAMAGE], ids=[i for i, _, _ in PLAN_DAMAGE])
def test_affrun_plan_variable_is_validated(tree: Path, change: Callable[[dict[str, Any]], object], needle: str) -> None:
    data = parent_plan(tree)
    # No option of the option table: with one, exec plans by it (docs/launchers.md), and the plan is not used.
    proc = affrun("exec", "--dry-run", "--local-rank", "0", "--", "true", env={"AFFRUN_PLAN": json.dumps(data)})
    assert proc.returncode == 0, proc.stderr  # the undamaged plan is accepted
    change(data)
    refused(affrun("exec", "--dry-run", "--local-rank", "0", "--", "true", env={"AFFRUN_PLAN": json.dumps(data)}),
            "AFFRUN_PLAN", needle)


@pytest.mark.parametrize(("text", "needle"), [
    ("[" * 100_000, "nested too deeply"),
    ('{"plan": ' + "1" * 5000 + "}", "not valid JSON"),
    ('{"plan": Infinity}', "Infinity"),
    ("{", "not valid JSON"),
])
def test_affrun_plan_variable_that_python_chokes_on(text: str, needle: str) -> None:
    refused(dry_exec("--local-rank", "0", "--nproc-per-node", "1", env={"AFFRUN_PLAN": text}), "AFFRUN_PLAN", needle)


YAML_CASES = {
    "deep flow lists": "defaults:\n  mode: " + "[" * 20_000 + "]" * 20_000 + "\n",
    "deep blocks": "defaults:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(3000)),
    "alias bomb": "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
    + "defaults:\n  mode: *i\n",
    "huge key": "defaults:\n  " + "k" * 100_000 + ": 1\n",
    "huge value": "defaults:\n  mode: " + "m" * 100_000 + "\n",
    # PyYAML's constructors raise ValueError/KeyError for these, not YAMLError
    "5,000-digit integer": "defaults:\n  nodes: " + "9" * 5000 + "\n",
    "5,000-digit hex integer": "defaults:\n  mem: !!int 0x" + "f" * 5000 + "\n",
    "5,000-digit integer key": "defaults:\n  " + "9" * 5000 + ": 1\n",
    "int tag on a word": "defaults:\n  job-name: !!int abc\n",
    "float tag on a word": "defaults:\n  job-name: !!float abc\n",
    "bool tag on a word": "defaults:\n  job-name: !!bool abc\n",
    "timestamp tag on a day that does not exist": "defaults:\n  job-name: !!timestamp 2001-02-30\n",
    # strings a batch script cannot hold
    "lone surrogate": 'defaults:\n  job-name: "\\ud800x"\n',
    "NUL in a value": 'defaults:\n  job-name: "a\\x00b"\n',
    "escape sequence in a setup line": 'defaults:\n  setup: ["echo ok", "x\\x1b[31m"]\n',
}


@pytest.mark.parametrize("text", list(YAML_CASES.values()), ids=list(YAML_CASES))
def test_hostile_yaml_is_one_short_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    refused(affrun("sbatch", "--config", str(path), "--", "train.py"), str(path))


LONG = "x" * 100_000  # a file name no file system takes (ENAMETOOLONG), echoed back in the error line
NAMED_FILES: dict[str, tuple[list[str], dict[str, str]]] = {
    "plan --topology": (["plan", "--topology", LONG], {}),
    "show --topology": (["show", "--topology", LONG], {}),
    "doctor --topology": (["doctor", "--topology", LONG], {}),
    "sbatch --config": (["sbatch", "--config", LONG, "--", "train.py"], {}),
    "sbatch --template": (["sbatch", "--template", LONG, "--", "train.py"], {}),
    "AFFRUN_CONFIG": (["sbatch", "--", "train.py"], {"AFFRUN_CONFIG": LONG}),
}


@pytest.mark.parametrize("case", list(NAMED_FILES))
def test_an_overlong_file_name_is_not_echoed_whole(case: str) -> None:
    args, env = NAMED_FILES[case]
    line = refused(affrun(*args, env=env))
    assert "x" * 100 in line and " ... " in line  # the start and the end of the name, the middle cut


def test_an_overlong_command_name_is_not_echoed_whole() -> None:
    """exec's own failure (the shell's 126/127, not 2) is one bounded line too."""
    for command in ("./" + "x" * 5000, "x" * 200 + "-no-such-command"):
        proc = affrun("exec", "--", command)
        (line,) = [x for x in proc.stderr.splitlines() if x.startswith("affrun: error:")]
        assert proc.returncode in (126, 127) and len(line) < 500 and "Traceback" not in proc.stderr, proc.stderr[-500:]


def test_an_error_line_is_one_printable_line() -> None:
    """A command name with a vertical tab and U+2028 (line breaks to a terminal) is echoed with them replaced."""
    proc = affrun("exec", "--nproc-per-node", "1", "--local-rank", "0", "--", "no\x0bsuch\u2028x")
    assert proc.stderr.splitlines() == ["affrun: error: no?such?x: command not found"], proc.stderr
    assert proc.returncode == 127


def test_an_unknown_profile_lists_a_few_of_many(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("profiles:\n" + "".join(f"  p{i:040d}: {{}}\n" for i in range(20_000)))
    line = refused(affrun("sbatch", "--config", str(path), "--profile", "nope", "--", "train.py"), "no such profile")
    assert "and 19990 more" in line


def test_date_like_yaml_values_stay_strings(tmp_path: Path) -> None:
    """YAML would read these as dates (and 2001-02-30 as an error): to sbatch they are strings."""
    path = tmp_path / "config.yaml"
    path.write_text("defaults:\n  job-name: 2001-02-30\n  account: 2026-12-01\n")
    proc = affrun("sbatch", "--config", str(path), "--", "train.py")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --job-name=2001-02-30\n" in proc.stdout and "#SBATCH --account=2026-12-01\n" in proc.stdout


# ---------------------------------------------------------------------------------------------- hangs
@pytest.mark.parametrize("relative", [f"{CPU}/cpu2/online", f"{CPU}/cpu0/topology/core_id",
                                      f"{CPU}/cpu0/topology/thread_siblings", f"{CPU}/cpu3/topology/core_siblings",
                                      f"{NODE}/node0/cpumap", f"{NODE}/node0/meminfo"])
def test_fifo_in_the_tree_is_refused_not_waited_on(tree: Path, relative: str) -> None:
    target = tree / relative
    if not target.exists():
        pytest.skip(f"{relative} is not in {TREE}")  # pragma: no cover - the fixture has them all
    fifo(target)
    refused(plan_json(["--fsroot", str(tree)]), "not a regular file")


def test_dev_zero_in_the_tree_is_refused(tree: Path) -> None:
    online = tree / CPU / "cpu2/online"
    online.unlink()
    online.symlink_to("/dev/zero")  # under --fsroot, a link out of the tree reads as absent: never opened
    planned(plan_json(["--fsroot", str(tree)]))
    (tree / "dev").mkdir()
    try:
        os.mknod(tree / "dev/zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    except PermissionError:  # pragma: no cover - a device node needs CAP_MKNOD
        pytest.skip("making a device node needs root")
    planned(plan_json(["--fsroot", str(tree)]))  # the tree's own dev/zero is not where an absolute link leads
    online.unlink()
    online.symlink_to(os.path.relpath(tree / "dev/zero", online.parent))  # the tree's own device: refused
    refused(plan_json(["--fsroot", str(tree)]), "not a regular file")


def test_fifo_and_devices_as_named_files(tmp_path: Path) -> None:
    pipe = fifo(tmp_path / "pipe.json")
    refused(plan_json(["--topology", str(pipe)]), "not a regular file")
    refused(plan_json(["--topology", "/dev/zero"]), "not a regular file")
    refused(affrun("sbatch", "--config", str(pipe), "--", "train.py"), "not a regular file")
    refused(affrun("sbatch", "--config", "/dev/zero", "--", "train.py"), "not a regular file")
    refused(affrun("sbatch", "--template", str(pipe), "--", "train.py"), "--template", "not a regular file")
    refused(dry_exec("--local-rank", "0", "--nproc-per-node", "1", env={"AFFRUN_PLAN": f"@{pipe}"}), "no longer reads")
    assert stat.S_ISFIFO(os.stat(pipe).st_mode)


@pytest.mark.parametrize("mode", ["numa", "socket", "exclusive", "l3"])
@pytest.mark.parametrize("nproc", ["1000000", "100000000", "9" * 30])
def test_absurd_rank_counts_are_one_line_fast(tree: Path, mode: str, nproc: str) -> None:
    # above one rank per CPU id affrun accepts: refused as the option is read, as by affrun exec (below)
    refused(plan_json(["--fsroot", str(tree)], "--nproc-per-node", nproc, "--mode", mode), "--nproc-per-node",
            "from 0 to 65536")


def test_absurd_rank_count_through_exec(tree: Path) -> None:
    refused(affrun("exec", "--fsroot", str(tree), "--dry-run", "--nproc-per-node", "60000", "--local-rank", "0",
                   "--mode", "numa", "--", "true"), "more ranks than")
    # above one rank per CPU id affrun accepts, no machine could hold it: refused as the option is read
    refused(affrun("exec", "--fsroot", str(tree), "--dry-run", "--nproc-per-node", "1000000", "--local-rank", "0",
                   "--mode", "numa", "--", "true"), "from 0 to 65536")


# ---------------------------------------------------------------------------------------------- arguments
def probe_words(stdout: str) -> list[bytes]:
    (line,) = [line for line in stdout.splitlines() if line.startswith('{"argv_hex"')]
    return [bytes.fromhex(h) for h in json.loads(line)["argv_hex"]]


def words_for(tmp_path: Path) -> list[bytes]:
    return [w.replace(b"CANARY", os.fsencode(tmp_path / "canary")) for w in WORDS]


@pytest.mark.torch
@pytest.mark.parametrize("separator", [[], ["--"]], ids=["plain", "double-dash-before-script"])
def test_torchrun_passes_every_word_after_the_script(tmp_path: Path, separator: list[str]) -> None:
    words = words_for(tmp_path)
    proc = affrun("torchrun", "--nproc-per-node", "1", "--standalone", *separator, str(ARGV_PROBE), *words,
                  cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert probe_words(proc.stdout) == words
    assert not (tmp_path / "canary").exists()


@pytest.mark.torch
def test_torchrun_abbreviated_options_before_the_script_still_work(tmp_path: Path) -> None:
    proc = affrun("torchrun", "--nproc-per", "1", "--affrun-dry", str(ARGV_PROBE), "--n", "--a", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.rstrip().endswith(f"-u {ARGV_PROBE} --n --a"), proc.stdout


def test_exec_passes_every_word(tmp_path: Path) -> None:
    words = words_for(tmp_path)
    proc = affrun("exec", "--cpus", "0", "--", sys.executable, str(ARGV_PROBE), *words, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert probe_words(proc.stdout) == words
    assert not (tmp_path / "canary").exists()


SRUN_STUB = """#!/bin/bash
# Stands in for srun only to show which words bash hands it: one per line, hex.
for word in "$@"; do printf '%s' "$word" | od -An -v -tx1 | tr -d ' \\n'; echo; done
"""


@pytest.mark.parametrize("style", ["srun", "torchrun"])
def test_sbatch_scripts_hand_every_word_to_srun(tmp_path: Path, style: str) -> None:
    """What bash makes of the rendered script: the words after the command are the user's, byte for byte. (The
    Slurm cluster tests run both styles for real, with these words.)"""
    words = words_for(tmp_path)
    command = [sys.executable, str(ARGV_PROBE)] if style == "srun" else [str(ARGV_PROBE)]
    script = tmp_path / "job.sbatch"
    made = affrun("sbatch", "--style", style, "--gpus-per-node", "1", "-o", str(script), "--", *command, *words)
    assert made.returncode == 0, made.stderr
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in (("srun", SRUN_STUB), ("scontrol", "#!/bin/sh\necho node1\n")):
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node1", "SLURM_CPUS_ON_NODE": "2",
           "SLURM_JOB_ID": "7", "SLURM_NNODES": "1"}
    proc = subprocess.run(["bash", str(script)], env=clean_env(**env), capture_output=True, timeout=BOUND, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    handed = [bytes.fromhex(line) for line in proc.stdout.decode().split("\n")[:-1]]
    assert handed[-len(words) - len(command):] == [os.fsencode(c) for c in command] + words
    assert not (tmp_path / "canary").exists()


def test_submitit_task_gets_every_word(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from submitit.helpers import CommandFunction

    from launcher.submitit import AffinityExecutor

    for name in list(os.environ):
        if name.startswith(("OMP_", "KMP_", "AFFRUN_", "SLURM_", "SUBMITIT_", "LOCAL_RANK", "LOCAL_WORLD_SIZE")):
            monkeypatch.delenv(name)
    words = [os.fsdecode(w) for w in words_for(tmp_path)]
    ex = AffinityExecutor(folder=tmp_path / "%j", cluster="local")
    ex.update_parameters(tasks_per_node=1, timeout_min=2)
    job = ex.submit(CommandFunction([sys.executable, str(ARGV_PROBE), *words], cwd=str(tmp_path)))
    deadline = time.monotonic() + 120
    while not job.done():
        assert time.monotonic() < deadline, job.stderr()
        time.sleep(0.2)
    assert probe_words(job.result()) == [os.fsencode(w) for w in words]
    assert not (tmp_path / "canary").exists()


@pytest.mark.parametrize("args", [
    ["exec", "--dry-run", "--nproc-per-node", "2", "--local-rank", "0", "--", "true"],
    ["run", "--dry-run", "--nproc-per-node", "2", "--", "true"],
    ["plan", "--nproc-per-node", "2"],
    ["topology", "--json"],
], ids=["exec", "run", "plan", "topology"])
def test_a_reader_that_left_is_exit_1_not_a_traceback(args: list[str]) -> None:
    """`affrun ... | head`: stdout is a pipe whose reader is gone (closed before affrun starts, so every write
    fails). Like any command-line tool, affrun stops with status 1 and says nothing more."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(affrun_argv(*args), stdout=write_end, stderr=subprocess.PIPE, text=True,
                              env=clean_env(), timeout=60)
    finally:
        os.close(write_end)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
