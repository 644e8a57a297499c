"""Hostile input through affrun's Python APIs and ``affrun sbatch`` (issue 18, classes 6, 7 and 11).

``bind_rank()`` and the submitit executor take affrun's options as keyword arguments: a wrong type is one
``ConfigError`` that names the keyword, before anything is bound or queued; natural values (lists, tuples, ranges,
generators of ints) work. ``affrun sbatch`` refuses, before the queue wait, what the job would refuse, through the
real CLI; one rule for control characters holds on the command line and in a YAML site profile alike.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from launcher.errors import AffrunError, ConfigError
from tests.sbatch_script import CONTROL_CASES

# ------------------------------------------------------------------------------------------- class 6: bind_rank
WRONG_TYPES: list[tuple[str, object]] = [
    ("loader_cores", None), ("loader_cores", 1.5), ("loader_cores", "1"), ("loader_cores", True),
    ("cpu_map", 5), ("cpu_map", [[]]), ("cpu_map", [b"0"]), ("fsroot", 123), ("topology", 5), ("fsroot", b"/sys"),
    ("mem_policy", None), ("omp_bind", None), ("env_policy", ["safe"]), ("mem_backend", None),
    ("reserve", 0), ("cpus", 0), ("cpus", b"0,1"), ("cpus", [0.0]), ("cpus", [True]), ("cpus", [-1]),
    ("cpus", []), ("gpus", 0), ("gpus", b"0"), ("gpus", {0, 1}), ("smt", 1), ("no_gpu", "yes"),
    ("cpus", range(10**12)),
]


@pytest.mark.parametrize("keyword,value", WRONG_TYPES, ids=[f"{k}={v!r:.20}" for k, v in WRONG_TYPES])
def test_bind_rank_refuses_a_wrong_type_naming_the_keyword(unbound: None, keyword: str, value: object) -> None:
    """One ConfigError, ``keyword=...: ...``, and nothing bound: never a TypeError from deep inside, never a value
    silently dropped (reserve=0 and cpus=0 were ignored, b"0,1" became CPUs 44,48-49)."""
    from launcher import bind_rank

    before = os.sched_getaffinity(0)
    with pytest.raises(ConfigError) as caught:
        bind_rank(0, 1, quiet=True, **{keyword: value})
    assert str(caught.value).startswith(f"{keyword}="), str(caught.value)
    assert len(str(caught.value)) < 300 and "\n" not in str(caught.value)
    assert os.sched_getaffinity(0) == before


def _first(n: int) -> list[int]:
    return sorted(os.sched_getaffinity(0))[:n]


@pytest.mark.parametrize("make", [list, tuple, iter, lambda c: (x for x in c), lambda c: range(c[0], c[0] + 1)],
                         ids=["list", "tuple", "iterator", "generator", "range"])
def test_bind_rank_takes_natural_lists(unbound: None, make: Any) -> None:
    """cpus=, reserve= and cpu_map= as lists, tuples, ranges or generators of ints bind as their string forms."""
    from launcher import bind_rank

    (cpu,) = _first(1)
    report = bind_rank(0, 1, quiet=True, cpus=make([cpu]))
    assert report.cpus == (cpu,) and os.sched_getaffinity(0) == {cpu}
    report = bind_rank(0, 1, quiet=True, cpu_map=[make([cpu])])
    assert report.cpus == (cpu,)


def test_bind_rank_reserve_as_a_list_is_applied(unbound: None) -> None:
    from launcher import bind_rank

    cpus = _first(2)
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    report = bind_rank(0, 1, quiet=True, cpus=cpus, reserve=[cpus[0]])
    assert cpus[0] not in report.cpus and cpus[1] in report.cpus


def test_bind_rank_gpus_as_a_list_reaches_the_planner(unbound: None) -> None:
    """gpus=[0] is the string '0' (on a machine without GPUs the planner says so, naming the GPU)."""
    from launcher import bind_rank

    with pytest.raises(AffrunError) as caught:
        bind_rank(0, 1, quiet=True, gpus=[7])
    assert "GPU 7" in str(caught.value), str(caught.value)


def test_bind_rank_local_rank_is_an_int_not_a_bool(unbound: None) -> None:
    from launcher import bind_rank

    with pytest.raises(ConfigError, match="local_rank=True"):
        bind_rank(True, 2, quiet=True)


# ------------------------------------------------------------------------------- class 7: AffinityExecutor
@pytest.fixture
def slurm_executor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """submitit's real Slurm executor, built where no Slurm is installed: it only needs an ``srun`` on PATH to
    exist (a stub); nothing is submitted. Its batch file text is submitit's own."""
    from launcher.submitit import AffinityExecutor

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return AffinityExecutor(folder=tmp_path / "logs", cluster="slurm")


def batch_file(executor: Any) -> str:
    text: str = executor.executor._executor._make_submission_file_text("python -u -m submitit.core._submit X", "u")
    return text


def test_a_setup_string_is_one_batch_line_and_an_srun_string_one_argument(slurm_executor: Any) -> None:
    slurm_executor.update_parameters(slurm_setup="module load cuda", slurm_srun_args="--mpi=pmix")
    text = batch_file(slurm_executor)
    lines = text.splitlines()
    assert "module load cuda" in lines
    assert not any(len(line) == 1 and line in "module load cuda" for line in lines), text  # not a line a character
    (srun,) = [line for line in lines if line.startswith("srun ")]
    assert " --mpi=pmix " in srun and "--cpu-bind=none" in srun and " - -m -p -i " not in srun, srun
    slurm_executor.update_parameters(slurm_setup=(line for line in ["export A=1", "export B=2"]),
                                     slurm_srun_args=iter(["-l"]))  # read once
    lines = batch_file(slurm_executor).splitlines()
    assert "export A=1" in lines and "export B=2" in lines and "module load cuda" not in lines
    assert any(line.startswith("srun ") and " -l " in line for line in lines)


@pytest.mark.parametrize("keyword,value", [
    ("slurm_setup", 5), ("slurm_setup", b"module load cuda"), ("slurm_setup", [5]), ("slurm_setup", ["a\nb"]),
    ("slurm_setup", ["a\x85b"]), ("slurm_setup", ["a\u2028b"]), ("slurm_srun_args", 5), ("slurm_srun_args", [None]),
    ("slurm_srun_args", "--mpi=pmix -l"), ("slurm_srun_args", b"-l"),
])
def test_executor_parameters_of_the_wrong_type_are_one_config_error(slurm_executor: Any, keyword: str,
                                                                     value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        slurm_executor.update_parameters(**{keyword: value})
    assert keyword in str(caught.value), str(caught.value)


def test_executor_cpu_lists_from_generators_are_kept_and_bytes_refused(tmp_path: Path) -> None:
    """A generator given for cpus= or gpus= was consumed by the check and dropped; b"0,1" became CPUs 44,48-49."""
    from launcher.submitit import AffinityExecutor

    cpu = _first(1)[0]
    ex = AffinityExecutor(folder=tmp_path / "logs", cluster="local", cpus=(c for c in [cpu]), gpus=iter([1, 0]),
                          reserve=range(0))
    argv = ex.options.to_argv()
    assert argv[argv.index("--cpus") + 1] == str(cpu) and argv[argv.index("--gpus") + 1] == "1,0"
    ex.update_parameters(cpus=(c for c in [cpu]))
    assert ex.options.cpus == str(cpu)
    for keyword, value in (("cpus", b"0,1"), ("gpus", b"0"), ("reserve", 0), ("loader_cores", 1.0)):
        with pytest.raises(ConfigError, match=f"^{keyword}="):
            ex.update_parameters(**{keyword: value})
        with pytest.raises(ConfigError, match=f"^{keyword}="):
            AffinityExecutor(folder=tmp_path / "logs", cluster="local", **{keyword: value})
    assert ex.options.cpus == str(cpu)  # a refused update changes nothing


def test_python_front_ends_share_one_keyword_check() -> None:
    """bind_rank and the executor say the same thing about the same wrong value (one check, from the table)."""
    from launcher.options.keywords import check_keywords
    from launcher.submitit import AffinityOptions

    cases: list[tuple[str, Any]] = [("loader_cores", 1.5), ("cpus", b"0"), ("omp_bind", None)]
    for keyword, value in cases:
        with pytest.raises(ConfigError) as shared:
            check_keywords({keyword: value})
        with pytest.raises(ConfigError) as executor:
            AffinityOptions.from_kwargs(**{keyword: value})
        assert str(shared.value) == str(executor.value)


CONTROL_CASES += [("setup", "a\rb"), ("setup", "a\nb")]


@pytest.mark.parametrize("kwargs,message", [
    ({"policy": "fix"}, "policy='fix': choose one of safe, keep, strict"),
    ({"policy": None}, "policy=None: choose one of safe, keep, strict"),
    ({"nproc_per_node": 0}, "nproc_per_node=0 must be at least 1: a job has one local rank or more"),
    ({"nproc_per_node": "4"}, "nproc_per_node='4' is not an int"),
    ({"nproc_per_node": True}, "nproc_per_node=True is not an int"),
    ({"warn": "no"}, "warn='no': expected True or False"),
    ({"environ": ["OMP_NUM_THREADS=4"]}, "environ=a list of 1 item(s): expected a mutable mapping of str to str"),
    ({"environ": {"OMP_NUM_THREADS": 4}}, "expected a mutable mapping of str to str"),
], ids=lambda v: str(v)[:30])
def test_ensure_affinity_refuses_a_wrong_argument_naming_it(kwargs: dict[str, Any], message: str) -> None:
    """The same words as bind_rank's for the same mistake (one rank-count wording everywhere), before anything runs."""
    from launcher import ensure_affinity

    before = dict(os.environ)
    with pytest.raises(ConfigError) as caught:
        ensure_affinity(**kwargs)
    assert str(caught.value).startswith("ensure_affinity: ") and message in str(caught.value)
    assert dict(os.environ) == before
