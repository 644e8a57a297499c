"""The ``note:`` lines of every dry run: each rank's environment notes as its record holds them, escaped."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from launcher.bind.wire import Job
    from launcher.plan.record import RankPlan


def rank_notes(job: Job, rank: RankPlan, named: bool, before: Sequence[str] = (),
               after: Sequence[str] = ()) -> list[str]:
    """The ``note:`` lines of ``rank``: ``before``, its environment notes, then ``after``; each after ``rank N:``
    where ``named``."""
    from launcher.base.untrusted import shown

    prefix = f"rank {rank.local_rank}: " if named else ""
    return [shown(f"note: {prefix}{note}") for note in (*before, *job.env(rank).notes, *after)]


def job_notes(plan: str) -> list[str]:
    """The ``note:`` lines of every rank of ``plan`` (``AFFRUN_PLAN``'s value), read as each rank reads it."""
    from launcher.bind.wire import read_job

    job = read_job(plan)
    return [line for rank in job.ranks for line in rank_notes(job, rank, job.size > 1)]
