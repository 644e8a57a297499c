"""The parent's side of the meter: the ``--feed-*`` and ``--loader-workers`` options as the variables every rank
gets (``AFFRUN_FEED``, ``AFFRUN_FEED_INTERVAL``, ``AFFRUN_FEED_JSON``, ``AFFRUN_LOADER_WORKERS``), for ``affrun exec``,
``run`` and ``torchrun``. No option given: no variable, and the rank patches and imports nothing."""

from __future__ import annotations

import os

from launcher.base.outpath import unwritable
from launcher.errors import ConfigError, Opt
from launcher.feed.files import lock_problem, read_file
from launcher.feed.meter import FEED_VARIABLE, INTERVAL_VARIABLE, JSON_VARIABLE
from launcher.feed.workers import WORKERS_VARIABLE

DESTS = ("feed_report", "feed_interval", "feed_json", "loader_workers")  # the table's FEED_OPTIONS


def feed_variables(args: object, prefix: str = "") -> dict[str, str]:
    """The variables of the feed options an argparse namespace holds (``prefix``: torchrun's ``affrun_``).
    ``--feed-json`` must pass :func:`json_problem`; the path its link points to is the one given to the ranks
    (absolute: ranks may run elsewhere)."""
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
        problem = json_problem(path)
        if problem is not None:
            raise ConfigError(Opt("feed_json", path, quoted=True), f" {problem}")
        out[JSON_VARIABLE] = os.path.realpath(path)
    return out


def json_problem(path: str) -> str | None:
    """Why ``--feed-json PATH`` cannot be used (``None`` when it can): what :func:`launcher.base.outpath.unwritable`
    refuses; a file that is there but holds no meter's figures (the user's own data, a script: never removed or
    replaced by a typo); a filesystem that takes no file lock (:func:`launcher.feed.files.lock_problem`)."""
    problem = unwritable(path)
    if problem is not None:
        return problem
    full = os.path.realpath(path)
    if os.path.lexists(full) and not _holds_figures(read_file(full)):
        return ("is a file that holds no figures of the meter (of a size or content --feed-json never writes): "
                "give another path, or remove the file first")
    return lock_problem(full)


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
    """Before a job's ranks start (``affrun torchrun``, ``affrun run``, and ``affrun exec`` as a job's only rank): a
    JSON file left by an earlier job is removed, so that the file holds this job's ranks only."""
    path = variables.get(JSON_VARIABLE)
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ConfigError(Opt("feed_json", path, quoted=True), f": {exc.strerror or exc}") from None
