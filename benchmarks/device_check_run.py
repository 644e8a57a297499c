"""benchmarks/device_check.py's machinery: a step's context, its bounded subprocesses, and what it returns.

Every command runs in a session of its own with its output in files (no pipe to fill), and is killed with all
its descendants (torchrun's ranks lead sessions of their own) when it overruns: the step's own limit, and never
past the run's deadline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["ok", "failed", "skipped", "timeout"]
TAIL = 4000  # characters of a command's output kept in the report
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass
class Result:
    """What a step found: ``figures`` (measured or read), ``checks`` (True, False, or None: not applicable)."""

    status: Status = "ok"
    reason: str = ""
    headline: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, bool | None] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    output_tail: str = ""

    def judge(self, rc: int | None = 0) -> Result:
        """``failed`` when the command failed or a check is False (the reason names them); else unchanged."""
        bad = [name for name, value in self.checks.items() if value is False]
        if self.status == "ok" and (rc not in (0, None) or bad):
            self.status = "failed"
            why = ([f"exit status {rc}"] if rc not in (0, None) else []) + [f"check {b} is false" for b in bad]
            self.reason = "; ".join(filter(None, [self.reason, *why]))
        return self


@dataclass
class Call:
    argv: list[str]
    rc: int | None
    out: str
    err: str
    seconds: float
    timed_out: bool

    def tail(self, size: int = TAIL) -> str:
        return (self.out[-size // 2:] + ("\n--- stderr ---\n" if self.err else "") + self.err[-size // 2:]).strip()


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it."""
    try:
        import psutil

        root = psutil.Process(pid)
        victims = [root, *root.children(recursive=True)]
        for p in victims:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(victims, timeout=5)
    except ImportError:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    except Exception:  # psutil.NoSuchProcess: it ended meanwhile
        pass


@dataclass
class Context:
    """What every step shares: the mode, the folders, the deadline, the interpreter and the facts found so far."""

    rehearse: bool
    out: Path
    work: Path
    deadline: float  # time.monotonic() by which every step has ended
    python: str
    env: dict[str, str]  # the base environment of every command
    tree: Path | None = None  # rehearsal: this machine's CPUs with one fake GPU (AFFRUN_FSROOT)
    plan_tree: Path | None = None  # rehearsal: a 16-core one-GPU tree, for what is only planned
    facts: dict[str, Any] = field(default_factory=dict)
    step_end: float = 0.0
    _count: int = 0
    running: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def left(self) -> float:
        return min(self.step_end, self.deadline) - time.monotonic()

    def affrun(self, *args: str) -> list[str]:
        return [self.python, "-m", "launcher", *args]

    def _files(self) -> tuple[Path, Path]:
        self._count += 1
        base = self.work / "logs" / f"{self._count:03d}"
        base.parent.mkdir(parents=True, exist_ok=True)
        return base.with_suffix(".out"), base.with_suffix(".err")

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Path, Path]:
        """Start ``argv`` in the background (the caller ends it with :meth:`finish`)."""
        out, err = self._files()
        with open(out, "wb") as fo, open(err, "wb") as fe:
            proc = subprocess.Popen(argv, env={**self.env, **(env or {})}, stdout=fo, stderr=fe,
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT)
        self.running.append(proc)
        return proc, out, err

    def finish(self, proc: subprocess.Popen[bytes], out: Path, err: Path, timeout: float, t0: float) -> Call:
        timed_out = False
        try:
            proc.wait(timeout=max(0.1, min(timeout, self.left())))
        except subprocess.TimeoutExpired:
            timed_out = True
        if proc.poll() is None or timed_out:
            kill_tree(proc.pid)
            proc.wait()
        if proc in self.running:
            self.running.remove(proc)
        def read(p: Path) -> str:
            return p.read_text(errors="replace") if p.exists() else ""

        argv = [str(a) for a in proc.args] if isinstance(proc.args, list) else [str(proc.args)]
        return Call(argv, None if timed_out else proc.returncode, read(out), read(err), time.monotonic() - t0,
                    timed_out)

    def call(self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 120.0) -> Call:
        """Run ``argv`` to its end, at most ``timeout`` seconds and never past the step's end."""
        t0 = time.monotonic()
        proc, out, err = self.start(argv, env)
        return self.finish(proc, out, err, timeout, t0)

    def stop_all(self) -> None:
        for proc in list(self.running):
            kill_tree(proc.pid)
        self.running.clear()


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` that is one JSON object."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                out.append(value)
    return out


def json_document(text: str) -> Any:
    """The JSON document a command printed (``--json``): the whole text, else from its first ``{`` on."""
    try:
        return json.loads(text)
    except ValueError:
        start = text.find("{")
        return json.JSONDecoder().raw_decode(text[start:])[0] if start >= 0 else None


def starting_lines(err: str) -> list[str]:
    """affrun's rank lines (``affrun: starting rank ...``), as printed."""
    return [line.strip() for line in err.splitlines() if re.match(r"\s*affrun: (starting )?rank \d+/\d+ ", line)]


def nvml_utilisation(seconds: float, interval: float = 0.2) -> tuple[list[float] | None, str]:
    """Every GPU's mean NVML utilisation over ``seconds`` (affrun doctor's sampler), and NVML's state in words;
    ``None`` where NVML is not there."""
    from launcher.doctor.gpu import GpuSampler

    sampler = GpuSampler()
    if not sampler.report_data.available:
        return None, sampler.report().reason
    end = time.monotonic() + seconds
    while True:
        sampler.sample(set())
        if time.monotonic() >= end:
            break
        time.sleep(interval)
    report = sampler.report()
    means = [g.mean_utilisation for g in report.gpus]
    return [round(m, 1) for m in means if m is not None] or None, report.reason
