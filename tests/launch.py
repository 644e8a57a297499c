"""Helpers to run affrun and the real launchers as subprocesses, and to read what the ranks reported."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest

from tests.conftest import need
from tests.conftest import require_torch as require_torch  # the tests' import of it

PROGRAMS = Path(__file__).resolve().parent / "programs"
RANK_PROBE = PROGRAMS / "rank_probe.py"


def affrun_argv(*args: str) -> list[str]:
    """``affrun ARGS`` through this interpreter, so the test uses the checkout under test."""
    return [sys.executable, "-m", "launcher", *args]


def torchrun_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without variables that would change the launchers' behaviour."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "AFFRUN_", "LOCAL_", "SLURM_", "BLIS_",
                                "NUMEXPR_", "OPENCV_FOR_THREADS", "RAYON_", "NCCL_PROXY",
                                "CUDA_VISIBLE", "ROCR_VISIBLE", "HIP_VISIBLE", "ZE_AFFINITY", "PET_",
                                "TORCHELASTIC_"))}
    env.update(extra)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class StallClock:
    """How long this machine stopped running the tests: the gaps a thread that wakes every 0.25 s sees.

    A CI machine is a virtual machine. One run on record spent 120 s in a single ``import`` of a short-lived
    ``affrun doctor`` (its process was runnable, not blocked in the kernel), with every test around it on time:
    the machine, not the program, had stopped. A time limit that counts those gaps fails a test for the host's
    pause. :func:`communicate` counts only the time the machine ran, so a limit still catches a hang or a spin
    of the program under test, which go on while the machine runs.
    """

    TICK = 0.25
    GAP = 1.0  # a wake-up later than this is a stall, not scheduling noise

    def __init__(self) -> None:
        self._stalled = 0.0
        self._last = time.monotonic()
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="stall-clock", daemon=True).start()

    def _late(self, now: float) -> float:
        late = now - self._last - self.TICK
        return late if late > self.GAP else 0.0

    def _watch(self) -> None:
        while True:
            time.sleep(self.TICK)
            with self._lock:
                now = time.monotonic()
                self._stalled += self._late(now)
                self._last = now

    def running_seconds(self) -> float:
        """A clock that stands still while the machine does: monotonic time less the stalls, counting one
        the watching thread has not woken up from yet (after a pause, the caller may run first)."""
        with self._lock:
            now = time.monotonic()
            return now - self._stalled - self._late(now)


STALLS = StallClock()


def communicate(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """``proc.communicate()``, raising :class:`subprocess.TimeoutExpired` after ``timeout`` seconds of the
    machine running (:class:`StallClock`); the caller kills ``proc``. Retrying ``communicate`` after its own
    timeout loses no output (its documentation says so)."""
    deadline = STALLS.running_seconds() + timeout
    while True:
        left = deadline - STALLS.running_seconds()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        try:
            return proc.communicate(timeout=min(left, 5.0))
        except subprocess.TimeoutExpired:
            continue


def default_sigint() -> None:
    """The ``preexec_fn`` of a child that a test interrupts: SIGINT back to its default action there. A background
    job of a non-interactive shell (nohup, cron, some CI runners) starts with SIGINT ignored, a child inherits
    that, and Python keeps it so. The pytest process keeps what it was given: the rest of the suite tests the
    product with SIGINT ignored too."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 120, cwd: Path | None = None,
        check: bool = False, stdout: IO[Any] | None = None, sigint: bool = False) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True)`` with a ``timeout`` that stalls of the machine do
    not use up (:func:`communicate`). ``stdout``: a file the child writes its output to instead (``stdout`` is
    then ``""``). ``sigint``: the child starts with SIGINT at its default (:func:`default_sigint`)."""
    with subprocess.Popen(argv, env=env if env is not None else clean_env(), stdout=stdout or subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, cwd=cwd,
                          preexec_fn=default_sigint if sigint else None) as child:
        try:
            out, err = communicate(child, timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise
    proc = subprocess.CompletedProcess(argv, child.returncode, out or "", err)
    if check and proc.returncode != 0:
        pytest.fail(f"{argv} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def affrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``affrun ARGS`` (this checkout) in :func:`clean_env` plus ``env``; the caller checks the result."""
    return run(affrun_argv(*args), env=clean_env(**(env or {})))


def executable(path: Path, text: str | bytes) -> Path:
    """A script at ``path`` holding ``text``, mode 0755."""
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    path.chmod(0o755)
    return path


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


OTHER_UID = 65534  # nobody: the other user of the tests that need one (as root)


def another_users_file(tmp_path: Path) -> Path:
    """A file that belongs to another user: made and given away as root, else one of root's."""
    if os.geteuid() != 0:
        return Path("/etc/passwd")
    victim = tmp_path / "theirs.json"
    victim.write_text("[]")
    os.chown(victim, OTHER_UID, OTHER_UID)
    return victim


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` that is a JSON object (rank reports), in order."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        # torchrun --tee prefixes lines with "[rank]:"; rank_probe prints plain JSON.
        line = re.sub(r"^\[[^\]]*\]:", "", line).strip()
        if line.startswith("{") and line.endswith("}"):
            out.append(json.loads(line))
    return out


def rank_lines(stderr: str) -> list[dict[str, str]]:
    """Parse affrun's documented per-rank lines: ``affrun: rank R/N host H cpus L numa L gpu G (PCI) nic N omp T loader L
    [comm L] [main L] mem M``
    (``affrun: starting rank ...`` where ``affrun torchrun`` prints them before its ranks start)."""
    pattern = re.compile(
        r"^affrun: (?:starting )?rank (?P<rank>\d+)/(?P<size>\d+) host (?P<host>\S+) cpus (?P<cpus>\S+) numa (?P<numa>\S+) "
        r"gpu (?P<gpu>-|\d+ \(\S+\)) (?:nic (?P<nic>\S+) )?omp (?P<omp>\d+) loader (?P<loader>\S+)(?: comm (?P<comm>\S+))? "
        r"(?:main (?P<main>\S+) )?mem (?P<mem>\S+)$"
    )
    return [m.groupdict() for line in stderr.splitlines() if (m := pattern.match(line.strip()))]


# LLVM's OpenMP runtime (as in conda-forge's llvm-openmp). Debian 12 has libomp5-14 and libomp5-16, which conflict:
# run_all.sh installs 14 with apt and unpacks 16's package into the virtual environment (its opt/ folder).
LLVM_OMP_VERSIONS = (14, 16)


def llvm_libomp(version: int = 14) -> Path:
    """LLVM libomp ``version``'s library: installed by apt, or unpacked by run_all.sh into ``$VENV/opt``."""
    found = [p for p in (Path(f"/usr/lib/llvm-{version}/lib/libomp.so.5"),
                         Path(sys.prefix) / f"opt/libomp5-{version}/usr/lib/llvm-{version}/lib/libomp.so.5")
             if p.exists()]
    need(found, f"LLVM's libomp {version} is not installed (bash tests/run_all.sh installs it)")
    return found[0]


def intel_libiomp5() -> Path:
    path = Path(sys.prefix) / "lib" / "libiomp5.so"
    need(path.exists(), f"libiomp5.so not in {path.parent} (pip install intel-openmp)")
    return path


# The OpenMP runtimes a torch process can run its parallel regions on: torch's own libgomp, or another one
# preloaded (LD_PRELOAD), whose GOMP_* entry points then serve torch's parallel regions. torch's libgomp still
# loads, and still binds the main thread at `import torch` when a binding variable is set.
TORCH_RUNTIMES = ("libgomp", "libiomp5", "libomp14", "libomp16")


def runtime_env(runtime: str) -> dict[str, str]:
    """The variables that make a torch process use ``runtime`` (one of :data:`TORCH_RUNTIMES`)."""
    if runtime == "libgomp":
        return {}
    if runtime == "libiomp5":
        return {"LD_PRELOAD": str(intel_libiomp5())}
    return {"LD_PRELOAD": str(llvm_libomp(int(runtime.removeprefix("libomp"))))}


def compile_omp(tmp: Path, runtime: str, src: Path | None = None) -> Path:
    """Build an OpenMP C program (default tests/programs/omp_probe.c) against libgomp (``gomp``), Intel's
    libiomp5 (``iomp5``) or LLVM's libomp (``omp`` or ``omp14``: version 14, ``omp16``: version 16). A gcc -fopenmp binary run with LD_PRELOAD=libiomp5 would
    still load libgomp, whose constructor binds first; so the libiomp5 and libomp builds compile with -fopenmp
    (GOMP_* entry points, which both implement) and link against that runtime alone."""
    need(shutil.which("gcc"), "gcc is not installed")
    src = src or PROGRAMS / "omp_probe.c"
    out = tmp / f"{src.stem}_{runtime}"
    if runtime == "gomp":
        subprocess.run(["gcc", "-O1", "-fopenmp", str(src), "-o", str(out)], check=True)
        return out
    obj = tmp / f"{src.stem}_{runtime}.o"
    # libomp's unversioned omp_display_affinity is its Fortran entry (format, length): under GCC's omp.h a C call
    # binds to it and crashes in strncpy. Its C entry point is ompc_display_affinity.
    rename = ["-Domp_display_affinity=ompc_display_affinity"] if runtime.startswith("omp") else []
    subprocess.run(["gcc", "-O1", "-fopenmp", *rename, "-c", str(src), "-o", str(obj)], check=True)
    if runtime.startswith("omp"):
        lib = llvm_libomp(int(runtime[3:] or 14))
        subprocess.run(["gcc", str(obj), "-o", str(out), str(lib), f"-Wl,-rpath,{lib.parent}"], check=True)
        return out
    libdir = intel_libiomp5().parent
    subprocess.run(["gcc", str(obj), "-o", str(out), f"-L{libdir}", "-liomp5", f"-Wl,-rpath,{libdir}"], check=True)
    return out


GOMP_LINE = re.compile(r"level 1 thread 0x[0-9a-f]+ affinity (?P<cpus>[0-9,\-]+)")
IOMP_LINE = re.compile(r"OMP: pid (?P<pid>\d+) tid (?P<tid>\d+) thread (?P<thread>\d+) bound to OS proc set \{(?P<cpus>[0-9,\-]+)\}")


# One format for OMP_DISPLAY_AFFINITY in every runtime (OpenMP 5.0's OMP_AFFINITY_FORMAT: %P pid, %n thread number,
# %A affinity): libgomp, libiomp5 and libomp then print the same line, with the thread number the team gave.
AFFINITY_FORMAT = "affrun-probe pid %P thread %n affinity %A"
AFFINITY_LINE = re.compile(r"affrun-probe pid (?P<pid>\d+) thread (?P<thread>\d+) affinity (?P<cpus>[0-9,\-]+)")


def display_affinity_env() -> dict[str, str]:
    return {"OMP_DISPLAY_AFFINITY": "true", "OMP_AFFINITY_FORMAT": AFFINITY_FORMAT}


def thread_bindings(text: str) -> dict[int, dict[int, frozenset[int]]]:
    """pid -> OpenMP thread number -> the CPUs the runtime bound it to, from :data:`AFFINITY_FORMAT` lines."""
    from launcher.base.cpulist import parse_cpulist

    out: dict[int, dict[int, frozenset[int]]] = {}
    for m in AFFINITY_LINE.finditer(text):
        out.setdefault(int(m["pid"]), {})[int(m["thread"])] = parse_cpulist(m["cpus"])
    return out
