"""One trial: ``affrun torchrun --feed-report --feed-json TMP`` with the user's options and the candidate's, in a
process group of its own; warmed up, measured, then stopped and swept.

Stopping: SIGTERM to the job's process group (torchrun forwards it to its ranks, which it starts in sessions of
their own), SIGKILL to the group after :data:`GRACE` seconds, then every process that still carries the trial's
marker variable (:data:`MARKER`, which every descendant inherits) or descends from the job is killed and waited
for: no process of a trial outlives it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Literal

from launcher.feed.meter import FORCE_VARIABLE  # the meter sets every DataLoader's num_workers
from launcher.tune.measure import Reading, Window, all_advanced, all_started, reading, window

MARKER = "AFFRUN_TUNE_TRIAL"  # in every process of a trial: what the sweep finds them by
GRACE = 5.0
POLL = 0.2
Outcome = Literal["measured", "failed", "no-loader", "interrupted", "out-of-time"]


@dataclass(frozen=True)
class TrialSpec:
    argv_before: list[str]  # affrun torchrun's and torchrun's options, as the user gave them
    argv_script: list[str]  # the script (after a "--" when the user wrote one) and its arguments, untouched
    ranks: int
    warmup: float
    seconds: float
    start_timeout: float


@dataclass(frozen=True)
class TrialRun:
    outcome: Outcome
    window: Window | None
    exit_code: int | None
    last_line: str
    survivors: int  # processes of the trial still alive after the sweep (always 0 unless the kernel refused)


def command(spec: TrialSpec, options: list[str], feed_json: str) -> list[str]:
    """The trial's command line: the candidate's options go after the user's, so that they win."""
    return [sys.executable, "-m", "launcher", "torchrun", *spec.argv_before, "--feed-report", "--feed-json",
            feed_json, *options, *spec.argv_script]


def _read(path: str) -> Reading:
    try:
        with open(path, encoding="utf-8") as fh:
            return reading(json.load(fh))
    except (OSError, ValueError):
        return {}


def run_trial(spec: TrialSpec, options: list[str], force: bool, workdir: str, tag: str,
              deadline: float) -> TrialRun:
    """Run one trial until its window is measured, it ends, or ``deadline`` (``time.monotonic``) passes."""
    feed_json = os.path.join(workdir, f"{tag}.json")
    log_path = os.path.join(workdir, f"{tag}.log")
    marker = f"{os.getpid()}-{tag}"
    env = dict(os.environ)
    env[MARKER] = marker
    env.pop(FORCE_VARIABLE, None)
    if force:
        env[FORCE_VARIABLE] = "1"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command(spec, options, feed_json), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    family: set[tuple[int, int]] = set()
    try:
        outcome, measured = _watch(proc, spec, feed_json, deadline, family)
    except KeyboardInterrupt:
        outcome, measured = "interrupted", None
    finally:
        survivors = stop(proc, marker, family)
    code = proc.returncode
    if outcome == "ended":
        final = _read(feed_json)
        if not final or all(f.loaders == 0 and f.batches == 0 for f in final.values()):
            outcome = "failed" if code else "no-loader"
        elif code not in (0, None) and measured is None:
            outcome = "failed"
        else:
            measured = measured or window({}, final)
            outcome = "measured" if measured is not None else "no-loader"
    return TrialRun(outcome, measured, code, _last_line(log_path), survivors)  # type: ignore[arg-type]


def _watch(proc: subprocess.Popen[bytes], spec: TrialSpec, feed_json: str, deadline: float,
           family: set[tuple[int, int]]) -> tuple[str, Window | None]:
    """Wait for every rank's first batch, warm up, take the first reading, measure, take the last."""
    started_at = time.monotonic()
    warm_until: float | None = None
    first: Reading | None = None
    measure_until = 0.0
    while True:
        family.update(descendants(proc.pid))
        now = time.monotonic()
        if proc.poll() is not None:
            if first is not None:
                return "measured", window(first, _read(feed_json)) or None
            return "ended", None
        if now > deadline:
            return "out-of-time", None
        current = _read(feed_json)
        if warm_until is None:
            if all_started(current, spec.ranks):
                warm_until = now + spec.warmup
            elif now - started_at > spec.start_timeout:
                return ("no-loader" if not current or all(f.batches == 0 for f in current.values())
                        else "failed"), None
        elif first is None and now >= warm_until:
            first = current
            measure_until = now + spec.seconds + 5 * POLL + 1.5  # the meter writes about once a second
        elif first is not None and (all_advanced(first, current, spec.seconds) or now >= measure_until):
            return "measured", window(first, current)
        time.sleep(POLL)


def _last_line(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            lines = [ln for ln in fh.read().decode(errors="replace").splitlines()
                     if ln.strip() and not ln.startswith(("affrun: starting rank", "affrun: rank "))]
    except OSError:
        return ""
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (errors or lines or [""])[-1].strip()


# ---------------------------------------------------------------------------- stopping and sweeping


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of ``pid`` from /proc, or ``None`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rpartition(")")[2].split()
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def descendants(root: int) -> set[tuple[int, int]]:
    """Every live descendant of ``root`` as (pid, start time), read from /proc."""
    parent_of: dict[int, tuple[int, int]] = {}
    for pid in _pids():
        st = _stat(pid)
        if st is not None:
            parent_of[pid] = st
    out: set[tuple[int, int]] = set()
    for pid, (ppid, start) in parent_of.items():
        seen = pid
        hops = 0
        while ppid and hops < 64:
            if ppid == root:
                out.add((pid, start))
                break
            seen = ppid
            ppid = parent_of.get(seen, (0, 0))[0]
            hops += 1
    return out


def _marked(marker: str) -> set[tuple[int, int]]:
    needle = f"{MARKER}={marker}".encode()
    out: set[tuple[int, int]] = set()
    for pid in _pids():
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if needle in env:
            st = _stat(pid)
            if st is not None:
                out.add((pid, st[1]))
    return out


def _alive(members: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """The members still running as the same process (same start time; a zombie counts as gone)."""
    out = set()
    for pid, start in members:
        st = _stat(pid)
        if st is None or st[1] != start:
            continue
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
                state = fh.read().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            out.add((pid, start))
    return out


def stop(proc: subprocess.Popen[bytes], marker: str, family: set[tuple[int, int]]) -> int:
    """Stop the trial: SIGTERM to its process group, SIGKILL after :data:`GRACE`, then sweep. Returns how many
    of its processes survived (0). A second Ctrl-C meanwhile does not cut the sweep short."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return _stop(proc, marker, family)
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop(proc: subprocess.Popen[bytes], marker: str, family: set[tuple[int, int]]) -> int:
    if proc.poll() is None:  # not reaped: its pid is still the job's, not a stranger's that reuses it
        family.update(descendants(proc.pid))
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    _signal_group(proc.pid, signal.SIGKILL)  # what is left of the group (a rank's workers, a stray child)
    deadline = time.monotonic() + GRACE
    left = _alive(family | _marked(marker))
    while left and time.monotonic() < deadline:
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)
        left = _alive(left | _marked(marker))
    return len(left)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:  # the group is gone
        pass
