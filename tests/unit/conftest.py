"""Fixtures of the in-process tier."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture
def unbound(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No affrun run around the test (the Python API plans here); this process's mask and environment are put
    back afterwards."""
    for name in ("AFFRUN_RUN", "AFFRUN_PLAN", "AFFRUN_CPUS"):
        monkeypatch.delenv(name, raising=False)
    before = os.sched_getaffinity(0)
    saved = dict(os.environ)
    yield
    os.sched_setaffinity(0, before)
    os.environ.clear()
    os.environ.update(saved)
