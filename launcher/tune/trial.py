"""One trial: ``affrun torchrun --feed-report --feed-json TMP`` with the user's options and the candidate's, in a
session of its own; warmed up, measured, stopped and swept (docs/tune.md, "One trial")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from launcher.feed.meter import FORCE_VARIABLE  # the meter sets every DataLoader's num_workers
from launcher.tune.capture import Tail
from launcher.tune.measure import Reading, Window, all_advanced, all_started, reading, window
from launcher.tune.sweep import MARKER, Member, boot_ticks, stop, watch

POLL = 0.2
Outcome = Literal["measured", "failed", "no-loader", "stalled", "interrupted", "out-of-time"]


@dataclass(frozen=True)
class TrialSpec:
    argv_before: list[str]  # affrun torchrun's and torchrun's options, as the user gave them
    argv_script: list[str]  # the script (after a "--" when the user wrote one) and its arguments, untouched
    ranks: int
    warmup: float
    seconds: float
    start_timeout: float
    log_dir: bool = True  # give torchrun a --log-dir in tune's own directory (the user named none)


@dataclass(frozen=True)
class TrialRun:
    outcome: Outcome
    window: Window | None
    exit_code: int | None
    last_line: str
    survivors: int  # processes of the trial still alive after the sweep (always 0 unless the kernel refused)


def command(spec: TrialSpec, options: list[str], feed_json: str, log_dir: str | None = None) -> list[str]:
    """The trial's command line: the candidate's options after the user's, so that they win; ``log_dir``:
    torchrun's."""
    logs = ["--log-dir", log_dir] if log_dir is not None and spec.log_dir else []
    return [sys.executable, "-m", "launcher", "torchrun", *spec.argv_before, *logs, "--feed-report", "--feed-json",
            feed_json, *options, *spec.argv_script]


def _read(path: str) -> Reading:
    try:
        with open(path, encoding="utf-8") as fh:
            return reading(json.load(fh))
    except (OSError, ValueError):
        return {}


def run_trial(spec: TrialSpec, options: list[str], force: bool, workdir: str, tag: str, deadline: float,
              interrupted: Callable[[], bool] = lambda: False, subreaper: bool = False) -> TrialRun:
    """Run one trial until its window is measured, it ends, ``deadline`` (``time.monotonic``) passes or
    ``interrupted()``; then stop it and sweep every process it started. ``subreaper``: whether tune is one."""
    feed_json = os.path.join(workdir, f"{tag}.json")
    marker = f"{os.getpid()}-{tag}"
    env = dict(os.environ)
    env[MARKER] = marker
    env.pop(FORCE_VARIABLE, None)
    if force:
        env[FORCE_VARIABLE] = "1"
    family: set[Member] = set()
    since = boot_ticks()
    tail = Tail()
    proc: subprocess.Popen[bytes] | None = None
    outcome, first = "interrupted", None
    try:
        proc = subprocess.Popen(command(spec, options, feed_json, os.path.join(workdir, f"{tag}-logs")),
                                stdin=subprocess.DEVNULL, stdout=tail.fd, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        tail.started()
        outcome, first = _watch(proc, spec, feed_json, deadline, lambda: watch(proc.pid, family, since, subreaper),
                                interrupted)
    except KeyboardInterrupt:  # a caller without launcher.tune.session.noted()
        outcome = "interrupted"
    finally:
        survivors = stop(proc, marker, family, since)
        blame = tail.finish()
    code = None if proc is None else proc.returncode
    measured = first if isinstance(first, Window) else None
    if outcome == "ended":
        final = _read(feed_json)
        start = first if isinstance(first, dict) else {}
        if code:  # whatever it measured: the plan under which the script crashed is no advice
            outcome = "failed"
        elif not final or all(f.loaders == 0 and f.batches == 0 for f in final.values()):
            outcome = "no-loader"
        else:
            measured = window(start, final) or window({}, final)
            outcome = "measured" if measured is not None else "no-loader"
    return TrialRun(outcome, measured, code, blame, survivors)  # type: ignore[arg-type]


def _watch(proc: subprocess.Popen[bytes], spec: TrialSpec, feed_json: str, deadline: float,
           sweep_part: Callable[[], None], interrupted: Callable[[], bool]) -> tuple[str, Window | Reading | None]:
    """Wait for every rank's first batch, warm up, take the first reading, measure, take the last: the outcome and
    the window, or for ``"ended"`` the first reading (``None`` before it). Every poll runs ``sweep_part()``."""
    started_at = time.monotonic()
    warm_until: float | None = None
    first: Reading | None = None
    measure_until = 0.0
    while True:
        sweep_part()
        now = time.monotonic()
        if proc.poll() is not None:
            return "ended", first
        if interrupted():
            return "interrupted", None
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
            if now < measure_until and any(f.final for f in current.values()):
                time.sleep(POLL)  # a rank ended before its window did: the job's exit status decides
                continue
            measured = window(first, current)
            return ("measured", measured) if measured is not None else ("stalled", None)
        time.sleep(POLL)
