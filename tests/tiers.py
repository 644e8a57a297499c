"""The test tiers, assigned here and nowhere else (docs/development.md): ``fast``, ``system`` or ``slow``.

fast: tests/unit, in-process, the loop while editing (``pytest -m fast``, under a minute). system: the rest of
tests/system, which starts processes. slow: anything marked ``slow``, ``torch`` or ``slurm``, and the modules named
below, whose tests start torch, torchrun, ``affrun tune`` or the OpenMP runtimes (seconds each). ``pytest -m "not
slow"`` runs the first two; plain ``pytest`` (tests/run_all.sh) runs all three.
"""

from __future__ import annotations

import pytest

SLOW_MARKERS = ("slow", "torch", "slurm")

# Modules of tests/system whose every test is slow, though not marked so.
SLOW_MODULES = frozenset({
})

# Tests of tests/unit kept out of the fast tier (the system tier runs them).
UNIT_IN_SYSTEM = frozenset({
})


def tier(item: pytest.Item) -> str:
    if any(item.get_closest_marker(name) for name in SLOW_MARKERS):
        return "slow"
    module = item.path.name
    if item.path.parent.name == "unit":
        return "system" if module in UNIT_IN_SYSTEM else "fast"
    return "slow" if module in SLOW_MODULES else "system"
