"""``affrun doctor --pid`` on NCCL (issue 29, part 4), with real processes: a Python rank that maps a real shared
object compiled here and named like NCCL's (``libnccl.so.2.29.3``, or ``libnccl.so.2`` holding NCCL's version
string), and a thread it names ``NCCL Progress 0`` with ``prctl(PR_SET_NAME)`` that busy-polls on a CPU it pins
itself to. Only NCCL is fake: the threads, masks, names and mappings are the kernel's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need
from tests.launch import affrun_argv
from tests.system.test_doctor_live import audit, findings, job_env, running

pytestmark = pytest.mark.slow

JOB = r"""
import ctypes, os, sys, threading, time
ctypes.CDLL(sys.argv[1])  # the library NCCL would be: mapped, as torch maps libnccl
libc = ctypes.CDLL(None)
proxy_cpus = os.environ.get("NCCL_PROXY_CPUSET")
where = {int(proxy_cpus)} if proxy_cpus else {int(sys.argv[2])}  # NCCL pins its proxy thread to the cpuset
started = threading.Event()

def progress():
    libc.prctl(15, b"NCCL Progress 0", 0, 0, 0)  # PR_SET_NAME, as NCCL_SET_THREAD_NAME=1 names it
    os.sched_setaffinity(0, where)
    started.set()
    while True:  # busy-polls, as NCCL's proxy progress thread does
        pass

threading.Thread(target=progress, daemon=True).start()
started.wait()
os.write(1, f"READY {os.getpid()}\n".encode())
end = time.time() + float(sys.argv[3])
while time.time() < end:
    time.sleep(0.001)
"""


def fake_nccl(tmp_path: Path, name: str, version: str) -> Path:
    """A real shared object named ``name`` that carries NCCL's version string, as ``libnccl.so`` does."""
    need(shutil.which("gcc"), "gcc is not installed")
    src = tmp_path / "nccl.c"
    src.write_text(f'__attribute__((used)) const char nccl_version[] = "NCCL version {version}+cuda12.8";\n'
                   "int ncclGetVersion(int *v) { *v = 0; return 0; }\n")
    out = tmp_path / name
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


def audit_job(tmp_path: Path, library: Path, nccl_cpu_index: int, *options: str) -> dict[str, dict[str, object]]:
    cpus = sorted(os.sched_getaffinity(0))
    need(len(cpus) >= 2, "needs 2 CPUs")
    argv = affrun_argv("exec", *options, "--", sys.executable, "-c", JOB, str(library), str(cpus[nccl_cpu_index]),
                       "60")
    with running(argv, job_env()) as (_proc, lines):
        pid = int(next(x for x in lines if x.startswith("READY")).split()[1])
        _, data = audit(pid, duration=1.0)
    return findings(data)


def test_nccl_thread_on_the_openmp_teams_core_and_a_leaky_version(tmp_path: Path) -> None:
    # --loader-cores 1 on 2 CPUs: the team computes on the first CPU, the loaders on the second. The NCCL thread
    # pins itself to the first: it shares the team's core. libnccl.so.2.29.3 is in the leaky range.
    library = fake_nccl(tmp_path, "libnccl.so.2.29.3", "2.29.3")
    found = audit_job(tmp_path, library, 0, "--loader-cores", "1")
    cpu = sorted(os.sched_getaffinity(0))[0]
    shared = found["nccl-threads-shared"]
    assert "NCCL Progress 0" in str(shared["message"]) and "the OpenMP team" in str(shared["message"])
    assert f"ran on CPUs {cpu}" in str(shared["message"]) and "--comm-cores" in str(shared["fix"])
    assert "2.29.3" in str(found["nccl-mask-leak"]["message"])
    assert str(library) in str(found["nccl-loaded"]["message"])


def test_nccl_thread_on_a_loader_core(tmp_path: Path) -> None:
    library = fake_nccl(tmp_path, "libnccl.so.2.30.1", "2.30.1")
    found = audit_job(tmp_path, library, 1, "--loader-cores", "1")
    assert "the DataLoader workers" in str(found["nccl-threads-shared"]["message"])
    assert "nccl-mask-leak" not in found  # 2.30 is fixed


def test_comm_cores_keep_nccl_apart_and_the_version_string_is_read(tmp_path: Path) -> None:
    # --comm-cores 1: NCCL_PROXY_CPUSET names the second CPU, where the thread pins itself, apart from the team.
    # The library's name has no version (libnccl.so.2, as pip's nvidia-nccl wheels ship it): the version comes
    # from the string in the file.
    library = fake_nccl(tmp_path, "libnccl.so.2", "2.29.7")
    found = audit_job(tmp_path, library, 0, "--comm-cores", "1")
    cpu = sorted(os.sched_getaffinity(0))[1]
    assert "nccl-threads-shared" not in found
    assert f"ran on CPUs {cpu} (NCCL_PROXY_CPUSET={cpu})" in str(found["nccl-threads"]["message"])
    assert "NCCL 2.29.7" in str(found["nccl-mask-leak"]["message"])
