"""Memory policy backends, checked on real processes: the kernel's own record of the exec'd program's policy
(``/proc/self/numa_maps``), its exit code, and whether numactl really ran (a recording shim in front of the
real numactl on PATH)."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

import pytest

from launcher.bind import mempolicy
from launcher.bind.mempolicy import apply_mempolicy
from tests.conftest import need
from tests.launch import affrun_argv, clean_env, run

NUMA_MAPS_HEAD = "head -1 /proc/self/numa_maps"


def numactl_shim(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose ``numactl`` records its arguments in a file, then execs the real numactl."""
    real = shutil.which("numactl")
    need(real, "numactl is not installed (apt-get install numactl)")
    assert real is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "numactl.args"
    shim = bin_dir / "numactl"
    shim.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" >> {shlex.quote(str(record))}\nexec {shlex.quote(real)} \"$@\"\n")
    shim.chmod(0o755)
    return clean_env(PATH=f"{bin_dir}:{os.environ['PATH']}"), record


def test_missing_command_exits_127_when_the_syscall_applied_the_policy(tmp_path: Path) -> None:
    env, record = numactl_shim(tmp_path)
    proc = run(affrun_argv("exec", "--mem-policy", "preferred", "--", "/nonexistent/cmd"), env=env)
    assert proc.returncode == 127, proc.stderr
    assert proc.stderr.strip().splitlines() == ["affrun: error: /nonexistent/cmd: command not found"]
    assert not record.exists(), "numactl ran although set_mempolicy had applied the policy"


@pytest.mark.parametrize(("policy", "kernel_says"), [("preferred", " prefer:0 "), ("membind", " bind:0 ")])
def test_default_backend_applies_the_policy_without_a_wrapper(tmp_path: Path, policy: str, kernel_says: str) -> None:
    env, record = numactl_shim(tmp_path)
    proc = run(affrun_argv("exec", "--mem-policy", policy, "--", "sh", "-c", NUMA_MAPS_HEAD), env=env, check=True)
    assert kernel_says in proc.stdout, proc.stdout
    assert not record.exists(), "numactl ran although set_mempolicy had applied the policy"
    proc = run(affrun_argv("exec", "--mem-policy", policy, "--", "sh", "-c", "exit 7"), env=env)
    assert proc.returncode == 7, proc.stderr


@pytest.mark.parametrize(("policy", "flag", "kernel_says"),
                         [("preferred", "--preferred=0", " prefer:0 "), ("membind", "--membind=0", " bind:0 ")])
def test_numactl_backend_still_wraps(tmp_path: Path, policy: str, flag: str, kernel_says: str) -> None:
    env, record = numactl_shim(tmp_path)
    proc = run(affrun_argv("exec", "--mem-policy", policy, "--mem-backend", "numactl", "--", "sh", "-c",
                           NUMA_MAPS_HEAD), env=env, check=True)
    assert kernel_says in proc.stdout, proc.stdout
    assert record.read_text().splitlines() == [flag, "--", "sh", "-c", NUMA_MAPS_HEAD]


def test_numactl_wraps_where_the_machine_has_no_syscall_number(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An architecture affrun knows no set_mempolicy number for (the table is emptied): numactl takes over."""
    env, record = numactl_shim(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setattr(mempolicy, "SYSCALLS", {})
    numactl = shutil.which("numactl")
    result = apply_mempolicy("membind", (0,), "auto")
    assert (result.policy, result.wrapper, result.warnings) == ("membind", [numactl, "--membind=0", "--"], ())
    assert record.read_text().splitlines() == ["--membind=0", "--", "true"]  # the probe really ran numactl
    result = apply_mempolicy("membind", (0,), "syscall")
    assert (result.policy, result.wrapper) == ("none", [])
    assert "no set_mempolicy system call number for this machine" in result.warnings[0]
