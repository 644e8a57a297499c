"""The parent's side of the meter: the ``--feed-*`` and ``--loader-workers`` options as the ``AFFRUN_FEED*`` and
``AFFRUN_LOADER_WORKERS`` variables every rank gets; no option given, no variable."""

from __future__ import annotations

import os

from launcher.base.errors import ConfigError, Opt
from launcher.base.outpath import checked, written
from launcher.feed.files import lock_problem, read_open
from launcher.feed.meter import FEED_VARIABLE, INTERVAL_VARIABLE, JSON_VARIABLE
from launcher.feed.workers import WORKERS_VARIABLE

DESTS = ("feed_report", "feed_interval", "feed_json", "loader_workers")  # the table's FEED_OPTIONS


def feed_variables(args: object, prefix: str = "") -> dict[str, str]:
    """The variables of the feed options an argparse namespace holds (``prefix``: torchrun's ``affrun_``).
    ``--feed-json`` must pass :func:`checked_json`."""
    report, interval, path, workers = (getattr(args, prefix + dest, None) for dest in DESTS)
    out: dict[str, str] = {}
    if workers is not None:
        out[WORKERS_VARIABLE] = str(workers)
    if not (report or interval is not None or path is not None):
        return out
    out[FEED_VARIABLE] = "1"
    if interval is not None:
        out[INTERVAL_VARIABLE] = repr(float(interval))
    if path is not None:
        out[JSON_VARIABLE] = checked_json(path)
    return out


def checked_json(path: str) -> str:
    """The real path of ``--feed-json PATH``, or one ConfigError: a path :func:`launcher.base.outpath.check`
    refuses (a file that holds no figures of the meter's included), or one on a filesystem that takes no lock."""
    real = checked(_option(path), path, holds_figures)
    problem = lock_problem(real)
    if problem is not None:
        raise ConfigError(_option(path), f" {problem}")
    return real


def _option(path: str) -> Opt:
    return Opt("feed_json", path, quoted=True)


def holds_figures(fd: int) -> bool:
    """Whether the open file ``fd`` is empty or holds the meter's list of figures (:func:`_holds_figures`)."""
    return _holds_figures(read_open(fd))


def _holds_figures(data: bytes | None) -> bool:
    """Whether ``data`` is empty or a JSON list of objects with a ``rank``, as the meter writes."""
    if data is None:
        return False
    if not data.strip():
        return True
    import json

    try:
        ranks = json.loads(data)
    except (ValueError, RecursionError):
        return False
    return isinstance(ranks, list) and all(isinstance(r, dict) and "rank" in r for r in ranks)


def start_afresh(variables: dict[str, str]) -> None:
    """Before a job's ranks start: a ``--feed-json`` list left by an earlier job is emptied (rewritten, never
    removed)."""
    path = variables.get(JSON_VARIABLE)
    if path and os.path.lexists(path):
        written(_option(path), path, b"[]", holds_figures)
