"""Broken sysfs trees give one clear line naming the file, through the library and through the CLI (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.errors import TopologyError
from launcher.options.table import spell_error
from launcher.topology import load_topology
from launcher.topology.sysfs import read_sysfs
from tests.fakesys import uniform, write_tree
from tests.machines import tree


def one_line_error(root: Path, **kwargs: object) -> str:
    with pytest.raises(TopologyError) as info:
        read_sysfs(str(root), **kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_healthy_tree_reads(tmp_path: Path) -> None:
    topo = read_sysfs(str(tree(tmp_path)))
    assert len(topo.cores) == 8 and len(topo.allowed) == 16 and len(topo.numa_nodes) == 2


def test_missing_cpu_directory(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    (root / "sys/devices/system").mkdir(parents=True)
    message = one_line_error(root)
    assert str(root / "sys/devices/system/cpu") in message and "no such directory" in message


def test_cpu_directory_without_cpus(tmp_path: Path) -> None:
    root = tmp_path / "nocpus"
    (root / "sys/devices/system/cpu").mkdir(parents=True)
    assert "no cpuN entries" in one_line_error(root)


@pytest.mark.parametrize(
    ("relative", "garbage", "words"),
    [
        ("sys/devices/system/cpu/online", "0-3,zz", "not a cpu list"),
        ("sys/devices/system/cpu/cpu0/topology/core_cpus_list", "0-", "not a cpu list"),
        ("sys/devices/system/cpu/cpu0/topology/core_id", "seven", "expected an integer"),
        ("sys/devices/system/cpu/cpu0/topology/package_cpus_list", "0,,x", "not a cpu list"),
        ("sys/devices/system/node/node1/cpulist", "4-2", "not a cpu list"),
        ("sys/devices/system/cpu/cpu0/cache/index3/shared_cpu_list", "?", "not a cpu list"),
    ],
)
def test_garbage_names_the_file(tmp_path: Path, relative: str, garbage: str, words: str) -> None:
    root = tree(tmp_path)
    (root / relative).write_text(garbage + "\n")
    message = one_line_error(root)
    assert message.startswith(str(root / relative) + ":") and words in message


def test_garbage_mask_names_the_file(tmp_path: Path) -> None:
    root = tree(tmp_path)
    topology = root / "sys/devices/system/cpu/cpu0/topology"
    (topology / "core_cpus_list").unlink()
    (topology / "thread_siblings_list").unlink()
    (topology / "core_cpus").write_text("ffff,zz\n")
    message = one_line_error(root)
    assert message.startswith(str(topology / "core_cpus") + ":") and "not a cpu mask" in message


def test_empty_allowed_set_names_the_cpuset_file(tmp_path: Path) -> None:
    machine = uniform(1, 4)
    machine.cgroup_cpus = "40-47"  # a cpuset that names no CPU of this machine
    root = write_tree(tmp_path / "root", machine)
    message = one_line_error(root)
    assert message.startswith(str(root / "sys/fs/cgroup/job/cpuset.cpus.effective") + ":")
    assert "40-47" in message and "0-3" in message


def test_affinity_outside_online_cpus(tmp_path: Path) -> None:
    message = one_line_error(tree(tmp_path), allowed=frozenset({100}))
    assert "online" in message and "affinity" in message


def test_no_online_cpu_has_topology(tmp_path: Path) -> None:
    root = tree(tmp_path)
    for topology in (root / "sys/devices/system/cpu").glob("cpu*/topology"):
        for f in topology.iterdir():
            f.unlink()
        topology.rmdir()
    assert "no online CPU has a topology/ directory" in one_line_error(root)


def test_online_cpus_without_topology_are_dropped_with_a_warning(tmp_path: Path) -> None:
    root = tree(tmp_path)
    topology = root / "sys/devices/system/cpu/cpu3/topology"
    for f in topology.iterdir():
        f.unlink()
    topology.rmdir()
    topo = read_sysfs(str(root))
    assert 3 in topo.offline and 3 not in topo.allowed
    assert any("CPUs 3 are online but have no topology/" in w for w in topo.warnings)


@pytest.mark.parametrize(("cpus", "words"), [("abc", "not a cpu list"), ("200-210", "none of these CPUs is allowed")])
def test_bad_cpus_option(tmp_path: Path, cpus: str, words: str) -> None:
    with pytest.raises(TopologyError) as info:
        load_topology(fsroot=str(tree(tmp_path)), cpus=cpus, environ={})
    text = str(spell_error(info.value))  # as the command line prints it (the error names the option by key)
    assert text.startswith(f"--cpus {cpus}") or text.startswith(f"--cpus {cpus!r}")
    assert words in text and "\n" not in text


def test_fsroot_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(TopologyError, match="fsroot is not a directory"):
        load_topology(fsroot=str(f), environ={})


