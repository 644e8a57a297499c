"""test_env: the tests that start processes or load real runtimes (tests/system). The in-process ones are tests/unit/test_env.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from launcher.base.cpulist import parse_cpulist
from launcher.env.omp_syntax import parse_places
from launcher.env.policy import (
    variable_problem,
)
from launcher.plan.planner import RankPlan
from tests.conftest import need
from tests.launch import compile_omp
from tests.omp import GOMP_LINE, HOSTILE, IOMP_LINE, OMP_SOURCE, PLACES_SAMPLES, live_rank, run_rank


@pytest.fixture(scope="module")
def omp_binaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same OpenMP program built against libgomp (gcc -fopenmp), and linked directly to Intel's libiomp5
    and to LLVM's libomp (tests.launch.compile_omp says why)."""
    out = tmp_path_factory.mktemp("omp")
    src = out / "probe.c"
    src.write_text(OMP_SOURCE)
    return {"libgomp": compile_omp(out, "gomp", src), "libiomp5": compile_omp(out, "iomp5", src),
            "libomp": compile_omp(out, "omp14", src), "libomp16": compile_omp(out, "omp16", src)}


def test_parse_places_agrees_with_libgomp(omp_binaries: dict[str, Path]) -> None:
    """Every sample that parse_places rejects, libgomp rejects ("Invalid value for environment variable
    OMP_PLACES"), and every one it accepts, libgomp accepts."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_"))}
    disagree = []
    for value in PLACES_SAMPLES:
        proc = subprocess.run([str(omp_binaries["libgomp"])], env={**base, "OMP_PLACES": value, "OMP_NUM_THREADS": "1"},
                              capture_output=True, text=True, timeout=60, check=False)
        rejected = "Invalid value for environment variable OMP_PLACES" in proc.stderr
        if rejected != (parse_places(value) is None):
            disagree.append((value, proc.stderr.strip(), parse_places(value)))
    assert not disagree


def test_a_range_in_omp_places_pins_the_main_thread_in_libgomp(omp_binaries: dict[str, Path]) -> None:
    """Why ``{0-1}`` is dangerous, not just ignored: libgomp drops it and, with OMP_PROC_BIND=close (which
    affrun sets), binds one thread per CPU, the main thread included."""
    allowed = sorted(os.sched_getaffinity(0))
    need(len(allowed) >= 2, "needs 2 CPUs in this process's affinity mask")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_"))}
    env = {**base, "OMP_PLACES": f"{{{allowed[0]}-{allowed[1]}}}", "OMP_PROC_BIND": "close", "OMP_NUM_THREADS": "2"}
    proc = subprocess.run([str(omp_binaries["libgomp"])], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert "Invalid value for environment variable OMP_PLACES" in proc.stderr
    bound = [parse_cpulist(cpus) for _, cpus in GOMP_LINE.findall(proc.stderr + proc.stdout)]  # libgomp: stderr
    assert len(bound) == 2 and all(len(cpus) == 1 for cpus in bound), proc.stderr
    rank = RankPlan(0, tuple(allowed[:2]), ((allowed[0],), (allowed[1],)), (), None, None, (), (), 2)
    problem = variable_problem("OMP_PLACES", env["OMP_PLACES"], frozenset(rank.cpus))
    assert problem == "not a valid OMP_PLACES value"


@pytest.mark.parametrize("runtime", ["libgomp", "libiomp5", "libomp", "libomp16"])
@pytest.mark.parametrize("user_env", [{}, HOSTILE], ids=["clean", "hostile"])
@pytest.mark.parametrize(("cpus", "bind"), [("1", "rank"), ("all", "rank"), ("all", "core")])
def test_real_runtime_binds_every_thread_inside_the_rank(
    omp_binaries: dict[str, Path], runtime: str, user_env: dict[str, str], cpus: str, bind: str
) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    need(len(allowed) >= 2 and 1 in allowed, "needs CPUs 0 and 1 in this process's affinity mask")
    rank = live_rank("1" if cpus == "1" else ",".join(map(str, allowed)))
    if cpus == "1":
        assert rank.cpus == (1,) and rank.threads == 1
    output = run_rank(omp_binaries[runtime], rank, user_env, bind)
    assert f"team={rank.threads} " in output, output
    # Each thread reports twice (OMP_DISPLAY_AFFINITY and omp_display_affinity): one entry per thread.
    if runtime == "libgomp":
        reports = {thread: parse_cpulist(cpus) for thread, cpus in GOMP_LINE.findall(output)}
    else:
        reports = {thread: parse_cpulist(cpus) for thread, cpus in IOMP_LINE.findall(output)}
        assert "Warning #182" not in output, output
        assert "OMP: Error" not in output, output
    bound = list(reports.values())
    assert len(bound) == rank.threads, output
    for cpuset in bound:
        assert cpuset and cpuset <= set(rank.cpus), f"a thread is bound to {sorted(cpuset)}, outside {rank.cpus}"
    if bind == "core":  # the main thread on the rank's whole set, every other thread on a core of its own
        whole = [s for s in bound if s == set(rank.cpus)]
        pinned = sorted(min(s) for s in bound if len(s) == 1)
        assert len(whole) == 1 and len(whole) + len(pinned) == len(bound), output
        assert pinned == sorted(min(core) for core in rank.compute_cores[1:]), output
    else:  # one place: every thread may use all compute CPUs
        assert all(s == set(rank.compute_cpus) for s in bound), output
