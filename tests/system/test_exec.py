"""``affrun exec`` on real processes: the kernel's mask, the OpenMP runtimes' own reports, exit codes, signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.base.cpulist import parse_cpulist
from tests.launch import GOMP_LINE, IOMP_LINE, affrun_argv, clean_env, compile_omp, rank_lines, run

NCPU = len(os.sched_getaffinity(0))
STATUS = ["sh", "-c", "grep Cpus_allowed_list /proc/self/status"]


def allowed_of(stdout: str) -> set[int]:
    return set(parse_cpulist(stdout.split(":", 1)[1].strip()))


@pytest.mark.parametrize(
    "variables",
    [
        {"LOCAL_RANK": "{r}", "LOCAL_WORLD_SIZE": "{n}"},
        {"SLURM_LOCALID": "{r}", "SLURM_STEP_TASKS_PER_NODE": "{n}", "SLURM_NODEID": "0"},
        {"SLURM_LOCALID": "{r}", "SLURM_STEP_TASKS_PER_NODE": "1,{n}(x2)", "SLURM_NODEID": "1"},
        {"OMPI_COMM_WORLD_LOCAL_RANK": "{r}", "OMPI_COMM_WORLD_LOCAL_SIZE": "{n}"},
        {"MPI_LOCALRANKID": "{r}", "MPI_LOCALNRANKS": "{n}"},
        {"PMI_LOCAL_RANK": "{r}", "PMI_LOCAL_SIZE": "{n}"},
    ],
    ids=["torchrun", "slurm", "slurm-compressed", "openmpi", "mpich", "pmi"],
)
def test_each_launcher_variable_gives_disjoint_masks(variables: dict[str, str]) -> None:
    n = NCPU
    masks = []
    for r in range(n):
        env = clean_env(**{k: v.format(r=r, n=n) for k, v in variables.items()})
        proc = run(affrun_argv("exec", "--", *STATUS), env=env, check=True)
        masks.append(allowed_of(proc.stdout))
    assert all(len(m) == 1 for m in masks)
    assert set().union(*masks) == os.sched_getaffinity(0)


def test_flags_override_variables_and_verbose_line_is_parseable() -> None:
    env = clean_env(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    proc = run(affrun_argv("exec", "--nproc-per-node", str(NCPU), "--local-rank", str(NCPU - 1), "--verbose", "--",
                           *STATUS), env=env, check=True)
    (line,) = rank_lines(proc.stderr)
    assert line["rank"] == str(NCPU - 1) and line["size"] == str(NCPU)
    assert allowed_of(proc.stdout) == set(parse_cpulist(line["cpus"]))


@pytest.mark.parametrize("runtime", ["gomp", "iomp5", "omp14", "omp16"])
def test_openmp_runtime_binds_every_thread_inside_the_rank(tmp_path: Path, runtime: str) -> None:
    binary = compile_omp(tmp_path, runtime)
    n = NCPU
    for r in range(n):
        env = clean_env(LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n), OMP_DISPLAY_AFFINITY="true",
                        KMP_AFFINITY="verbose,disabled")  # a dangerous inherited value: affrun must replace it
        proc = run(affrun_argv("exec", "--verbose", "--", str(binary)), env=env, check=True)
        (line,) = rank_lines(proc.stderr)
        rank_cpus = set(parse_cpulist(line["cpus"]))
        output = proc.stdout + proc.stderr
        pattern = GOMP_LINE if runtime == "gomp" else IOMP_LINE
        bound = [set(parse_cpulist(m["cpus"])) for m in pattern.finditer(output)]
        assert bound, f"{runtime} printed no affinity report:\n{output}"
        assert all(b <= rank_cpus for b in bound), (bound, rank_cpus)
        assert "Warning #182" not in output
        assert "threads=" in proc.stdout


def test_exit_code_stdin_and_pid_belong_to_the_command() -> None:
    proc = run(affrun_argv("exec", "--", "sh", "-c", "exit 7"))
    assert proc.returncode == 7
    fed = subprocess.run(affrun_argv("exec", "--", "cat"), input="hello\n", capture_output=True, text=True,
                         env=clean_env(), timeout=60)
    assert fed.stdout == "hello\n"
    child = subprocess.Popen(affrun_argv("exec", "--", "sleep", "30"), env=clean_env())
    try:
        deadline = time.time() + 20
        while time.time() < deadline and Path(f"/proc/{child.pid}/comm").read_text().strip() != "sleep":
            time.sleep(0.05)
        # exec replaced affrun in place: the PID we started is the command itself, so signals go straight to it
        assert Path(f"/proc/{child.pid}/comm").read_text().strip() == "sleep"
        child.send_signal(signal.SIGUSR2)
        assert child.wait(timeout=10) == -signal.SIGUSR2
    finally:
        child.kill()


def test_command_not_found_and_bad_input_are_one_line() -> None:
    proc = run(affrun_argv("exec", "--", "no-such-command-xyz"))
    assert proc.returncode == 127
    assert proc.stderr.strip() == "affrun: error: no-such-command-xyz: command not found"
    for argv, needle in [
        (["exec", "--nproc-per-node", str(NCPU + 1), "--local-rank", "0", "--", "true"], "ranks but only"),
        (["exec", "--fsroot", "/no/such/dir", "--", "true"], "fsroot"),
        (["exec", "--cpus", "999", "--", "true"], "--cpus"),
        (["exec", "--gpus", "5", "--", "true"], "GPU"),
    ]:
        proc = run(affrun_argv(*argv))
        assert proc.returncode == 2, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("affrun: error:") and needle in line


def test_dry_run_applies_nothing() -> None:
    proc = run(affrun_argv("exec", "--dry-run", "--nproc-per-node", str(NCPU), "--local-rank", "0", "--", "true"),
               check=True)
    assert proc.stdout.startswith("affrun: rank 0/")
    assert "OMP_NUM_THREADS=1\n" in proc.stdout
    assert "exec true" in proc.stdout


def test_membind_is_applied_and_survives_exec() -> None:
    proc = run(affrun_argv("exec", "--mem-policy", "membind", "--mem-backend", "syscall", "--verbose", "--", "sh", "-c",
                           "head -1 /proc/self/numa_maps"), check=True)
    # the kernel's own record of the policy of the exec'd program's memory
    assert " bind:0 " in proc.stdout, proc.stdout
    (line,) = rank_lines(proc.stderr)
    assert line["mem"] == "membind:0"


def test_the_rank_knows_its_binding_as_the_rank_line_gives_it() -> None:
    """``current_binding()`` inside the rank prints the same line affrun printed for it, memory policy included."""
    code = "from launcher.bind.readback import current_binding; print(current_binding())"
    proc = run(affrun_argv("exec", "--mem-policy", "membind", "--mem-backend", "syscall", "--verbose", "--",
                           sys.executable, "-c", code), check=True)
    (printed,) = [line for line in proc.stderr.splitlines() if line.startswith("affrun: rank ")]
    assert printed == "affrun: " + proc.stdout.strip()
    assert printed.endswith(" mem membind:0")


def test_blocked_memory_policy_falls_back_without_failing_the_rank() -> None:
    code = (
        "from launcher.bind.mempolicy import apply_mempolicy\n"
        "r = apply_mempolicy('membind', (63,), 'syscall')\n"  # node 63 does not exist: the kernel refuses
        "print(r.policy); print(*r.warnings, sep='\\n')\n"
    )
    proc = run([sys.executable, "-c", code], check=True)
    lines = proc.stdout.splitlines()
    assert lines[0] == "none"
    assert "membind is blocked" in lines[1] and "falling back to preferred" in lines[1]
    assert "preferred is blocked" in lines[2] and "falling back to none" in lines[2]


def test_missing_numactl_is_a_clear_error(tmp_path: Path) -> None:
    env = clean_env(PATH=str(tmp_path))  # no numactl on this PATH
    proc = run([sys.executable, "-m", "launcher", "exec", "--mem-policy", "membind", "--mem-backend", "numactl", "--",
                "/bin/true"], env=env)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "numactl is not installed" in line
    # with the default backend, a missing numactl is not an error: the syscall applies the policy
    proc = run([sys.executable, "-m", "launcher", "exec", "--mem-policy", "membind", "--", "/bin/true"], env=env)
    assert proc.returncode == 0, proc.stderr


def test_srun_style_tasks_get_torch_distributed_variables() -> None:
    # srun and mpirun set no RANK/WORLD_SIZE/LOCAL_RANK; torch's env:// needs them: affrun exec derives them.
    env = clean_env(SLURM_LOCALID="0", SLURM_PROCID="2", SLURM_NTASKS="4", SLURM_STEP_TASKS_PER_NODE="2(x2)",
                    SLURM_NODEID="1")
    proc = run(affrun_argv("exec", "--", "sh", "-c", 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE"'),
               env=env, check=True)
    assert proc.stdout.split() == ["2", "4", "0", "2"]
    env = clean_env(OMPI_COMM_WORLD_LOCAL_RANK="1", OMPI_COMM_WORLD_LOCAL_SIZE="2", OMPI_COMM_WORLD_RANK="5",
                    OMPI_COMM_WORLD_SIZE="6", RANK="7")  # a value the user set is kept
    proc = run(affrun_argv("exec", "--", "sh", "-c", 'echo "$RANK $WORLD_SIZE $LOCAL_RANK"'), env=env, check=True)
    assert proc.stdout.split() == ["7", "6", "1"]


def test_explicit_rank_flags_win_over_half_set_variables() -> None:
    env = clean_env(LOCAL_RANK="0")  # LOCAL_WORLD_SIZE missing: an error only when the flags do not say it
    proc = run(affrun_argv("exec", "--local-rank", "0", "--nproc-per-node", str(NCPU), "--", *STATUS), env=env,
               check=True)
    assert len(allowed_of(proc.stdout)) == 1 or NCPU == 1


def test_exec_is_not_shadowed_by_a_launcher_module_in_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "launcher.py").write_text("raise SystemExit('the user launcher.py ran')\n")
    from launcher.bind.handoff import exec_prefix

    proc = run([*exec_prefix(), "--", "echo", "bound"], cwd=tmp_path, check=True)
    assert proc.stdout.strip() == "bound"


def test_no_gpu_leaves_gpus_and_their_visibility_variables_alone(tmp_path: Path) -> None:
    from tests.fakesys import this_machine_with_gpus, write_tree

    root = write_tree(tmp_path / "root", this_machine_with_gpus(2))
    env = clean_env(CUDA_VISIBLE_DEVICES="MIG-unmappable")  # an error for a GPU plan: no PCI GPU to map it to
    proc = run(affrun_argv("exec", "--fsroot", str(root), "--", "true"), env=env)
    assert proc.returncode == 2 and "MIG" in proc.stderr
    proc = run(affrun_argv("exec", "--fsroot", str(root), "--no-gpu", "--verbose", "--", "true"), env=env, check=True)
    (line,) = rank_lines(proc.stderr)
    assert line["gpu"] == "-"


def test_a_mask_the_kernel_narrows_is_reported_with_what_the_rank_really_got(tmp_path: Path) -> None:
    """A plan made from another view of the machine (here a tree with two CPUs this machine does not have) asks
    for CPUs outside the process's cpuset: the kernel keeps the part inside, silently. affrun says so."""
    from launcher.base.cpulist import format_cpulist
    from tests.fakesys import this_machine_with_gpus, write_tree

    real = sorted(os.sched_getaffinity(0))
    m = this_machine_with_gpus(0)
    extra = [real[-1] + 1, real[-1] + 2]
    m.cores += [(c,) for c in extra]
    m.node_of_core += [0, 0]
    m.package_of_core += [0, 0]
    m.l3_of_core += [0, 0]
    root = write_tree(tmp_path / "wider", m)
    proc = run(affrun_argv("exec", "--fsroot", str(root), "--local-rank", "0", "--nproc-per-node", "1",
                           "--mem-policy", "none", "--", *STATUS), check=True)
    assert allowed_of(proc.stdout) == set(real)
    warnings = [line for line in proc.stderr.splitlines() if "narrowed" in line]
    assert warnings == [f"affrun: warning: the kernel narrowed the CPUs {format_cpulist(real + extra)} to "
                        f"{format_cpulist(real)}: the plan was made for CPUs this process's cpuset does not allow"]
