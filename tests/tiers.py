"""The test tiers, assigned here and nowhere else (docs/development.md): every test is ``fast``, ``system`` or ``slow``.

fast: tests/unit, in-process, the loop while editing (``pytest -m fast``, under a minute). system: the rest, which
starts processes (``pytest -m "not slow"`` runs both). slow: every test marked ``slow``, ``torch`` or ``slurm``
(torch, torchrun, ``affrun tune``, Slurm) and the tests named below (``pytest -m slow``). Plain ``pytest``
(tests/run_all.sh) runs all three. An entry is a module's file name, or ``FILE::TEST`` for one test of it.
"""

from __future__ import annotations

import pytest

SLOW_MARKERS = ("slow", "torch", "slurm")

# Tests of tests/system that take several seconds though not marked: bounds waited out, torch's own runtime loaded.
SLOW = frozenset({
    "test_run_probe_bound.py::test_strict_refuses_an_interpreter_that_never_answers",
    "test_run_probe_bound.py::test_a_child_left_holding_the_probes_output_cannot_hold_affrun_run",
    "test_doctor_env_processes.py::test_torch_bundled_runtime_is_what_import_torch_loads",
})

# Tests of tests/unit that the fast tier leaves to the system tier: the deepest hypothesis searches of the planner
# (hundreds of plans of every machine each), about 17 of the fast tier's 47 CPU seconds, and the batch scripts,
# whose torchrun style checks the job's command with torch's own parser (an import of torch: 2 s).
UNIT_IN_SYSTEM = frozenset({
    "test_plan_properties.py",
    "test_slurm_render.py",
    "test_thread_plan_invariants.py::test_every_plan_keeps_the_thread_plan_s_promises",
    "test_thread_plan_invariants.py::test_generated_machines_keep_them_too",
})


def tier(item: pytest.Item) -> str:
    """The tier of the collected test ``item``."""
    if any(item.get_closest_marker(name) for name in SLOW_MARKERS):
        return "slow"
    module = item.path.name
    names = {module, f"{module}::{getattr(item, 'originalname', item.name)}"}
    if item.path.parent.name == "unit":
        return "system" if names & UNIT_IN_SYSTEM else "fast"
    return "slow" if names & SLOW else "system"
