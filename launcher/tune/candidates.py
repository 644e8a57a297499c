"""The candidate plans of a tune and the rule that prunes them (docs/tune.md, "The candidates"). Pure."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

CLEARLY_WORSE = 0.9  # a trial at most this fraction of another's batches/s, ranges apart, is clearly worse


@dataclass(frozen=True)
class Candidate:
    """One trial's plan: ``loader_cores`` and ``workers`` per rank; both ``None``: the default plan."""

    loader_cores: int | None = None
    workers: int | None = None

    @property
    def is_default(self) -> bool:
        return self.loader_cores is None

    def options(self) -> list[str]:
        """The affrun options of this plan (none for the default)."""
        if self.loader_cores is None or self.workers is None:
            return []
        return ["--loader-cores", str(self.loader_cores), "--loader-workers", str(self.workers)]

    def label(self) -> str:
        return "default" if self.is_default else " ".join(self.options())


DEFAULT = Candidate()


def families(rank_cores: int) -> list[list[Candidate]]:
    """One family per loader-core count 0..rank_cores // 2, each its worker counts (0, K, 2K) without repeats."""
    out: list[list[Candidate]] = []
    for cores in range(rank_cores // 2 + 1):
        counts = sorted({0, cores, 2 * cores})
        out.append([Candidate(cores, workers) for workers in counts])
    return out


def clearly_worse(rates: list[float], than: list[float]) -> bool:
    """``rates`` (batches/s of a trial's repeats) are clearly below ``than``: the median under
    :data:`CLEARLY_WORSE` of the other's, and (with repeats) the best of them under the worst of the other."""
    if not rates or not than:
        return False
    mine, theirs = statistics.median(rates), statistics.median(than)
    return mine < CLEARLY_WORSE * theirs and max(rates) < min(than)

