"""Newer OpenMP runtimes and what affrun already says and does about them, shown with the real libraries.

- LLVM libomp 16 binds a fork()ed child's team compact (one thread per CPU, the child's main thread on the first)
  even when nothing asked for binding (llvm-project issue #91098, fixed by PR #91391 for later releases). 14
  does not. affrun's explicit places keep the child's main thread on the whole rank (libomp 14 instead aborts
  fork() children under explicit places, affrun's included: a bug of 14 that docs/runtimes.md records).
- intel-openmp 2025 and later abort fork()ed children under KMP_AFFINITY=disabled (OMP: Error #13, assertion
  failure in kmp_affinity.cpp); ``affrun doctor`` says so and affrun's env policy replaces the value.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launcher.doctor.facts import intel_openmp_version
from tests.conftest import need
from tests.launch import (
    PROGRAMS,
    affrun_argv,
    clean_env,
    compile_omp,
    display_affinity_env,
    run,
    thread_bindings,
)

NCPU = len(os.sched_getaffinity(0))
FORK_PROBE = PROGRAMS / "omp_fork_probe.c"


def child_team(output: str) -> dict[int, frozenset[int]]:
    """The forked child's team bindings: the threads of the second pid that printed any."""
    teams = thread_bindings(output)
    assert len(teams) == 2, output
    return teams[sorted(teams)[1]]


@pytest.mark.parametrize("version", [14, 16])
def test_libomp_forked_child_binding_with_and_without_affrun(tmp_path: Path, version: int) -> None:
    need(NCPU >= 2, "needs 2 CPUs to tell a compact binding from none")
    binary = compile_omp(tmp_path, f"omp{version}", FORK_PROBE)
    plain = run([str(binary), "team"], env=clean_env(OMP_NUM_THREADS=str(NCPU), **display_affinity_env()),
                check=True)
    team = child_team(plain.stdout)
    if version == 16:  # bound compact although no variable asked for it: the child's main thread on one CPU
        assert all(len(cpus) == 1 for cpus in team.values()) and len(team[0]) == 1, plain.stdout
    else:
        assert all(cpus == os.sched_getaffinity(0) for cpus in team.values()), plain.stdout
    ours = run(affrun_argv("exec", "--", str(binary), "team"), env=clean_env(**display_affinity_env()), check=True)
    if version == 14:  # its own bug: explicit OMP_PLACES (affrun's) abort fork() children (docs/runtimes.md)
        assert "forked_status=0" not in ours.stdout, ours.stdout
        return
    team = child_team(ours.stdout)
    assert team[0] == os.sched_getaffinity(0), ours.stdout  # the child's main thread keeps the whole rank
    assert "forked_status=0" in ours.stdout


def test_intel_openmp_2025_kmp_disabled_aborts_forked_children_and_affrun_says_so(tmp_path: Path) -> None:
    version = intel_openmp_version()
    need(version, "intel-openmp is not installed (pip install intel-openmp)")
    assert version is not None
    need(int(version.split(".")[0]) >= 2025, f"intel-openmp {version} predates the abort (2025.0)")
    binary = compile_omp(tmp_path, "iomp5", FORK_PROBE)
    # the runtime fact itself, on this machine
    broken = run([str(binary)], env=clean_env(KMP_AFFINITY="disabled"))
    assert "forked_status=0" not in broken.stdout and "Assertion failure" in broken.stdout + broken.stderr
    # doctor says so, naming the version and the DataLoader symptom
    doctor = run(affrun_argv("doctor", "--json"), env=clean_env(KMP_AFFINITY="disabled"))
    found = {f["id"]: f for f in json.loads(doctor.stdout)["findings"]}["kmp-affinity-disabled"]
    assert found["severity"] == "error" and version in found["why"] and "Aborted" in found["why"]
    # the env policy replaces the value, and the same program's forked child lives
    dry = run(affrun_argv("exec", "--dry-run", "--verbose", "--", str(binary)), env=clean_env(KMP_AFFINITY="disabled"),
              check=True)
    assert "KMP_AFFINITY=granularity=fine" in dry.stdout and "KMP_AFFINITY=disabled replaced" in dry.stdout
    fixed = run(affrun_argv("exec", "--", str(binary)), env=clean_env(KMP_AFFINITY="disabled"), check=True)
    assert "forked_status=0" in fixed.stdout
