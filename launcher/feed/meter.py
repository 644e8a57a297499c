"""The data-wait meter, in the rank: :func:`install` patches torch's DataLoader iterator once the script imports
``torch.utils.data.dataloader`` (the startup hook's import hook calls it; affrun never imports torch).

Per batch: two ``perf_counter`` calls, two additions, two stores and one comparison. About once a second (a batch past
:attr:`Meter.due`) the figures go to the rank's live file (:func:`live_paths`, for ``affrun doctor --pid``) and to
``AFFRUN_FEED_JSON``; at exit, or at SIGTERM when the script has no handler of its own, the rank prints its line
(:func:`feed_line`) and writes its final figures. Once loaded, only the standard library is imported lazily: the
startup hook takes affrun's package out of ``sys.modules`` again. docs/tune.md has the reasoning and the cost.
"""

from __future__ import annotations

import os
import sys
from time import perf_counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

from launcher.feed.workers import WORKERS_VARIABLE, suggested_workers

FEED_VARIABLE = "AFFRUN_FEED"
INTERVAL_VARIABLE = "AFFRUN_FEED_INTERVAL"
JSON_VARIABLE = "AFFRUN_FEED_JSON"
FORCE_VARIABLE = "AFFRUN_FEED_FORCE_WORKERS"
ALIAS = "_affrun_feed"  # the live meter's module in sys.modules: launcher.torch.loader_workers() tells it it was asked
FLUSH_S = 1.0
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "AFFRUN_LOCAL_RANK")
KEYS = ("rank", "batches", "seconds", "batches_per_s", "data_wait_fraction", "loaders", "num_workers",
        "workers_source", "final", "pid", "host")

meter: Meter | None = None  # this process's meter, once installed


def live_paths(pid: int, uid: int, environ: dict[str, str] | Any) -> list[str]:
    """Where rank ``pid`` of user ``uid`` keeps its live figures, in the order tried: ``/dev/shm``, then its
    ``TMPDIR`` (else ``/tmp``). ``affrun doctor`` reads the first that exists; a clean exit removes it."""
    bases = ["/dev/shm", environ.get("TMPDIR") or "/tmp"]
    return [os.path.join(base, f"affrun-feed-{uid}", f"{pid}.json") for base in bases]


def feed_line(figures: dict[str, Any]) -> str:
    """``affrun: rank R feed: N batches in S s, B batches/s, data wait P%``."""
    return (f"affrun: rank {figures['rank']} feed: {figures['batches']} batches in {figures['seconds']:.1f} s, "
            f"{figures['batches_per_s']:.1f} batches/s, data wait {100 * figures['data_wait_fraction']:.1f}%")


def _rank(environ: Any) -> int:
    for name in RANK_VARIABLES:
        text = environ.get(name, "")
        if text.isascii() and text.isdigit():
            return int(text)
    return 0


class Meter:
    """One process's figures, summed over its DataLoaders. The per-batch counts live in the patched ``__next__``'s
    closure (:func:`install`), read through :attr:`counts`; everything else runs in :meth:`tick`, at most once per
    :data:`FLUSH_S`."""

    __slots__ = ("asked", "busy", "counts", "done", "first", "forced", "interval", "json_path", "live", "pid",
                 "shown", "term", "workers")

    def __init__(self, environ: Any) -> None:
        self.counts: Callable[[], tuple[int, float, float]] = lambda: (0, 0.0, 0.0)  # batches, wait, last batch
        self.first = -1.0
        self.pid = os.getpid()
        self.workers: list[int] = []
        self.asked = False
        self.forced = False
        self.done = False
        self.busy = False  # in flush(), maybe holding --feed-json's lock: a SIGTERM now waits for it (term)
        self.term = False
        self.json_path = environ.get(JSON_VARIABLE) or ""
        self.live = ""
        self.shown = 0.0
        try:
            interval = float(environ.get(INTERVAL_VARIABLE) or 0.0)
        except ValueError:
            interval = 0.0
        self.interval = interval if 0 < interval < float("inf") else 0.0

    def figures(self, final: bool = False) -> dict[str, Any]:
        batches, wait, last = self.counts()
        seconds = max(last - self.first, 0.0) if self.first >= 0 else 0.0
        return {
            "rank": _rank(os.environ), "batches": batches, "seconds": round(seconds, 6),
            "batches_per_s": round(batches / seconds, 3) if seconds > 0 else 0.0,
            "data_wait_fraction": round(min(wait / seconds, 1.0), 6) if seconds > 0 else 0.0,
            "loaders": len(self.workers), "num_workers": list(self.workers),
            "workers_source": "overridden" if self.forced else "asked" if self.asked else "script",
            "final": final, "pid": os.getpid(), "host": os.uname().nodename,
        }

    def tick(self, t0: float, t1: float) -> float:
        """The slow path, about once a second: the first batch's start, the files, the periodic line. Returns
        when the next batch should call it again."""
        due = t1 + FLUSH_S
        if self.pid != os.getpid():  # a forked child iterating: the rank's files are its parent's
            return due
        if self.first < 0:
            self.first = t0
        if self.interval:
            if not self.shown:
                self.shown = t1 + self.interval
            elif t1 >= self.shown:
                _say(feed_line(self.figures()))
                self.shown = t1 + self.interval
            due = min(due, self.shown)
        self.flush(False)
        return due

    def flush(self, final: bool) -> None:
        self.busy = True
        try:
            self._flush(final)
        finally:
            self.busy = False
        if self.term:  # a SIGTERM came meanwhile (_at_exit): act on it now that the lock is released
            self.term = False
            _terminate(self)

    def _flush(self, final: bool) -> None:
        figures = self.figures(final)
        if self.json_path:
            try:
                merge_json(self.json_path, figures)
            except OSError as exc:
                _say(f"affrun: warning: --feed-json {self.json_path}: {exc.strerror or exc}")
                self.json_path = ""
        if final:
            if self.live:
                _remove(self.live)
                try:
                    os.rmdir(os.path.dirname(self.live))  # the user's last metered process leaves nothing behind
                except OSError:
                    pass  # another rank's file is still there (a rank that loses the race makes it again)
            return
        if not self.live:
            self.live = _live_file()
        if self.live:
            try:
                _write_atomic(self.live, figures)
            except OSError:
                self.live = ""

    def seen(self, loader: Any) -> None:
        """An iterator of ``loader`` was made: count the loader once, with its worker count."""
        if loader.__dict__.get("_affrun_feed_counted"):
            return
        loader.__dict__["_affrun_feed_counted"] = True
        self.workers.append(int(loader.num_workers))
        if len(self.workers) == 1:
            _at_exit(self)

    def finish(self) -> None:
        """At exit (or SIGTERM): the line and the final figures, once, in the process that iterated."""
        if self.done or self.pid != os.getpid() or not self.counts()[0]:
            return
        self.done = True
        figures = self.figures(True)
        _say(feed_line(figures))
        self.flush(True)


def _say(line: str) -> None:
    try:
        os.write(2, (line + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _write_atomic(path: str, data: Any) -> None:
    import json

    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, separators=(",", ":"))
    os.replace(tmp, path)


def _live_file() -> str:
    """This process's live file, in a directory of its user's only (one made by another user is not used); the
    files of processes that are gone (SIGKILL) are removed first."""
    import stat

    uid = os.getuid()
    for path in live_paths(os.getpid(), uid, os.environ):
        where = os.path.dirname(path)
        try:
            os.makedirs(where, mode=0o700, exist_ok=True)
            info = os.lstat(where)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
                continue
            for name in os.listdir(where):
                pid = name.split(".", 1)[0]
                if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                    _remove(os.path.join(where, name))
            return path
        except OSError:
            continue
    return ""


def merge_json(path: str, figures: dict[str, Any]) -> None:
    """Put this rank's ``figures`` into the JSON list at ``path`` (one object per rank, sorted by rank), under an
    flock of its directory, written to a temporary file and renamed: a reader never sees half a file."""
    import fcntl
    import json

    where = os.path.dirname(os.path.abspath(path))
    fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            with open(path, encoding="utf-8") as fh:
                old = json.load(fh)
        except (OSError, ValueError, RecursionError):  # not the meter's list: replaced, never raised in the loop
            old = []
        ranks = [r for r in old if isinstance(r, dict) and r.get("rank") != figures["rank"]] \
            if isinstance(old, list) else []
        ranks.append(figures)
        ranks.sort(key=lambda r: r["rank"] if isinstance(r.get("rank"), int) else -1)
        _write_atomic(path, ranks)
    finally:
        os.close(fd)


def _at_exit(m: Meter) -> None:
    """The final figures at a normal exit, and at SIGTERM where the script left the default action: the figures
    are written, then the signal is raised again with its default action (the exit status stays SIGTERM's)."""
    import atexit
    import signal
    import threading

    atexit.register(m.finish)
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_term(signum: int, frame: Any) -> None:
        if m.busy:  # the rank holds the JSON's flock: writing again here would wait for it forever
            m.term = True
            return
        _terminate(m)

    signal.signal(signal.SIGTERM, on_term)


def _terminate(m: Meter) -> None:
    """SIGTERM with the default action: the final figures, then the signal again, which ends the process."""
    import signal

    m.finish()
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


__all__ = ["FEED_VARIABLE", "FORCE_VARIABLE", "INTERVAL_VARIABLE", "JSON_VARIABLE", "KEYS", "WORKERS_VARIABLE",
           "Meter", "feed_line", "install", "live_paths", "merge_json"]
