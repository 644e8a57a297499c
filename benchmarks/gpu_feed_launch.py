"""One launch of the GPU-feed benchmark: start the job, sample it as ``affrun doctor --pid`` does, read its ranks.

The job's ranks print ``{"phase": "ready"}`` when their warm-up ends and train on until the go file exists. Once
every rank is ready it is created: the ranks measure the same window, and the job's process tree is sampled from
``/proc`` meanwhile (``launcher.doctor.sampling.sample_job``: each thread's CPU every ``INTERVAL`` seconds, so the
migration count is a lower bound; NVML utilisation when available).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field

from launcher.base.cpulist import format_cpulist
from launcher.doctor.live import JobAudit
from launcher.doctor.sampling import sample_job
from launcher.errors import AffrunError

INTERVAL = 0.1  # seconds between /proc samples: every run pays the same sampling cost
START_TIMEOUT = 180.0  # seconds for a job to reach its measured phase (imports, workers, warm-up)
# Lines of a failed job's output that say what went wrong, most telling first.
ERROR_PATTERNS = (
    re.compile(r"OMP: Error #\d+: .*"),
    re.compile(r"DataLoader worker \(pid \d+\) is killed by signal: \w+"),
    re.compile(r"affrun: error: .*"),
    re.compile(r"^\w*Error: .*", re.MULTILINE),
)


@dataclass(frozen=True)
class RankReport:
    rank: int
    samples_per_s: float
    device_wait_fraction: float
    device: str


@dataclass
class Outcome:
    ranks: list[RankReport] = field(default_factory=list)
    migrations_per_s: float | None = None
    gpu_util: float | None = None
    start_s: float = 0.0  # from the launch to the measured phase (every rank warm)
    wall_s: float = 0.0  # the whole launch
    worker_cpus: str | None = None  # the CPUs the ranks' DataLoader workers may use (their masks' union)
    error: str | None = None

    @property
    def samples_per_s(self) -> float:
        return sum(r.samples_per_s for r in self.ranks)

    @property
    def device_wait_fraction(self) -> float:
        return sum(r.device_wait_fraction for r in self.ranks) / len(self.ranks) if self.ranks else 1.0


def job_migrations_per_s(audit: JobAudit) -> float:
    """Migrations per second of all threads of the ranks and their children (DataLoader workers)."""
    moves = sum(t.migrations for p in audit.processes if p.role in ("rank", "child") for t in p.threads.values())
    return moves / audit.duration if audit.duration > 0 else 0.0


def job_worker_cpus(audit: JobAudit) -> str:
    cpus: set[int] = set()
    for p in audit.processes:
        if p.role == "child":
            cpus |= p.mask
    return format_cpulist(frozenset(cpus))


def job_gpu_util(audit: JobAudit) -> float | None:
    """Mean NVML utilisation of the GPUs the job used (all GPUs when NVML names none of the job's processes)."""
    gpus = audit.gpus.gpus if audit.gpus.available else []
    used = [g for g in gpus if g.pids] or gpus
    means = [m for m in (g.mean_utilisation for g in used) if m is not None]
    return sum(means) / len(means) if means else None


def failure_text(output: str, returncode: int) -> str:
    """The telling lines of a failed job's output (an OpenMP error and the DataLoader's report of it), joined."""
    found = [m.group(0).strip().rstrip(".") for m in (p.search(output) for p in ERROR_PATTERNS) if m]
    if found:
        return "; ".join(dict.fromkeys(found[:2]))
    tail = [line for line in output.splitlines() if line.strip()]
    return f"exit status {returncode}" + (f": {tail[-1].strip()[:200]}" if tail else "")


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (torchrun's ranks lead sessions of their own: no killpg)."""
    import psutil

    try:
        root = psutil.Process(pid)
        victims = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in victims:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def launch(argv: list[str], env: dict[str, str], seconds: float, ranks: int, go_file: str,
           start_timeout: float = START_TIMEOUT) -> Outcome:
    """Run ``argv`` (its ranks get ``--go-file go_file``); sample it while its ranks measure. A job whose ranks are
    not all ready within ``start_timeout`` seconds is killed (a hung launch costs no more than that)."""
    if os.path.exists(go_file):
        os.unlink(go_file)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines: list[str] = []
    errors: list[str] = []
    measuring = threading.Event()
    all_ready: list[bool] = []

    def read_stdout() -> None:
        assert proc.stdout is not None
        ready = 0
        for line in proc.stdout:
            lines.append(line)
            if '"phase": "ready"' in line:
                ready += 1
                if ready == ranks:
                    open(go_file, "w").close()
                    all_ready.append(True)
                    measuring.set()
        measuring.set()  # the job ended (perhaps before measuring): stop waiting

    def read_stderr() -> None:
        assert proc.stderr is not None
        errors.extend(proc.stderr)

    readers = [threading.Thread(target=read_stdout, daemon=True), threading.Thread(target=read_stderr, daemon=True)]
    for t in readers:
        t.start()
    try:
        outcome = _measure(proc, measuring, seconds, start_timeout)
    finally:
        if proc.poll() is None:  # interrupted, or it overran: end the job, its ranks and their workers
            kill_tree(proc.pid)
            proc.wait()
            errors.append(f"killed: still running {start_timeout + seconds * 4:.0f} s after its start\n" if all_ready
                          else f"killed: its ranks were not all ready {start_timeout:.0f} s after its start\n")
        for t in readers:
            t.join(timeout=10)
        if os.path.exists(go_file):
            os.unlink(go_file)
    outcome.wall_s = time.monotonic() - t0
    for line in lines:
        if line.startswith("{") and '"samples_per_s"' in line:
            r = json.loads(line)
            outcome.ranks.append(RankReport(r["rank"], r["samples_per_s"], r["device_wait_fraction"], r["device"]))
    if proc.returncode != 0 or len(outcome.ranks) != ranks:
        outcome.error = failure_text("".join(errors) + "".join(lines), proc.returncode)
        outcome.ranks = []
    return outcome


def _measure(proc: subprocess.Popen[str], measuring: threading.Event, seconds: float,
             start_timeout: float) -> Outcome:
    """Sample the job while its ranks measure, then wait for it to end (at most the time a slow job needs); a job
    not ready within ``start_timeout`` is left for :func:`launch` to kill."""
    t0 = time.monotonic()
    outcome = Outcome()
    ready = measuring.wait(start_timeout)
    outcome.start_s = time.monotonic() - t0
    if not ready:
        return outcome
    if proc.poll() is None:
        try:
            audit: JobAudit = sample_job(proc.pid, duration=seconds * 0.9, interval=INTERVAL)
            outcome.migrations_per_s = job_migrations_per_s(audit)
            outcome.gpu_util = job_gpu_util(audit)
            outcome.worker_cpus = job_worker_cpus(audit)
        except AffrunError:
            pass  # the job ended while it was read: its own output says why
    try:
        proc.wait(timeout=start_timeout + seconds * 4)
    except subprocess.TimeoutExpired:
        pass  # launch() kills it
    return outcome
