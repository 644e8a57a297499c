"""The environment notes of every dry run (``affrun exec --dry-run``, ``affrun run --dry-run``, ``affrun torchrun
--affrun-dry-run``): each rank's notes as its record holds them, the record every rank reads and applies, so that
a dry run shows what the ranks would say (docs/threads.md). One ``note:`` line a note, escaped."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from launcher.bind.wire import Job
    from launcher.plan.record import RankPlan


def rank_notes(job: Job, rank: RankPlan, named: bool, before: Sequence[str] = (),
               after: Sequence[str] = ()) -> list[str]:
    """The ``note:`` lines of ``rank``: ``before``, its environment notes (a value of the user's kept or replaced,
    ``--rank-hooks none`` with a main core...), then ``after``; each after ``rank N:`` where ``named`` (a dry
    run of several ranks)."""
    from launcher.base.untrusted import shown

    prefix = f"rank {rank.local_rank}: " if named else ""
    return [shown(f"note: {prefix}{note}") for note in (*before, *job.env(rank).notes, *after)]


def job_notes(plan: str) -> list[str]:
    """The ``note:`` lines of every rank of the plan ``plan`` (``AFFRUN_PLAN``'s value, as a parent writes it),
    read as each rank reads it."""
    from launcher.bind.wire import read_job

    job = read_job(plan)
    return [line for rank in job.ranks for line in rank_notes(job, rank, job.size > 1)]
