"""The rounds of a tune: the default plan first, then each family of candidates, pruned as it goes, then the
repeats, interleaved; the budget and the stopping signals (noted, never raised: :func:`noted`) end it with what
it has. It runs with tune as a child subreaper and ends with a last sweep (docs/tune.md).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Literal

from launcher.base.errors import LaunchError
from launcher.feed.verdict import DATA
from launcher.tune.candidates import DEFAULT, clearly_worse, families
from launcher.tune.result import TrialResult
from launcher.tune.sweep import boot_ticks, subreaping, sweep
from launcher.tune.trial import TrialRun, TrialSpec, run_trial

Stopped = Literal["", "budget", "interrupted"]  # "": every trial ran
ASKED = "the script asks affrun (launcher.torch.loader_workers())"
OVERRIDDEN = "overridden: affrun set num_workers of every DataLoader the script built (AFFRUN_FEED_FORCE_WORKERS=1)"


@dataclass
class Session:
    results: list[TrialResult]
    workers_how: str
    stopped: Stopped


STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupts:
    """The first stopping signal received (0: none yet)."""

    def __init__(self) -> None:
        self.signum = 0

    def __call__(self) -> bool:
        return self.signum != 0

    def note(self, signum: int, frame: FrameType | None) -> None:
        if not self.signum:
            self.signum = signum


@contextmanager
def noted(exiting: bool = False) -> Iterator[Interrupts]:
    """Note the stopping signals instead of acting on them, for the ``with`` block (main thread only); a signal
    ignored before stays ignored. After it the handlers before are restored, or with ``exiting`` (the process
    exits next) the signals are ignored, so that one more Ctrl-C does not end tune by the signal."""
    caught = Interrupts()
    previous = {}
    try:
        for sig in STOPPING:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, caught.note)
        yield caught
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_IGN if exiting else handler)


class _Stop(Exception):
    def __init__(self, why: Stopped) -> None:
        super().__init__(why)
        self.why = why


def tune(spec: TrialSpec, rank_cores: int, repeats: int, budget: float, progress: Callable[[str], None],
         interrupted: Callable[[], bool] = lambda: False) -> Session:
    """Run the trials; raise :class:`LaunchError` when the first one (the default plan) fails or never iterates a
    DataLoader. ``interrupted()``: whether to stop (:func:`noted`)."""
    since = boot_ticks()
    with subreaping() as subreaper:
        try:
            return _tune(spec, rank_cores, repeats, budget, progress, interrupted, subreaper)
        finally:
            left = sweep(f"{os.getpid()}-", set(), since)  # every trial's marker begins so
            if left:
                progress(f"warning: {left} process(es) started by the trials could not be stopped")


def _why(trial: TrialRun) -> str:
    if trial.outcome == "no-loader":
        return "never iterated a DataLoader"
    if trial.outcome == "stalled":
        return "stalled: no batch in its measured window"
    return f"failed (exit {trial.exit_code}){': ' + trial.last_line if trial.last_line else ''}"


def _tune(spec: TrialSpec, rank_cores: int, repeats: int, budget: float, progress: Callable[[str], None],
          interrupted: Callable[[], bool], subreaper: bool) -> Session:
    workdir = tempfile.mkdtemp(prefix="affrun-tune-")
    deadline = time.monotonic() + budget
    default = TrialResult(DEFAULT)
    results = [default]
    session = Session(results, "", "")
    counter = [0]
    took: list[float] = []
    force = [True]

    def run(result: TrialResult) -> TrialRun:
        estimate = max(took) if took else 0.0
        if interrupted():
            raise _Stop("interrupted")
        if time.monotonic() + estimate > deadline:
            raise _Stop("budget")
        counter[0] += 1
        started = time.monotonic()
        trial = run_trial(spec, result.candidate.options(), force[0] and not result.candidate.is_default,
                          workdir, f"trial{counter[0]}", deadline, interrupted, subreaper)
        took.append(time.monotonic() - started)
        if trial.survivors:
            progress(f"warning: {trial.survivors} process(es) of trial {counter[0]} could not be stopped")
        if trial.outcome == "interrupted":
            raise _Stop("interrupted")
        if trial.outcome == "out-of-time":
            raise _Stop("budget")
        if trial.outcome == "measured" and trial.window is not None:
            w = trial.window
            result.rates.append(w.batches_per_s)
            result.waits.append(w.data_wait_fraction)
            result.cpu_waits.append(w.cpu_wait_fraction)
            result.gpu_busies.append(w.gpu_busy_fraction)
            result.workers, result.workers_source = w.num_workers, w.workers_source
            cpu = "" if w.cpu_wait_fraction is None else f", cpu wait {100 * w.cpu_wait_fraction:.0f}%"
            busy = "" if w.gpu_busy_fraction is None else f", gpu busy {100 * w.gpu_busy_fraction:.0f}%"
            progress(f"trial {counter[0]} {result.candidate.label()}: {w.batches_per_s:.1f} batches/s, "
                     f"data wait {100 * w.data_wait_fraction:.0f}%{cpu}{busy}")
        else:
            why = _why(trial)
            result.failures.append(why)
            progress(f"trial {counter[0]} {result.candidate.label()}: {why}; skipped")
        return trial

    try:
        first = run(default)
        if not default.measured:
            if first.outcome == "no-loader":
                raise LaunchError("the script never iterated a torch DataLoader in its first trial (the default "
                                  "plan): affrun tune measures the batches a DataLoader feeds the loop")
            if first.outcome == "stalled":
                raise LaunchError("the script stalled in its first trial (the default plan): no batch in its "
                                  "measured window")
            raise LaunchError(f"the script failed in its first trial (the default plan, exit {first.exit_code})"
                              + (f": {first.last_line}" if first.last_line else ""))
        asked = default.workers_source == "asked"
        force[0] = not asked
        session.workers_how = ASKED if asked else OVERRIDDEN
        verdict = default.verdict()
        _first_round(results, rank_cores, run, verdict is not None and DATA in (verdict.kind, verdict.likely))
        for _ in range(repeats - 1):
            for result in list(results):
                if not result.pruned and not result.failures:
                    run(result)
    except _Stop as stop:
        session.stopped = stop.why
    except KeyboardInterrupt:
        session.stopped = "interrupted"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if not session.workers_how:
        session.workers_how = OVERRIDDEN
    return session


def _first_round(results: list[TrialResult], rank_cores: int, run: Callable[[TrialResult], TrialRun],
                 starved: bool = False) -> None:
    """Each family in turn, its worker counts in order; a family stops at a count clearly worse than the one
    before it, and the families stop at one clearly worse than the one before. For a default plan ``starved`` by
    data the walk goes from the most loader cores and workers down (docs/tune.md, "Pruning")."""
    previous_best: TrialResult | None = None
    all_families = [family[::-1] for family in families(rank_cores)[::-1]] if starved else families(rank_cores)
    fewer = "more" if starved else "fewer"
    for index, family in enumerate(all_families):
        members = [TrialResult(c) for c in family]
        results.extend(members)
        before: TrialResult | None = None
        for i, member in enumerate(members):
            run(member)
            if before is not None and before.measured and member.measured and clearly_worse(member.rates, before.rates):
                for rest in members[i + 1:]:
                    rest.pruned = f"pruned: {member.candidate.label()} was clearly slower than {fewer} workers"
                break
            before = member if member.measured else before
        measured = [m for m in members if m.measured]
        if not measured:
            continue
        top = max(measured, key=lambda m: m.median())
        if previous_best is not None and clearly_worse(top.rates, previous_best.rates):
            why = f"pruned: --loader-cores {family[0].loader_cores} was clearly slower than {fewer} loader cores"
            results.extend(TrialResult(later[0], pruned=why) for later in all_families[index + 1:])
            return
        previous_best = top if previous_best is None or top.median() > previous_best.median() else previous_best
