"""test_sysfs_errors: the tests that start processes or load real runtimes (tests/system). The in-process ones are tests/unit/test_sysfs_errors.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.topology.sysfs import read_sysfs
from tests.errors import assert_one_line_exit_2
from tests.fakesys import uniform, write_tree
from tests.launch import affrun
from tests.machines import tree


def test_smt_sibling_of_a_cpu_with_a_known_package(tmp_path: Path) -> None:
    """cpu0 says its package is 0-2, so cpu1's package is known before cpu1 is read; cpu1 then names cpu3 as
    its SMT sibling (same core_id). cpu3 must join cpu1's package instead of having none (a KeyError once)."""
    root = write_tree(tmp_path / "root", uniform(1, 4))
    cpu_dir = root / "sys/devices/system/cpu"
    (cpu_dir / "cpu0/topology/package_cpus_list").write_text("0-2\n")
    for name in ("core_cpus_list", "thread_siblings_list"):
        (cpu_dir / f"cpu1/topology/{name}").write_text("1,3\n")
    (cpu_dir / "cpu3/topology/core_id").write_text("1\n")
    topo = read_sysfs(str(root))
    assert [c.pus for c in topo.cores] == [(0,), (1, 3), (2,)]
    assert sorted(topo.allowed) == [0, 1, 2, 3]
    assert set().union(*(p.cpus for p in topo.packages)) == {0, 1, 2, 3}
    result = affrun("topology", "--fsroot", str(root))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


def test_cli_fsroot_missing(tmp_path: Path) -> None:
    bad = tmp_path / "no-such-root"
    assert_one_line_exit_2(affrun("topology", "--fsroot", str(bad)), str(bad))


def test_cli_fsroot_without_sysfs(tmp_path: Path) -> None:
    assert_one_line_exit_2(affrun("topology", "--fsroot", str(tmp_path)), str(tmp_path / "sys/devices/system/cpu"))


@pytest.mark.parametrize("command", ["topology", "plan", "show"])
def test_cli_garbage_in_a_cpulist(tmp_path: Path, command: str) -> None:
    root = tree(tmp_path)
    online = root / "sys/devices/system/cpu/online"
    online.write_text("banana\n")
    assert_one_line_exit_2(affrun(command, "--fsroot", str(root)), str(online), "not a cpu list")


def test_cli_bad_cpus(tmp_path: Path) -> None:
    assert_one_line_exit_2(affrun("topology", "--fsroot", str(tree(tmp_path)), "--cpus", "x-y"), "--cpus")


@pytest.mark.parametrize(
    "args",
    [
        ["exec", "--cpus", "0-99999999", "--", "true"],
        ["exec", "--reserve", "0-99999999", "--", "true"],
        ["exec", "--map", "0-99999999", "--", "true"],
        ["plan", "--cpus", "0-99999999"],
        ["plan", "--map", "0-3;0-99999999:2/4"],
        ["topology", "--cpus", "99999999"],
    ],
)
def test_cli_huge_cpu_ids_are_refused_at_once(tmp_path: Path, args: list[str]) -> None:
    """0-99999999 once built a set of 100 million ids (minutes, gigabytes) before failing or running."""
    command, option, *rest = args
    result = affrun(command, "--fsroot", str(tree(tmp_path)), option, *rest)
    assert_one_line_exit_2(result, option, "cpu id 99999999 is above 65535")


def test_cli_huge_cpu_id_in_a_sysfs_file_names_the_file(tmp_path: Path) -> None:
    root = tree(tmp_path)
    node = root / "sys/devices/system/node/node1/cpulist"
    node.write_text("8-99999999\n")
    assert_one_line_exit_2(affrun("topology", "--fsroot", str(root)), str(node), "cpu id 99999999 is above 65535")


def test_exec_with_a_huge_omp_places_replaces_it_at_once(tmp_path: Path) -> None:
    result = affrun("exec", "--fsroot", str(tree(tmp_path)), "--dry-run", "--", "true",
                    env={"OMP_PLACES": "{0:100000000}"})
    assert result.returncode == 0, result.stderr
    assert "OMP_PLACES={0:100000000} replaced by" in result.stdout + result.stderr
