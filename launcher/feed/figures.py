"""The figures the ranks' meters wrote, read back as records: a rank's live file (``affrun doctor --pid``) and the
``--feed-json`` objects (``affrun tune``). Anything malformed is left out, never an exception; a live file counts
only in a directory of the rank's user's own."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from launcher.base.untrusted import BadJSON, load_json
from launcher.feed.files import own_dir, read_file
from launcher.feed.meter import FEED_VARIABLE, live_paths
from launcher.feed.verdict import KINDS, Signals

WorkersSource = Literal["asked", "overridden", "script"]
SOURCES: tuple[WorkersSource, ...] = ("asked", "overridden", "script")
BUSY_SOURCES = ("process", "device")  # launcher.feed.gpubusy's PROCESS, DEVICE


@dataclass(frozen=True)
class FeedFigures:
    """One rank's figures, the keys of ``--feed-json``'s objects (docs/tune.md)."""

    rank: int
    batches: int
    seconds: float
    batches_per_s: float
    data_wait_fraction: float
    loaders: int
    num_workers: tuple[int, ...]
    workers_source: WorkersSource
    final: bool
    pid: int
    host: str
    cpu_wait_fraction: float | None = None  # the loop thread's wait for a CPU, 0..1; None: not measured
    gpu_busy_fraction: float | None = None  # the GPU's busy share, 0..1; None: no NVML, no GPU
    gpu_busy_source: str | None = None  # "process" or "device": how NVML measured it
    verdict: str | None = None  # the meter's verdict (launcher.feed.verdict.KINDS); None: an older meter's figures

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "num_workers": list(self.num_workers)}

    def signals(self) -> Signals:
        """What these figures give :func:`launcher.feed.verdict.judge` (the meter's own verdict is judged so)."""
        return Signals(gpu_busy=self.gpu_busy_fraction, data_wait=self.data_wait_fraction if self.seconds else None,
                       cpu_wait=self.cpu_wait_fraction)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value: object) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf")
    return float(value) if ok else None  # type: ignore[arg-type]


def _fraction(item: dict[Any, Any], key: str) -> tuple[bool, float | None]:
    """(valid, value) of an optional fraction: absent or null is valid (``None``), else a number in 0..1."""
    value = item.get(key)
    if value is None:
        return True, None
    number = _number(value)
    return number is not None and number <= 1, number


def _extra(item: dict[Any, Any]) -> tuple[float | None, float | None, str | None, str | None] | None:
    """The keys a newer meter adds, each optional; ``None`` when one is there but malformed."""
    (cpu_ok, cpu), (gpu_ok, gpu) = _fraction(item, "cpu_wait_fraction"), _fraction(item, "gpu_busy_fraction")
    source, verdict = item.get("gpu_busy_source"), item.get("verdict")
    kind = verdict.get("verdict") if isinstance(verdict, dict) else verdict
    if not (cpu_ok and gpu_ok) or source not in (None, *BUSY_SOURCES) or kind not in (None, *KINDS):
        return None
    return cpu, gpu, source, kind


def figures_of(item: object) -> FeedFigures | None:
    """One object of the meter's JSON as :class:`FeedFigures`; ``None`` when a key is missing or out of range (the
    CPU wait, the GPU's busy share and its source, and the verdict may be missing: an older meter's figures)."""
    if not isinstance(item, dict):
        return None
    counts = [_count(item.get(k)) for k in ("rank", "batches", "loaders", "pid")]
    numbers = [_number(item.get(k)) for k in ("seconds", "batches_per_s", "data_wait_fraction")]
    workers = item.get("num_workers")
    source, final, host = item.get("workers_source"), item.get("final"), item.get("host")
    if (None in counts or None in numbers or not isinstance(workers, list) or any(_count(w) is None for w in workers)
            or source not in SOURCES or not isinstance(final, bool) or not isinstance(host, str)
            or numbers[2] is None or numbers[2] > 1):
        return None
    extra = _extra(item)
    if extra is None:
        return None
    rank, batches, loaders, pid = (c or 0 for c in counts)
    seconds, per_s, wait = (n or 0.0 for n in numbers)
    return FeedFigures(rank, batches, seconds, per_s, wait, loaders, tuple(workers),
                       source, final, pid, host, *extra)


def _read(path: str, uid: int | None = None) -> object:
    data = read_file(path, uid)
    try:
        return None if data is None else load_json(data, finite=True)
    except BadJSON:
        return None


def read_live(pid: int, environ: Mapping[str, str], proc: str = "/proc") -> FeedFigures | None:
    """The live figures of process ``pid`` (whose environment is ``environ``) when it runs under the meter and
    has iterated a DataLoader; ``None`` otherwise."""
    if not environ.get(FEED_VARIABLE):
        return None
    try:
        uid = os.stat(os.path.join(proc, str(pid))).st_uid
    except OSError:
        return None
    for path in live_paths(pid, uid, environ):
        if not own_dir(os.path.dirname(path), uid):  # another user made it (for this one): its files are no figures
            continue
        found = figures_of(_read(path, uid))
        if found is not None and found.pid == pid:
            return found
    return None
