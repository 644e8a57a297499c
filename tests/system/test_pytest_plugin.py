"""The pytest plugin, as a project uses it: pytest runs on a copy of examples/ci_guard in a fresh process."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.pytest_plugin import assert_launch_environment_safe, load_env_file
from tests.launch import clean_env

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ci_guard"


def project(tmp_path: Path) -> Path:
    dest = tmp_path / "project"
    shutil.copytree(EXAMPLE, dest)
    return dest


def pytest_in(path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=path,
                          capture_output=True, text=True, env=clean_env(**env), timeout=300)


def test_the_example_project_passes(tmp_path: Path) -> None:
    done = pytest_in(project(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_an_unsafe_launch_environment_fails_the_project(tmp_path: Path) -> None:
    path = project(tmp_path)
    env_file = path / "launch.env"
    env_file.write_text(env_file.read_text().replace("OMP_NUM_THREADS=4", "OMP_NUM_THREADS=16")
                        + "export OMP_PLACES=cores\n")
    done = pytest_in(path)
    assert done.returncode == 1
    assert "1 failed" in done.stdout
    assert "error   omp-oversubscribed: OMP_NUM_THREADS=16 × 8 ranks = 128 threads on 64 CPUs" in done.stdout
    assert "error   collapse-risk" in done.stdout


def test_guard_option_audits_the_running_environment(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.mkdir()
    (path / "test_nothing.py").write_text("def test_nothing():\n    assert 1 + 1 == 2\n")
    bad = pytest_in(path, "-p", "launcher.pytest_plugin", "--affrun-guard", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2",
                    OMP_PLACES="cores")
    assert bad.returncode == 1
    assert "affrun guard: unsafe launch environment" in bad.stdout + bad.stderr
    assert "collapse-risk" in bad.stdout + bad.stderr
    assert "1 passed" not in bad.stdout  # stopped before any test ran
    good = pytest_in(path, "-p", "launcher.pytest_plugin", "--affrun-guard")
    assert good.returncode == 0 and "1 passed" in good.stdout
    (path / "pytest.ini").write_text("[pytest]\naffrun_guard = error\n")
    assert pytest_in(path, "-p", "launcher.pytest_plugin", OMP_PLACES="cores", LOCAL_RANK="0",
                     LOCAL_WORLD_SIZE="2").returncode == 1


def test_helpers_directly(tmp_path: Path) -> None:
    env_file = tmp_path / "job.env"
    env_file.write_text("# comment\nexport OMP_NUM_THREADS=8\nKMP_AFFINITY='granularity=fine,compact'  # why\n\n")
    assert load_env_file(env_file) == {"OMP_NUM_THREADS": "8", "KMP_AFFINITY": "granularity=fine,compact"}
    (tmp_path / "bad.env").write_text("this is not a variable\n")
    with pytest.raises(ValueError, match=r"bad\.env:1"):
        load_env_file(tmp_path / "bad.env")
    machine = EXAMPLE / "machine.json"
    found = assert_launch_environment_safe({"OMP_NUM_THREADS": "4"}, nproc_per_node=8, topology=machine,
                                           openmp=["libgomp"])
    assert found == []
    with pytest.raises(AssertionError, match="kmp-affinity-disabled"):
        assert_launch_environment_safe({"OMP_NUM_THREADS": "4", "KMP_AFFINITY": "disabled"}, nproc_per_node=8,
                                       topology=machine, openmp=["libiomp5"])
    with pytest.raises(AssertionError, match="omp-threads-one"):
        assert_launch_environment_safe({"OMP_NUM_THREADS": "1", "TORCHELASTIC_RUN_ID": "1"}, fail_on="warning",
                                       nproc_per_node=8, topology=machine, openmp=["libgomp"])
