"""The data-wait meter, in the rank: :func:`install` patches torch's DataLoader iterator once the script imports
``torch.utils.data.dataloader``; about once a second the figures go to the rank's live file and ``--feed-json``,
and at exit the rank prints its line (docs/tune.md, "How it works" and "What it costs").
"""

from __future__ import annotations

import os
import sys
import threading
from time import perf_counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

from launcher.feed.cpuwait import CpuWait
from launcher.feed.files import LIMIT, merge_json, own_dir, remove, write_atomic
from launcher.feed.gpubusy import GpuBusy
from launcher.feed.verdict import UNKNOWN, Signals, judge
from launcher.feed.workers import WORKERS_VARIABLE, suggested_workers

FEED_VARIABLE = "AFFRUN_FEED"
INTERVAL_VARIABLE = "AFFRUN_FEED_INTERVAL"
JSON_VARIABLE = "AFFRUN_FEED_JSON"
FORCE_VARIABLE = "AFFRUN_FEED_FORCE_WORKERS"
ALIAS = "_affrun_feed"  # the live meter's module in sys.modules: launcher.torch.loader_workers() tells it it was asked
FLUSH_S = 1.0
MIN_INTERVAL_S = 0.1  # the shortest --feed-interval: a line per rank ten times a second, the files still once a second
PERIODIC_WAIT_S = 0.05  # the longest a periodic flush waits for the JSON's lock (then it tries again a second later)
FINAL_WAIT_S = 5.0  # the longest the final flush waits for it (then one warning)
WORKERS_KEPT = 32  # loaders whose num_workers the figures list
PERIODIC_JSON_LIMIT = 256 << 10  # the largest --feed-json a rank merges into while its loop runs (then: at exit only)
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "AFFRUN_LOCAL_RANK")
KEYS = ("rank", "batches", "seconds", "batches_per_s", "data_wait_fraction", "cpu_wait_fraction", "gpu_busy_fraction",
        "gpu_busy_source", "verdict", "loaders", "num_workers", "workers_source", "final", "pid", "host")

meter: Meter | None = None  # this process's meter, once installed


def live_paths(pid: int, uid: int, environ: dict[str, str] | Any) -> list[str]:
    """Where rank ``pid`` of user ``uid`` keeps its live figures, in the order tried: ``/dev/shm``, then its
    ``TMPDIR`` (else ``/tmp``). ``affrun doctor`` reads the first that exists; a clean exit removes it."""
    bases = ["/dev/shm", environ.get("TMPDIR") or "/tmp"]
    return [os.path.join(base, f"affrun-feed-{uid}", f"{pid}.json") for base in bases]


def feed_line(figures: dict[str, Any]) -> str:
    """``affrun: rank R feed: N batches in S s, B batches/s, data wait P%, cpu wait C%, gpu busy G% (VERDICT)``: the
    CPU wait and the GPU's busy share where they were measured, the verdict where there is one."""
    line = (f"affrun: rank {figures['rank']} feed: {figures['batches']} batches in {figures['seconds']:.1f} s, "
            f"{figures['batches_per_s']:.1f} batches/s, data wait {100 * figures['data_wait_fraction']:.1f}%")
    if figures.get("cpu_wait_fraction") is not None:
        line += f", cpu wait {100 * figures['cpu_wait_fraction']:.1f}%"
    if figures.get("gpu_busy_fraction") is not None:
        line += f", gpu busy {100 * figures['gpu_busy_fraction']:.0f}%"
    verdict = figures.get("verdict")
    return f"{line} ({verdict_words(verdict, figures.get('gpu_busy_fraction') is not None)})" if verdict else line


def verdict_words(verdict: dict[str, Any], gpu: bool = False) -> str:
    """A verdict's JSON in a few words: ``starved-by-data; more loader cores ...``, ``unknown: no GPU signal;
    likely starved-of-cpu (oversubscribed); fewer busy threads ...``, ``fed``. ``gpu``: there was a GPU signal."""
    kind, likely = verdict.get("verdict"), verdict.get("likely")
    text = f"{kind}: no GPU signal" if kind == UNKNOWN and not gpu else str(kind)
    if likely:
        text += f"; likely {likely}"
    if verdict.get("cause"):
        text += f" ({verdict['cause']})"
    return f"{text}; {verdict['fix']}" if verdict.get("fix") else text


def _rank(environ: Any) -> int:
    for name in RANK_VARIABLES:
        text = environ.get(name, "")
        if text.isascii() and text.isdigit():
            return int(text)
    return 0


class Meter:
    """One process's figures, summed over its DataLoaders. The per-batch counts live in the patched ``__next__``'s
    closure (:func:`install`), read through :attr:`counts`; everything else runs in :meth:`tick`, at most once per
    :data:`FLUSH_S`, one thread at a time (:attr:`lock`)."""

    __slots__ = ("asked", "busy", "counts", "cpu", "done", "first", "flush_due", "forced", "gpu", "interval",
                 "json_path", "json_periodic", "live", "loaders", "lock", "pid", "shown", "term", "workers")

    def __init__(self, environ: Any) -> None:
        self.counts: Callable[[], tuple[int, float, float]] = lambda: (0, 0.0, 0.0)  # batches, wait, last batch
        self.first = -1.0
        self.pid = os.getpid()
        self.loaders = 0
        self.workers: list[int] = []  # of the first WORKERS_KEPT loaders
        self.asked = False
        self.forced = False
        self.done = False
        self.lock = threading.Lock()  # held while writing, maybe holding --feed-json's flock: a SIGTERM waits (term)
        self.term = False
        self.json_path = environ.get(JSON_VARIABLE) or ""
        self.json_periodic = True  # False: the file is too large to merge into while the loop runs (at exit only)
        self.cpu = CpuWait()  # the loop thread's wait for a CPU, read at each write
        self.gpu = GpuBusy(environ, _say)  # the GPU's busy share, sampled off the loop's thread
        self.busy: tuple[float, str] | None = None  # the GPU's (share, source) at the latest write
        self.live: str | None = ""  # "": not chosen yet; None: none can be written (warned once)
        self.shown = 0.0
        self.flush_due = 0.0  # when the files are written next: the first tick writes them
        try:
            interval = float(environ.get(INTERVAL_VARIABLE) or 0.0)
        except ValueError:
            interval = 0.0
        self.interval = max(interval, MIN_INTERVAL_S) if 0 < interval < float("inf") else 0.0

    def figures(self, final: bool = False) -> dict[str, Any]:
        batches, wait, last = self.counts()
        seconds = max(last - self.first, 0.0) if self.first >= 0 else 0.0
        data = round(min(wait / seconds, 1.0), 6) if seconds > 0 else None
        cpu = None if self.cpu.fraction is None else round(self.cpu.fraction, 6)
        busy, source = (round(self.busy[0], 6), self.busy[1]) if self.busy else (None, None)
        return {
            "rank": _rank(os.environ), "batches": batches, "seconds": round(seconds, 6),
            "batches_per_s": round(batches / seconds, 3) if seconds > 0 else 0.0,
            "data_wait_fraction": data or 0.0, "cpu_wait_fraction": cpu, "gpu_busy_fraction": busy,
            "gpu_busy_source": source,
            "verdict": judge(Signals(gpu_busy=busy, data_wait=data, cpu_wait=cpu)).to_json(),
            "loaders": self.loaders, "num_workers": list(self.workers),
            "workers_source": "overridden" if self.forced else "asked" if self.asked else "script",
            "final": final, "pid": os.getpid(), "host": os.uname().nodename,
        }

    def tick(self, t0: float, t1: float) -> float:
        """The slow path, about once a second: the first batch's start, the files, the periodic line. Returns
        when the next batch should call it again (a busy JSON lock is tried again a second later, ranks spread)."""
        if self.pid != os.getpid():  # a forked child iterating: the rank's files are its parent's
            return t1 + FLUSH_S
        if self.first < 0:
            self.first = t0
            self.cpu.start(t1)
        if t1 >= self.flush_due:  # the files at most once per FLUSH_S, whatever the interval of the lines
            # a busy lock costs at most PERIODIC_WAIT_S a second: the next try is a second later, ranks spread
            self.flush_due = t1 + FLUSH_S + (0.0 if self.flush(False) else self.pid % 97 / 970)
        due = self.flush_due
        if self.interval:
            if not self.shown:
                self.shown = t1 + self.interval
            elif t1 >= self.shown:
                _say(feed_line(self.figures()))
                self.shown = t1 + self.interval
            due = min(due, self.shown)
        return due

    def flush(self, final: bool) -> bool:
        """Write the figures; ``False`` when they were not (another thread is writing, the JSON's lock was busy)."""
        if not self.lock.acquire(timeout=FINAL_WAIT_S if final else 0):
            return False
        try:
            written = self._flush(final)
        finally:
            self.lock.release()
        if self.term:  # a SIGTERM came meanwhile (_at_exit): act on it now that the locks are released
            self.term = False
            _terminate(self)
        return written

    def measure(self, final: bool) -> None:
        """Read the loop thread's CPU wait and the GPU's busy share. At exit, only within :data:`FLUSH_S` of the
        last batch: a script that goes on without a loader keeps the figures of its loop's last write."""
        now = perf_counter()
        if final and now - self.counts()[2] > FLUSH_S:
            return
        self.cpu.read(now)
        self.busy = self.gpu.figure()

    def _flush(self, final: bool) -> bool:
        if not final:
            self.measure(False)
            self.gpu.poll()
        figures = self.figures(final)
        written = True
        if self.json_path and (final or self.json_periodic):
            try:
                merged = merge_json(self.json_path, figures, FINAL_WAIT_S if final else PERIODIC_WAIT_S,
                                    LIMIT if final else PERIODIC_JSON_LIMIT)
                if merged == "busy" and final:
                    raise OSError(0, f"another process held its lock for {FINAL_WAIT_S:.0f} s: the final figures "
                                     "are not in it")
                if merged == "large":  # bounded work in the loop's thread, whatever the file holds
                    self.json_periodic = False
                    _say(f"affrun: warning: --feed-json {self.json_path}: it holds more than "
                         f"{PERIODIC_JSON_LIMIT >> 10} KiB, more than a rank merges into while its loop runs (the "
                         "figures of many ranks?); this rank writes its figures to it at exit only")
                written = merged != "busy"
            except OSError as exc:
                _say(f"affrun: warning: --feed-json {self.json_path}: {exc.strerror or exc}; "
                     "this rank writes no more figures to it")
                self.json_path = ""
        if final:
            if self.live:
                remove(self.live)
                try:
                    os.rmdir(os.path.dirname(self.live))  # the user's last metered process leaves nothing behind
                except OSError:
                    pass  # another rank's file is still there (a rank that loses the race makes it again)
            return written
        if self.live == "":
            self.live = _live_file()
        if self.live:
            import json

            try:
                write_atomic(self.live, json.dumps(figures, separators=(",", ":")).encode("utf-8"), 0o600)
            except OSError as exc:
                _live_off(f"{self.live}: {exc.strerror or exc}")
                self.live = None
        return written

    def seen(self, loader: Any) -> None:
        """An iterator of ``loader`` was made: count the loader once, with its worker count."""
        if loader.__dict__.get("_affrun_feed_counted"):
            return
        loader.__dict__["_affrun_feed_counted"] = True
        self.loaders += 1
        if self.loaders <= WORKERS_KEPT:  # a script that makes a DataLoader per epoch: the figures stay small
            self.workers.append(int(loader.num_workers))
        if self.loaders == 1:
            _at_exit(self)

    def finish(self) -> None:
        """At exit (or SIGTERM): the line and the final figures, once, in the process that iterated."""
        if self.done or self.pid != os.getpid() or not self.counts()[0]:
            return
        self.done = True
        self.gpu.stop()
        self.measure(True)
        _say(feed_line(self.figures(True)))
        self.flush(True)


def _say(line: str) -> None:
    """One line on stderr; one that holds control characters (a path's newline, an escape sequence) escaped."""
    if not line.isprintable():
        line = line.encode("unicode_escape", "backslashreplace").decode("ascii")
    try:
        os.write(2, (line + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def _live_off(why: str) -> None:
    _say(f"affrun: warning: --feed-report: this rank's live figures for affrun doctor --pid are not written ({why})")


def _live_file() -> str | None:
    """This process's live file, in a directory of its user's own that no one else may write to (one made by
    another user, a link, a directory others may write to: not used); the files of processes that are gone
    (SIGKILL) are removed first. ``None`` (warned once) when there is no such directory."""
    uid = os.getuid()
    for path in live_paths(os.getpid(), uid, os.environ):
        where = os.path.dirname(path)
        try:
            os.mkdir(where, 0o700)
        except OSError:
            pass  # there already (checked below), or its parent is missing or read-only
        if not own_dir(where, uid):
            continue
        try:
            for name in os.listdir(where):
                pid = name.split(".", 1)[0]
                if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                    remove(os.path.join(where, name))
        except OSError:
            continue
        return path
    _live_off("no directory of this user's own in /dev/shm, $TMPDIR or /tmp")
    return None


def _at_exit(m: Meter) -> None:
    """The final figures at a normal exit, and at SIGTERM where the script left the default action: the figures
    are written, then the signal is raised again with its default action (the exit status stays SIGTERM's)."""
    import atexit
    import signal

    atexit.register(m.finish)
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_term(signum: int, frame: Any) -> None:
        m.term = True
        if m.lock.locked():  # a flush is under way (maybe in this thread, below this frame): it acts on term after
            return
        _terminate(m)

    signal.signal(signal.SIGTERM, on_term)


def _terminate(m: Meter) -> None:
    """SIGTERM with the default action: the final figures, then the signal again, which ends the process. Only
    the main thread may restore the default action: from another one, the signal goes to the handler again,
    which finds the figures written."""
    import signal

    m.term = False
    m.finish()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _forced_init(module: Any, m: Meter) -> None:
    """``AFFRUN_FEED_FORCE_WORKERS=1`` (affrun tune's trials): every DataLoader gets the rank's worker count."""
    import functools
    import inspect

    try:
        count = suggested_workers(os.environ)
    except Exception as exc:  # a malformed variable: say so, leave the script's count
        _say(f"affrun: warning: {FORCE_VARIABLE}: {exc}; the script's num_workers are kept")
        return
    cls = module.DataLoader
    init = cls.__init__
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.arguments["num_workers"] = count
        if count == 0:  # what torch refuses without workers
            bound.arguments.update(prefetch_factor=None, persistent_workers=False, multiprocessing_context=None)
        init(*bound.args, **bound.kwargs)
        m.forced = True

    cls.__init__ = __init__


def install(module: Any) -> Meter:
    """Patch ``module`` (``torch.utils.data.dataloader``, just executed) and return the process's meter."""
    global meter
    base = module._BaseDataLoaderIter
    next_batch = base.__next__
    make = base.__init__
    m = meter = Meter(os.environ)
    sys.modules.setdefault(ALIAS, sys.modules[__name__])
    clock = perf_counter
    batches, wait, last, due = 0, 0.0, 0.0, 0.0  # due 0: the first batch calls tick()

    def __next__(self: Any) -> Any:  # the hot path: closure cells are the cheapest state Python has
        nonlocal batches, wait, last, due
        t0 = clock()
        batch = next_batch(self)
        t1 = clock()
        wait += t1 - t0
        batches += 1
        last = t1
        if t1 >= due:
            due = m.tick(t0, t1)
        return batch

    def counts() -> tuple[int, float, float]:
        return batches, wait, last

    m.counts = counts

    def __init__(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        make(self, loader, *args, **kwargs)
        m.seen(loader)

    import functools

    base.__next__ = functools.wraps(next_batch)(__next__)
    base.__init__ = functools.wraps(make)(__init__)
    if os.environ.get(FORCE_VARIABLE) == "1":
        _forced_init(module, m)
    return m


def asked() -> int:
    """``launcher.torch.loader_workers()`` in a metered rank: the script asked affrun for its worker count."""
    if meter is not None:
        meter.asked = True
    return suggested_workers(os.environ)


__all__ = ["FEED_VARIABLE", "FORCE_VARIABLE", "INTERVAL_VARIABLE", "JSON_VARIABLE", "KEYS", "PERIODIC_JSON_LIMIT",
           "WORKERS_VARIABLE", "Meter", "feed_line", "install", "live_paths", "verdict_words"]
