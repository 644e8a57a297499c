"""The binding variables users export (HPC modules, container images) never confine the job: real torchrun, real
ranks, real DataLoader workers, under torch's libgomp and with libiomp5 or LLVM libomp 14/16 preloaded into torch.

With any of these variables set, torch's libgomp pins the thread that loads it to one CPU; a launcher that imports
torch (torchrun's agent) then hands that one CPU to every rank. ``affrun torchrun`` imports torch without them and
gives them back to the ranks, whose env policy judges them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from launcher.base.cpulist import parse_cpulist
from tests.launch import (
    PROGRAMS,
    TORCH_RUNTIMES,
    affrun_argv,
    clean_env,
    json_lines,
    need,
    rank_lines,
    run,
    runtime_env,
    torchrun_argv,
)

pytestmark = pytest.mark.torch
NCPU = len(os.sched_getaffinity(0))
PROBE = str(PROGRAMS / "loader_probe.py")
# Every spelling of "bind" the issue met in the wild; each one alone pinned plain torchrun's agent to CPU 0.
EXPORTED = {
    "proc-bind-close": {"OMP_PROC_BIND": "close"},
    "places-cores": {"OMP_PLACES": "cores"},
    "spread-threads": {"OMP_PROC_BIND": "spread", "OMP_PLACES": "threads"},
    "gomp-cpu-affinity": {"GOMP_CPU_AFFINITY": f"0-{NCPU - 1}"},
    "proc-bind-true": {"OMP_PROC_BIND": "true"},
}


@pytest.fixture(autouse=True)
def _two_cpus() -> None:
    need(NCPU >= 2, "needs 2 CPUs: a collapse onto one CPU cannot show on one")


def start_method(runtime: str) -> str:
    # LLVM libomp 14 aborts fork() children after a parallel region when OMP_PLACES is an explicit list (see
    # test_libomp14_aborts_forked_children_of_explicit_places): its workers are started by the forkserver.
    return "forkserver" if runtime == "libomp14" else "fork"


def job(nproc: int, variables: dict[str, str], runtime: str, *prefix: str) -> list[dict[str, Any]]:
    env = clean_env(**variables, **runtime_env(runtime))
    argv = [*prefix, *affrun_argv("torchrun", "--nproc-per-node", str(nproc), PROBE, "plain", "2",
                                  start_method(runtime))]
    proc = run(argv, env=env, timeout=240, check=True)
    reports = sorted(json_lines(proc.stdout), key=lambda r: r["local_rank"])
    assert [r["local_rank"] for r in reports] == list(range(nproc)), proc.stderr
    assert len(rank_lines(proc.stderr)) == nproc
    return reports


def check_ranks(reports: list[dict[str, Any]], allowed: frozenset[int]) -> None:
    """Disjoint ranks sharing ``allowed`` evenly; every rank's main thread on all of it, its DataLoader workers too,
    together."""
    masks = [parse_cpulist(r["cpus_allowed_list"]) for r in reports]
    assert sum(len(m) for m in masks) == len(frozenset().union(*masks)), f"ranks overlap: {masks}"
    assert frozenset().union(*masks) == allowed, masks
    assert all(len(m) == len(allowed) // len(reports) for m in masks), masks
    for r, mask in zip(reports, masks):
        assert parse_cpulist(r["rank_cpus"]) == mask and set(r["main"]) == mask
        assert len(r["workers"]) == 2  # each on its home (the rank's hooks), together on all of the rank
        assert all(set(w) <= mask for w in r["workers"]) and set().union(*map(set, r["workers"])) == mask, \
            f"workers collapsed: {r['workers']} in rank {sorted(mask)}"


# Every spelling under every runtime with one rank; two ranks (the split between them) once per runtime: what the
# spelling changes is where the launcher's import of torch pins it, which one rank shows (40 torchrun jobs were 7 min).
CASES = [(name, 1, runtime) for runtime in TORCH_RUNTIMES for name in EXPORTED] + [
    ("proc-bind-close", 2, runtime) for runtime in TORCH_RUNTIMES]


@pytest.mark.parametrize(("name", "nproc", "runtime"), CASES)
def test_exported_binding_variables_do_not_confine_the_job(name: str, nproc: int, runtime: str) -> None:
    reports = job(nproc, EXPORTED[name], runtime)
    check_ranks(reports, frozenset(os.sched_getaffinity(0)))
    for r in reports:  # the variables reached the ranks, where the env policy judged them
        assert r["env"].get("OMP_PLACES") and r["env"]["OMP_PROC_BIND"]
        if runtime != "libgomp":
            assert r["env"]["LD_PRELOAD"] == runtime_env(runtime)["LD_PRELOAD"]


def test_plain_torchrun_is_confined_by_the_same_variable() -> None:
    """The baseline: torchrun's agent imports torch, libgomp pins it, and both ranks inherit CPU 0."""
    proc = run(torchrun_argv("--nproc-per-node", "2", PROBE, "plain", "1"), env=clean_env(OMP_PROC_BIND="close"),
               timeout=240, check=True)
    masks = {r["cpus_allowed_list"] for r in json_lines(proc.stdout)}
    assert len(masks) == 1 and len(parse_cpulist(masks.pop())) == 1


def test_the_mask_the_user_gave_is_still_honoured() -> None:
    """taskset narrows the job; the exported variable does not narrow it further."""
    last = max(os.sched_getaffinity(0))
    reports = job(1, {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}, "libgomp", "taskset", "-c", str(last))
    check_ranks(reports, frozenset({last}))


def test_kept_user_values_reach_the_ranks_unchanged() -> None:
    """OMP_PROC_BIND=spread is safe for a rank: the agent hid it from its own import, the rank still has it."""
    (report,) = job(1, {"OMP_PROC_BIND": "spread"}, "libgomp")
    assert report["env"]["OMP_PROC_BIND"] == "spread"


def test_libomp14_aborts_forked_children_of_explicit_places(tmp_path: Any) -> None:
    """A runtime bug affrun documents (docs/runtimes.md) and cannot fix from outside: LLVM libomp 14 kills a
    fork() child (heap corruption in its at-fork handler) once a parallel region ran with OMP_PLACES an explicit
    list, affrun's own value included. libomp 16 is fine, and so are forkserver and spawn workers."""
    whole = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    env = clean_env(OMP_PLACES=f"{{{whole}}}", **runtime_env("libomp14"))
    broken = subprocess.run([sys.executable, PROBE, "plain", "1", "fork"], env=env, capture_output=True, text=True,
                            timeout=240)
    assert broken.returncode != 0 and "killed by signal" in broken.stderr, broken.stderr[-2000:]
    env.update(runtime_env("libomp16"))
    fine = run([sys.executable, PROBE, "plain", "1", "fork"], env=env, timeout=240, check=True)
    assert json_lines(fine.stdout)
