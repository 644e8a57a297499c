"""``launcher.ensure_affinity()``: each case runs in a fresh interpreter, as at the top of a training script,
and checks what the runtimes then really do (torch's thread count, the main thread's and the workers' masks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from launcher.ensure import ENSURE_POLICIES as POLICIES
from launcher.ensure import ensure_affinity
from launcher.errors import ConfigError
from tests.conftest import need
from tests.launch import clean_env

CPUS = frozenset(os.sched_getaffinity(0))

REPORT = r"""
import json, os, sys, warnings
warnings.simplefilter("always")
BEFORE = os.environ.get("BEFORE", "")
if "torch" in BEFORE:
    import torch
if "numpy" in BEFORE:
    import numpy
from launcher import ensure_affinity
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        report = ensure_affinity(policy=os.environ.get("POLICY", "safe"))
        error = None
    except Exception as exc:
        report, error = getattr(exc, "report", None), type(exc).__name__
out = {"error": error, "warnings": [str(w.message) for w in caught if w.category.__name__ == "AffinityWarning"],
       "modules": sorted(m for m in ("click", "psutil", "torch", "numpy", "yaml", "submitit") if m in sys.modules)}
if report is not None:
    out.update(findings={f.id: f.severity for f in report.findings},
               changes=[[c.variable, c.old, c.new, c.finding] for c in report.changes],
               takes_effect=report.takes_effect, ok=report.ok, advice=report.advice, text=str(report),
               runtimes=[r.name for r in report.runtimes])
out["env"] = {k: os.environ.get(k) for k in ("KMP_AFFINITY", "OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND")}
AFTER = os.environ.get("AFTER", "")
if AFTER:
    import torch
    out["torch_threads"] = torch.get_num_threads()
    out["main_mask"] = sorted(os.sched_getaffinity(0))
    if "child" in AFTER:
        import subprocess
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, check=True)
        out["child_mask"] = json.loads(child.stdout)
print(json.dumps(out))
"""


def run_ensure(**env: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", REPORT], capture_output=True, text=True, env=clean_env(**env),
                          timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


# ----------------------------------------------------------------------------- the seed's own cases
def test_disabled_is_corrected() -> None:
    out = run_ensure(KMP_AFFINITY="disabled")
    assert out["env"]["KMP_AFFINITY"] == "granularity=fine"
    assert ["KMP_AFFINITY", "disabled", "granularity=fine", "kmp-affinity-disabled"] in out["changes"]
    assert out["takes_effect"] and out["warnings"] == []


def test_good_value_is_kept() -> None:
    out = run_ensure(KMP_AFFINITY="granularity=fine,scatter")
    assert out["env"]["KMP_AFFINITY"] == "granularity=fine,scatter"
    assert not [c for c in out["changes"] if c[0] == "KMP_AFFINITY"]


def test_empty_value_is_corrected() -> None:
    out = run_ensure(KMP_AFFINITY="")
    assert out["env"]["KMP_AFFINITY"] == "granularity=fine"
    assert out["findings"]["kmp-affinity-empty"] == "warning"


# ----------------------------------------------------------------------------- the cases the seed missed
@pytest.mark.torch
def test_libgomp_ignoring_kmp_is_reported_and_left_alone() -> None:
    out = run_ensure(KMP_AFFINITY="granularity=fine,compact", BEFORE="torch")
    assert "libgomp" in out["runtimes"]
    assert out["findings"]["kmp-ignored-by-libgomp"] == "warning"
    assert out["env"]["KMP_AFFINITY"] == "granularity=fine,compact" and out["changes"] == []


@pytest.mark.torch
def test_ranks_times_threads_oversubscription_is_corrected() -> None:
    need(len(CPUS) >= 2, "needs at least 2 allowed CPUs")
    over = str(len(CPUS))
    out = run_ensure(OMP_NUM_THREADS=over, LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", AFTER="torch")
    assert out["findings"]["omp-oversubscribed"] == "error"
    assert out["env"]["OMP_NUM_THREADS"] == str(len(CPUS) // 2)
    assert out["torch_threads"] == len(CPUS) // 2  # torch really starts with the corrected count
    untouched = run_ensure(OMP_NUM_THREADS=over, LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", AFTER="torch", POLICY="keep")
    assert untouched["torch_threads"] == len(CPUS) and untouched["changes"] == []
    assert "policy 'safe' would apply" in " ".join(untouched["advice"])


@pytest.mark.torch
def test_collapse_is_prevented_when_called_before_import_torch() -> None:
    need(len(CPUS) >= 2, "the collapse needs at least 2 allowed CPUs")
    out = run_ensure(OMP_PLACES="cores", OMP_PROC_BIND="close", AFTER="torch,child")
    assert out["findings"]["collapse-risk"] == "warning"
    assert out["env"]["OMP_PLACES"] is None and out["env"]["OMP_PROC_BIND"] is None
    assert frozenset(out["main_mask"]) == CPUS and frozenset(out["child_mask"]) == CPUS
    assert out["takes_effect"] and out["ok"]


@pytest.mark.torch
def test_too_late_after_import_torch_says_so() -> None:
    need(len(CPUS) >= 2, "the collapse needs at least 2 allowed CPUs")
    out = run_ensure(OMP_PLACES="cores", OMP_PROC_BIND="close", BEFORE="torch", AFTER="torch,child")
    assert out["findings"]["collapse-risk"] == "warning"
    assert not out["takes_effect"] and not out["ok"]
    assert len(out["warnings"]) == 1 and "libgomp" in out["warnings"][0]
    assert "before importing numpy or torch" in out["warnings"][0] and "affrun" in out["warnings"][0]
    # the collapse already happened in this process: the kernel shows one CPU, and the advice names the cure
    assert len(out["main_mask"]) == 1 and "worker_init_fn" in out["warnings"][0]
    # and a process started afterwards inherits that one CPU: the environment fix cannot undo it
    assert out["child_mask"] == out["main_mask"]


def test_numpy_openblas_already_loaded_is_too_late_for_thread_counts() -> None:
    try:
        import numpy  # noqa: F401
    except ImportError:
        need(False, "numpy is not installed")
    need(len(CPUS) >= 2, "needs at least 2 allowed CPUs")
    out = run_ensure(OPENBLAS_NUM_THREADS=str(4 * len(CPUS)), BEFORE="numpy")
    assert "openblas" in out["runtimes"]
    assert not out["takes_effect"] and "openblas" in out["warnings"][0]


# ----------------------------------------------------------------------------- policies and weight
def test_strict_raises_and_keep_changes_nothing() -> None:
    strict = run_ensure(KMP_AFFINITY="disabled", POLICY="strict")
    assert strict["error"] == "UnsafeEnvironment" and strict["env"]["KMP_AFFINITY"] == "disabled"
    keep = run_ensure(KMP_AFFINITY="disabled", POLICY="keep")
    assert keep["error"] is None and keep["env"]["KMP_AFFINITY"] == "disabled" and not keep["ok"]
    clean = run_ensure(POLICY="strict")
    assert clean["error"] is None and clean["ok"]


def test_ensure_is_light() -> None:
    out = run_ensure(KMP_AFFINITY="disabled")
    assert out["modules"] == []  # no click, psutil, torch, numpy, yaml or submitit


def test_unknown_policy_and_a_given_environ() -> None:
    with pytest.raises(ConfigError, match=r"^ensure_affinity: policy='fix': choose one of safe, keep, strict$"):
        ensure_affinity(policy="fix")
    env = {"OMP_NUM_THREADS": "zero", "PATH": os.environ.get("PATH", "")}
    before = dict(os.environ)
    report = ensure_affinity(environ=env, warn=False)  # only this mapping changes, not os.environ
    assert env["OMP_NUM_THREADS"].isdigit() and dict(os.environ) == before
    assert [(c.variable, c.finding) for c in report.changes] == [("OMP_NUM_THREADS", "omp-threads-invalid")]
    assert POLICIES == ("safe", "keep", "strict")
