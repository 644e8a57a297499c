"""test_doctor_env: the tests that start processes or load real runtimes (tests/system). The in-process ones are tests/unit/test_doctor_env.py."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from launcher.base.slurm_step import parse_version, srun_inherits_cpus_per_task
from launcher.doctor.facts import (
    torch_openmp,
)
from launcher.doctor.findings import CATALOGUE
from tests.conftest import need
from tests.doctor_run import SECCOMP_WRAPPER, doctor
from tests.launch import clean_env


def test_torch_bundled_runtime_is_what_import_torch_loads() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        need(False, "torch is not installed")
    names, source = torch_openmp()
    code = "import torch; from launcher.base.procfs import libraries; print('\\n'.join(libraries()))"
    paths = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env=clean_env()).stdout.splitlines()
    loaded = [p for p in paths if "omp" in os.path.basename(p)]
    assert names == ("libgomp",)
    assert any(os.path.realpath(p) in {os.path.realpath(x) for x in loaded} for p in source.split()[-1:]), (
        source, loaded)


def test_membind_blocked_by_a_real_seccomp_filter(tmp_path: Path) -> None:
    need(platform.machine() == "x86_64", "the seccomp filter here is written for x86_64")
    wrapper = tmp_path / "deny_mempolicy.py"
    wrapper.write_text(SECCOMP_WRAPPER)
    argv = [sys.executable, str(wrapper), str(0xC000003E), "238", sys.executable, "-m", "launcher", "doctor", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, env=clean_env())
    data = json.loads(done.stdout)
    blocked = [f for f in data["findings"] if f["id"] == "membind-blocked"]
    assert len(blocked) == 1 and "Operation not permitted" in blocked[0]["message"]
    assert blocked[0]["severity"] == ("warning" if data["machine"]["numa_nodes"] > 1 else "info")
    # numactl itself is refused the same way under that filter: the probe tells the truth
    if shutil.which("numactl"):
        numactl = subprocess.run([sys.executable, str(wrapper), str(0xC000003E), "238", shutil.which("numactl") or "",
                                  "--membind=0", "true"], capture_output=True, text=True)
        assert numactl.returncode != 0
    # without the filter the probe passes
    plain = json.loads(subprocess.run([sys.executable, "-m", "launcher", "doctor", "--json"], capture_output=True,
                                      text=True, env=clean_env()).stdout)
    assert "membind-blocked" not in {f["id"] for f in plain["findings"]}


def test_json_contract_and_exit_status() -> None:
    env = {**clean_env(), "KMP_AFFINITY": "disabled", "OMP_NUM_THREADS": "8", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "2"}
    code, out = doctor("--json", env=env)
    data = json.loads(out)
    assert code == 1
    for f in data["findings"]:
        assert set(f) >= {"id", "severity", "message", "fix"}
        assert f["id"] in CATALOGUE and f["severity"] in ("error", "warning", "info")
    found = {f["id"] for f in data["findings"]}
    assert "omp-oversubscribed" in found and "kmp-ignored-by-libgomp" in found
    assert data["environment"]["KMP_AFFINITY"] == "disabled"
    assert data["rank"]["local_ranks"] == 2
    assert doctor("--fail-on", "error", env=env)[0] == 1
    clean = {**clean_env(), "OMP_NUM_THREADS": "1"}
    code, out = doctor("--json", env=clean)
    assert (code, [f for f in json.loads(out)["findings"] if f["severity"] != "info"]) == (0, [])


def test_console_script_is_the_ci_guard() -> None:
    """``affrun doctor --fail-on error`` through the installed console script, as CI runs it."""
    affrun = shutil.which("affrun")
    need(affrun, "the affrun console script is not installed (pip install -e .)")
    bad = subprocess.run([str(affrun), "doctor", "--fail-on", "error"], capture_output=True, text=True,
                         env={**clean_env(), "OMP_PLACES": "cores", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"})
    assert bad.returncode == 1, bad.stdout
    line = next(x for x in bad.stdout.splitlines() if x.startswith("error   collapse-risk"))
    assert "-- why:" in line and "-- fix:" in line
    good = subprocess.run([str(affrun), "doctor", "--fail-on", "error"], capture_output=True, text=True,
                          env=clean_env())
    assert good.returncode == 0, good.stdout


def test_numactl_missing_from_path() -> None:
    need(shutil.which("numactl"), "numactl is not installed")
    env = {**clean_env(), "PATH": "/nonexistent"}
    found = {f["id"] for f in json.loads(doctor("--json", env=env)[1])["findings"]}
    assert "numactl-missing" in found
    assert "numactl-missing" not in {f["id"] for f in json.loads(doctor("--json", env=clean_env())[1])["findings"]}


def test_srun_version_is_asked_for_real() -> None:
    need(shutil.which("srun"), "Slurm's srun is not installed")
    version = parse_version(subprocess.run(["srun", "--version"], capture_output=True, text=True).stdout)
    assert version
    env = {**clean_env(), "SLURM_CPUS_PER_TASK": "4"}
    found = {f["id"] for f in json.loads(doctor("--json", env=env)[1])["findings"]}
    assert ("srun-cpus-per-task" in found) is not srun_inherits_cpus_per_task(version)
    found = {f["id"] for f in json.loads(doctor("--json", env={**env, "SRUN_CPUS_PER_TASK": "4"})[1])["findings"]}
    assert "srun-cpus-per-task" not in found
