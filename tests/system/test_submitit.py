"""``launcher.submitit``: real submitit 1.5 executors whose tasks start through ``affrun exec``.

The Slurm tests submit to the project's local cluster (``tests/slurm/start-slurm.sh``: nodes n1, n2, 2 fake GPUs
each, accounting on) and check what each task saw from inside: its kernel mask, its environment, its
``SLURM_LOCALID``, the CPUs Slurm gave the step (the task's cpuset cgroup), and ``current_binding()``. The
expected per-node plan is computed here from the same CPUs with affrun's planner. Every wait has a deadline.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import warnings
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import cloudpickle  # type: ignore[import-untyped]
import pytest

from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.errors import AffrunError, ConfigError
from launcher.options.record import Options
from launcher.plan.planner import Plan, make_plan
from launcher.submitit import AffinityExecutor, AffinityOptions, current_binding, merge_srun_args, task_python
from launcher.topology import load_topology
from tests.conftest import ROOT, need
from tests.fakesys import this_machine_with_gpus, write_tree

JOB_TIMEOUT = 90.0  # seconds for one job, queueing included (the cluster is shared with other test modules)
REPORTED = ("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "AFFRUN_", "SLURM_", "CUDA_VISIBLE_DEVICES",
            "SRUN_CPUS_PER_TASK", "SUBMITIT_", "USER_HOOK", "SETUP_MARK")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


# ------------------------------------------------------------------------------------------- what a task runs
def _step_cpus() -> str | None:
    """The CPUs of this task's cpuset cgroup (what Slurm gave the step on this node), or None without cgroups."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpuset" in controllers.split(","):
            candidates = [f"/sys/fs/cgroup/cpuset{path}/cpuset.effective_cpus", f"/sys/fs/cgroup/cpuset{path}/cpuset.cpus"]
        elif controllers == "":
            candidates = [f"/sys/fs/cgroup{path}/cpuset.cpus.effective"]
        else:
            continue
        for name in candidates:
            try:
                return Path(name).read_text().strip()
            except OSError:
                pass
    return None


def probe(tag: str = "") -> dict[str, Any]:
    """One task's view of itself."""
    binding = current_binding()
    return {
        "tag": tag,
        "mask": sorted(os.sched_getaffinity(0)),
        "env": {k: v for k, v in os.environ.items() if k.startswith(REPORTED)},
        "localid": os.environ.get("SLURM_LOCALID", os.environ.get("SUBMITIT_LOCAL_LOCALID")),
        "node": os.environ.get("SLURMD_NODENAME", "local"),
        "step_cpus": _step_cpus(),
        "binding": None if binding is None else binding.as_dict(),
    }


def boom(message: str) -> None:
    raise ValueError(message)


# The job runs in another interpreter that cannot import this test module: send these functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ------------------------------------------------------------------------------------------------- helpers
@cache
def _sinfo() -> list[tuple[str, str, int, str]] | None:
    """(node, state, cpus, gres) per node of the running cluster, or None when Slurm is not usable here."""
    if not (shutil.which("sinfo") and shutil.which("sbatch") and shutil.which("sacct")):
        return None
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T %c %G"], capture_output=True, text=True, timeout=20)
        acct = subprocess.run(["sacct", "-n", "-X", "-S", "now"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or acct.returncode != 0:
        return None
    nodes = []
    for line in out.stdout.splitlines():
        name, state, cpus, gres = line.split()
        if state.rstrip("*~#") in ("idle", "mixed", "allocated", "completing"):
            nodes.append((name, state, int(cpus), gres))
    return nodes or None


START = "bash tests/slurm/start-slurm.sh (SLURM_LOCAL_NODES=2 SLURM_LOCAL_GPUS=2)"


def need_slurm(nodes: int = 1, gpus: int = 0, cpus: int = 2) -> None:
    info = _sinfo()
    need(info, f"no usable local Slurm cluster with accounting (sinfo/sacct): start it with {START}")
    assert info is not None
    usable = [n for n in info if n[2] >= cpus and (gpus == 0 or f"gpu:fake:{gpus}" in n[3] or f"gpu:{gpus}" in n[3])]
    need(len(usable) >= nodes, f"needs {nodes} Slurm node(s) with {cpus} CPUs and {gpus} GPUs, found {info}: {START}")


@pytest.fixture
def submit_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch exports the submitting environment: keep the test runner's own binding variables out of the job."""
    for name in list(os.environ):
        if name.startswith(("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "AFFRUN_", "SLURM_", "SRUN_", "SUBMITIT_",
                            "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES")):
            monkeypatch.delenv(name)


def wait_done(job: Any, timeout: float = JOB_TIMEOUT) -> None:
    """Wait for ``job`` to finish, failing (and cancelling it) if it is not done within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not job.done():
        if time.monotonic() > deadline:
            job.cancel(check=False)
            logs = "\n".join(f"--- task {i}:\n{job.task(i).stderr() or ''}" for i in range(job.num_tasks))
            pytest.fail(f"job {job.job_id} not done after {timeout:.0f}s (state {job.state}); stderr:\n{logs}")
        time.sleep(0.3)


def results_within(job: Any, timeout: float = JOB_TIMEOUT) -> list[Any]:
    """``job.results()`` with a deadline."""
    wait_done(job, timeout)
    return list(job.results())


def expected_plan(step_cpus: str | None, nproc: int, opts: Options | None = None, **topology: Any) -> Plan:
    """affrun's plan for ``nproc`` ranks on the CPUs Slurm gave the step (the live sysfs unless ``fsroot=``)."""
    cpus = step_cpus or format_cpulist(os.sched_getaffinity(0))
    topo = load_topology(cpus=cpus, environ=topology.pop("environ", {}), **topology)
    return make_plan(topo, (opts or Options()).request(nproc))


def assert_bound_like_plan(reports: list[dict[str, Any]], nproc: int, opts: Options | None = None,
                           **topology: Any) -> dict[str, Plan]:
    """Per node: masks disjoint, each equal to its rank's plan entry; OpenMP/BLAS variables consistent."""
    by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in reports:
        by_node[r["node"]].append(r)
    plans = {}
    for node, tasks in by_node.items():
        assert sorted(int(t["localid"]) for t in tasks) == list(range(nproc)), (node, tasks)
        steps = {t["step_cpus"] for t in tasks}
        assert len(steps) == 1, f"tasks of one step on {node} saw different step CPU sets: {steps}"
        plan = expected_plan(steps.pop(), nproc, opts, **dict(topology))
        plans[node] = plan
        seen: set[int] = set()
        for t in tasks:
            rank = plan.ranks[int(t["localid"])]
            mask = set(t["mask"])
            assert mask == set(rank.cpus), f"{node} rank {t['localid']}: mask {mask} != plan {set(rank.cpus)}"
            assert not mask & seen, f"{node}: rank {t['localid']} mask {mask} overlaps another rank's {seen}"
            seen |= mask
            assert_environment_consistent(t, rank.threads)
    return plans


def assert_environment_consistent(task: dict[str, Any], planned_threads: int) -> None:
    env, mask = task["env"], set(task["mask"])
    assert parse_cpulist(env["AFFRUN_CPUS"]) == mask
    assert env["AFFRUN_LOCAL_RANK"] == task["localid"]
    compute = parse_cpulist(env["AFFRUN_COMPUTE_CPUS"])
    assert compute and compute <= mask
    counts = {env[name] for name in THREAD_VARIABLES}
    assert counts == {str(planned_threads)} == {env["AFFRUN_THREADS"]}, {n: env.get(n) for n in THREAD_VARIABLES}
    places = {int(c) for c in env["OMP_PLACES"].replace("{", ",").replace("}", ",").split(",") if c}
    assert places == compute, f"OMP_PLACES {env['OMP_PLACES']} does not list the compute CPUs {compute}"
    assert env["OMP_PROC_BIND"] in ("close", "spread", "true")
    kmp = env.get("KMP_AFFINITY", "")
    assert not any(t in kmp for t in ("disabled", "compact", "scatter", "explicit")), kmp
    b = task["binding"]
    assert b is not None, "current_binding() returned None inside a bound task"
    assert parse_cpulist(b["cpus"]) == mask and b["threads"] == planned_threads
    assert str(b["local_rank"]) == task["localid"]


# --------------------------------------------------------------------------- options and hooks (no cluster)
def test_options_render_as_exec_flags_and_bad_values_are_clear() -> None:
    opts = AffinityOptions.from_kwargs(reserve=[0], loader_cores=1, gpus=(1, 0), cpu_map=[[0], "1"], mode="map",
                                       mem_policy="none", verbose=True)
    argv = opts.to_argv()
    for flag, value in (("--reserve", "0"), ("--loader-cores", "1"), ("--gpus", "1,0"), ("--map", "0;1"),
                        ("--mem-policy", "none")):
        assert argv[argv.index(flag) + 1] == value
    assert "--verbose" in argv
    with pytest.raises(ConfigError, match=r"unknown affrun option.*loader_core.*valid: mode"):
        AffinityOptions.from_kwargs(loader_core=1)
    with pytest.raises(ConfigError, match="exclusive"):
        AffinityOptions.from_kwargs(mode="everything")
    with pytest.raises(ConfigError, match="omp_bind"):
        AffinityOptions.from_kwargs(omp_bind="cores")
    with pytest.raises(ConfigError, match="loader_cores"):
        AffinityOptions.from_kwargs(loader_cores="2")


@pytest.mark.parametrize("kwargs,message", [
    ({"mode": "fastest"}, "mode='fastest': choose one of exclusive, numa"),
    ({"reserve": "x"}, "reserve='x': not a cpu list"),
    ({"cpu_map": "a;b"}, "cpu_map='a;b': expected one cpu list per rank, separated by ';'"),
    ({"mode": "numa", "cpu_map": [[0], [1]]}, "cpu_map= gives explicit CPUs, which mode='numa' would ignore"),
    ({"gpus": [0, 1], "no_gpu": True}, "gpus= names GPUs for the ranks, no_gpu= plans without GPUs: give only one"),
    ({"cpus": "x"}, "cpus='x': not a cpu list"),
    ({"fsroot": "/a", "topology": "/b"}, "fsroot= and topology= name two sources: give only one"),
])
def test_option_errors_name_the_executor_s_keywords_not_the_cli_flags(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    """A submitit user wrote ``cpu_map=`` and ``mode=``: the checks they share with ``affrun plan`` name those
    keywords, as the user wrote them, and never a flag such as ``--map``."""
    with pytest.raises(AffrunError) as caught:
        AffinityExecutor(folder=tmp_path / "logs", cluster="local", **kwargs)
    text = str(caught.value)
    assert text == message or text.startswith(message), text
    assert "--" not in text, text


@pytest.mark.parametrize("kwargs,message", [
    ({"loader_cores": 99}, "loader_cores=99 leaves rank 0 no compute core"),
    ({"cpu_map": "0;1"}, "cpu_map= gives 2 CPU list(s) for 1 ranks"),
])
def test_bind_rank_errors_name_its_keywords(monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any],
                                           message: str) -> None:
    """bind_rank(loader_cores=99) is refused in its caller's words (the plan fails before anything is bound)."""
    from launcher import bind_rank

    monkeypatch.delenv("AFFRUN_RUN", raising=False)
    before = os.sched_getaffinity(0)
    with pytest.raises(AffrunError) as caught:
        bind_rank(0, 1, quiet=True, **kwargs)
    assert str(caught.value).startswith(message), str(caught.value)
    assert os.sched_getaffinity(0) == before


def test_srun_args_are_merged_and_binding_ones_refused() -> None:
    assert merge_srun_args(None) == ["--cpu-bind=none"]
    assert merge_srun_args(["--mpi=pmix", "-l"]) == ["--mpi=pmix", "-l", "--cpu-bind=none"]
    assert merge_srun_args(["--cpu-bind", "verbose"]) == ["--cpu-bind=verbose,none"]
    assert merge_srun_args(["--cpu_bind=none"]) == ["--cpu-bind=none"]
    for bad in (["--cpu-bind=cores"], ["--cpu-bind", "map_cpu:0,1"], ["--cpu-bind=verbose,mask_cpu:0x1"]):
        with pytest.raises(ConfigError, match="needs --cpu-bind=none"):
            merge_srun_args(bad)
    assert merge_srun_args("--mpi=pmix") == ["--mpi=pmix", "--cpu-bind=none"]  # one string: one argument
    with pytest.raises(ConfigError, match="one string is one srun argument"):
        merge_srun_args("--mpi=pmix -l")


def test_a_hook_that_already_runs_affrun_is_refused() -> None:
    for hook in ("affrun exec -- python3", f"{sys.executable} -m launcher exec -- python3"):
        with pytest.raises(ConfigError, match="already runs affrun exec"):
            task_python(AffinityOptions(), hook, "slurm")


def test_a_hook_with_unbalanced_quotes_is_a_config_error(tmp_path: Path) -> None:
    for hook in ('python "', "python 'x", "python \\"):
        with pytest.raises(ConfigError, match=r"is not a valid shell command: No (closing quotation|escaped character)"):
            task_python(AffinityOptions(), hook, "slurm")
        with pytest.raises(ConfigError, match=re.escape(f"the python hook {hook!r} is not a valid shell command")):
            AffinityExecutor(folder=tmp_path / "%j", cluster="local", slurm_python=hook)


def _hostile_hook(tmp_path: Path) -> tuple[str, str]:
    """A user interpreter hook (a wrapper script) in a directory whose name needs quoting in a shell."""
    d = tmp_path / "user's python $HOME `x`"
    d.mkdir()
    script = d / "py wrapper"
    script.write_text(f'#!/bin/sh\nexport USER_HOOK_RAN="$0"\nexec {shlex.quote(sys.executable)} "$@"\n')
    script.chmod(0o755)
    return shlex.quote(str(script)), str(script)


REPORT = ("import json, os; print(json.dumps({'mask': sorted(os.sched_getaffinity(0)), "
          "'env': {k: v for k, v in os.environ.items() if k.startswith(('AFFRUN_', 'OMP_', 'USER_HOOK'))}}))")


@pytest.mark.parametrize("cluster", ["slurm", "local"])
def test_hook_string_binds_each_task_through_the_users_own_hook(tmp_path: Path, cluster: str) -> None:
    """Run the exact hook string the way submitit does (bash for Slurm, shlex.split for local), hostile paths."""
    import json

    hook, script = _hostile_hook(tmp_path)
    nproc = len(os.sched_getaffinity(0))
    python = task_python(AffinityOptions(), hook, cluster)
    plan = expected_plan(None, nproc)
    masks: list[set[int]] = []
    for rank in range(nproc):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "AFFRUN_", "SLURM_", "LOCAL_"))}
        if cluster == "slurm":
            env.update(SLURM_LOCALID=str(rank), SLURM_STEP_TASKS_PER_NODE=str(nproc), SLURM_NODEID="0")
            argv = ["bash", "-c", f"{python} -c {shlex.quote(REPORT)}"]
        else:
            env.update(SUBMITIT_LOCAL_LOCALID=str(rank), SUBMITIT_LOCAL_NTASKS=str(nproc))
            argv = [*shlex.split(python), "-c", REPORT]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["env"]["USER_HOOK_RAN"] == script
        assert set(out["mask"]) == set(plan.ranks[rank].cpus) == parse_cpulist(out["env"]["AFFRUN_CPUS"])
        masks.append(set(out["mask"]))
    assert all(not a & b for i, a in enumerate(masks) for b in masks[i + 1 :])


def test_current_binding_reads_what_affrun_exec_applied() -> None:
    import json

    assert current_binding({}) is None
    code = ("import json, os; from launcher.submitit import current_binding; b = current_binding(); "
            "print(json.dumps({'b': b.as_dict(), 'mask': sorted(os.sched_getaffinity(0)), 's': str(b)}))")
    nproc = len(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "AFFRUN_", "SLURM_", "LOCAL_"))}
    proc = subprocess.run([sys.executable, "-m", "launcher", "exec", "--local-rank", str(nproc - 1),
                           "--nproc-per-node", str(nproc), "--", sys.executable, "-c", code],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    b = out["b"]
    assert parse_cpulist(b["cpus"]) == set(out["mask"])
    assert b["local_rank"] == nproc - 1 and b["local_world_size"] == nproc
    assert b["threads"] >= 1 and parse_cpulist(b["compute_cpus"]) <= set(out["mask"])
    assert out["s"].startswith(f"rank {nproc - 1}/{nproc} host ")
    with pytest.raises(ValueError, match="AFFRUN_THREADS"):
        current_binding({"AFFRUN_CPUS": "0", "AFFRUN_THREADS": "two"})


def test_importing_stays_light_and_exec_never_imports_this_module() -> None:
    heavy = "('submitit', 'launcher.submitit', 'click', 'psutil', 'torch')"
    light = f"import sys, launcher, launcher.submitit; print(sorted(m for m in {heavy} if m in sys.modules))"
    # affrun exec's whole planning path (a dry run plans and renders without exec-ing anything).
    exec_path = ("import contextlib, io, sys; from launcher.main import main\n"
                 "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
                 "    main(['exec', '--dry-run', '--', 'true'])\n"
                 f"print(sorted(m for m in {heavy} if m in sys.modules))")
    # click is the commands' one parser, which affrun exec with options loads too (issue 42: test_light_imports.py)
    for code, expected in ((light, "['launcher.submitit']"), (exec_path, "['click']")):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip() == expected, code + proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------ local and debug
def test_local_cluster_binds_every_task(tmp_path: Path, submit_env: None) -> None:
    nproc = len(os.sched_getaffinity(0))
    ex = AffinityExecutor(folder=tmp_path / "%j", cluster="local")
    ex.update_parameters(tasks_per_node=nproc, timeout_min=2)
    reports = results_within(ex.submit(probe, "local"), 60)
    assert_bound_like_plan(reports, nproc)


def test_debug_cluster_warns_and_runs_unbound(tmp_path: Path, submit_env: None) -> None:
    with pytest.warns(RuntimeWarning, match="cluster='debug'.*unbound"):
        ex = AffinityExecutor(folder=tmp_path / "%j", cluster="debug", loader_cores=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (report,) = ex.submit(probe, "debug").results()
    assert report["binding"] is None and report["mask"] == sorted(os.sched_getaffinity(0))


# ------------------------------------------------------------------------------------------------- Slurm
@pytest.mark.slurm
def test_two_tasks_on_one_node_with_gpus_and_the_users_own_parameters(tmp_path: Path, submit_env: None) -> None:
    need_slurm(nodes=1, gpus=2)
    fsroot = tmp_path / "fake sys 'two gpus'"
    machine = this_machine_with_gpus(2)
    write_tree(fsroot, machine)
    hook, script = _hostile_hook(tmp_path)
    ex = AffinityExecutor(folder=tmp_path / "%j", cluster="slurm", slurm_python=hook, fsroot=fsroot)
    ex.update_parameters(nodes=1, tasks_per_node=2, cpus_per_task=1, gpus_per_node=2, timeout_min=3,
                         slurm_srun_args=["--cpu-bind=verbose"], slurm_setup=["export SETUP_MARK=user-line"])
    assert ex.parameters["srun_args"] == ["--cpu-bind=verbose,none"]
    reports = results_within(ex.submit(probe, "gpus"))
    plans = assert_bound_like_plan(reports, 2, fsroot=str(fsroot), environ={"CUDA_VISIBLE_DEVICES": "0,1"})
    (plan,) = plans.values()
    for t in reports:
        rank, env = int(t["localid"]), t["env"]
        assert t["binding"]["gpu"] == rank == plan.ranks[rank].gpu  # torch convention: local rank i -> GPU i
        assert env["AFFRUN_GPU_PCI"] == machine.gpus[rank].pci == t["binding"]["gpu_pci"]
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # Slurm's, untouched
        assert env["USER_HOOK_RAN"] == script  # the user's slurm_python still runs, after affrun exec
        assert env["SETUP_MARK"] == "user-line" and env["SRUN_CPUS_PER_TASK"] == "1"  # both setups ran
        assert env["SLURM_CPU_BIND_TYPE"].startswith("none")  # srun did not bind: affrun did


@pytest.mark.slurm
def test_two_nodes_two_tasks_each(tmp_path: Path, submit_env: None) -> None:
    need_slurm(nodes=2)
    ex = AffinityExecutor(folder=tmp_path / "%j", cluster="slurm")
    ex.update_parameters(nodes=2, tasks_per_node=2, cpus_per_task=1, timeout_min=3)
    reports = results_within(ex.submit(probe, "two-nodes"))
    assert len(reports) == 4 and len({r["node"] for r in reports}) == 2
    assert_bound_like_plan(reports, 2)
    assert sorted(int(r["env"]["SLURM_PROCID"]) for r in reports) == [0, 1, 2, 3]


@pytest.mark.slurm
def test_exception_in_the_function_reaches_result(tmp_path: Path, submit_env: None) -> None:
    import submitit

    need_slurm()
    ex = AffinityExecutor(folder=tmp_path / "%j", cluster="slurm")
    ex.update_parameters(tasks_per_node=1, timeout_min=2)
    job = ex.submit(boom, "boom from a bound task")
    wait_done(job)
    with pytest.raises(submitit.core.utils.FailedJobError, match="ValueError: boom from a bound task"):
        job.result()


@pytest.mark.slurm
def test_affrun_failure_in_the_task_is_reported_not_hung(tmp_path: Path, submit_env: None) -> None:
    import submitit

    need_slurm()
    ex = AffinityExecutor(folder=tmp_path / "%j", cluster="slurm", cpus="4095")  # a CPU no node has
    ex.update_parameters(tasks_per_node=1, timeout_min=2)
    job = ex.submit(probe, "never runs")
    job._results_timeout_s = 2  # submitit waits this long for a result file that cannot come (its tests do the same)
    wait_done(job)
    with pytest.raises(submitit.core.utils.UncompletedJobError, match="affrun: error: --cpus 4095"):
        job.result()


@pytest.mark.slurm
def test_job_arrays_are_bound(tmp_path: Path, submit_env: None) -> None:
    need_slurm()
    ex = AffinityExecutor(folder=tmp_path / "%j", cluster="slurm", loader_cores=0)
    ex.update_parameters(tasks_per_node=1, cpus_per_task=1, timeout_min=2, slurm_array_parallelism=2)
    jobs = ex.map_array(probe, ["a", "b", "c"])
    reports = [r for job in jobs for r in results_within(job)]
    assert sorted(r["tag"] for r in reports) == ["a", "b", "c"]
    assert len({r["env"]["SLURM_ARRAY_TASK_ID"] for r in reports}) == 3
    for r in reports:
        plan = expected_plan(r["step_cpus"], 1)
        assert set(r["mask"]) == set(plan.ranks[0].cpus)
        assert r["env"]["AFFRUN_LOCAL_WORLD_SIZE"] == "1"
        assert_environment_consistent(r, plan.ranks[0].threads)


@pytest.mark.slurm
@pytest.mark.torch
def test_example_trains_with_every_task_bound(tmp_path: Path, submit_env: None) -> None:
    import json

    need_slurm()
    try:
        import torch  # noqa: F401
    except ImportError:
        need(False, "torch is not installed")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "submitit_train.py"), "--cluster", "slurm",
                           "--tasks-per-node", "2", "--cpus-per-task", "1", "--steps", "20", "--timeout-min", "3",
                           "--folder", str(tmp_path / "%j")],
                          env=dict(os.environ), capture_output=True, text=True, timeout=JOB_TIMEOUT + 30, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["local_rank"] for r in results) == [0, 1]
    masks = [set(r["mask"]) for r in results]
    assert not masks[0] & masks[1]
    for r in results:
        b = r["binding"]
        assert parse_cpulist(b["cpus"]) == set(r["mask"])
        assert r["torch_threads"] == b["threads"] == int(r["omp_num_threads"])  # torch's real thread pool
        assert math.isfinite(r["loss"])

