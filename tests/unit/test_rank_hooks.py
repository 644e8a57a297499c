"""The pure parts of the rank's thread hooks: the pool sizes a worker takes from its CPUs and the user's values
(``launcher.bind.pools.pool_sizes``), the thread plan a live rank reads from its ``AFFRUN_*`` variables
(``launcher.bind.rank_hooks.live_plan``), and the startup hook's one import hook (``when_imported``), with real
modules imported by Python's own machinery. What the hooks do in real ranks and workers:
tests/system/test_thread_homes.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from launcher.bind.pools import VARIABLES, pool_sizes
from launcher.bind.rank_hooks import live_plan

ROOT = Path(__file__).resolve().parents[2]
RANK = {"AFFRUN_LOCAL_RANK": "1", "AFFRUN_CPUS": "4-7", "AFFRUN_COMPUTE_CPUS": "4-7", "AFFRUN_THREADS": "4"}


def test_every_pool_takes_the_workers_cpus_by_default() -> None:
    sizes, policy, notes = pool_sizes(3, {"OPENCV_FOR_THREADS_NUM": "64", "OMP_NUM_THREADS": "8"})
    assert sizes == dict.fromkeys(VARIABLES, 3) and policy == "safe" and notes == []


def test_a_users_value_is_never_raised_and_kept_as_it_is_under_keep() -> None:
    env = {"AFFRUN_USER_POOLS": "OPENCV_FOR_THREADS_NUM, RAYON_NUM_THREADS", "OPENCV_FOR_THREADS_NUM": "1",
           "RAYON_NUM_THREADS": "16"}
    sizes, _, _ = pool_sizes(4, env)
    assert sizes["OPENCV_FOR_THREADS_NUM"] == 1 and sizes["RAYON_NUM_THREADS"] == 4 and sizes["OMP_NUM_THREADS"] == 4
    kept, policy, notes = pool_sizes(4, {**env, "AFFRUN_ENV_POLICY": "keep"})
    assert kept["OPENCV_FOR_THREADS_NUM"] is None and kept["RAYON_NUM_THREADS"] is None and policy == "keep"
    assert kept["NUMEXPR_NUM_THREADS"] == 4 and notes == []
    overridden, _, _ = pool_sizes(4, {**env, "AFFRUN_ENV_POLICY": "override"})
    assert overridden == dict.fromkeys(VARIABLES, 4)


def test_openmps_levels_are_a_count_as_the_env_policy_reads_them() -> None:
    env = {"AFFRUN_USER_POOLS": "OMP_NUM_THREADS,RAYON_NUM_THREADS", "OMP_NUM_THREADS": "2,1",
           "RAYON_NUM_THREADS": "2,1"}
    sizes, _, notes = pool_sizes(8, env)
    assert sizes["OMP_NUM_THREADS"] == 2 and sizes["RAYON_NUM_THREADS"] == 8
    assert notes == ["RAYON_NUM_THREADS='2,1' is not a thread count: 8 is used"]


@pytest.mark.parametrize("value", ["lots", "", "0", "-2", "²", "9" * 50])
def test_a_malformed_users_value_is_no_thread_count_to_keep(value: str) -> None:
    env = {"AFFRUN_USER_POOLS": "NUMEXPR_NUM_THREADS", "NUMEXPR_NUM_THREADS": value, "AFFRUN_ENV_POLICY": "keep"}
    sizes, _, notes = pool_sizes(2, env)
    assert sizes["NUMEXPR_NUM_THREADS"] == 2
    (note,) = notes
    assert note.startswith("NUMEXPR_NUM_THREADS=") and note.endswith("is not a thread count: 2 is used")
    assert len(note) < 200


def test_malformed_affrun_variables_are_notes_not_failures() -> None:
    sizes, policy, notes = pool_sizes(2, {"AFFRUN_ENV_POLICY": "strict", "AFFRUN_USER_POOLS": "PATH,,OMP_NUM_THREADS"})
    assert policy == "safe" and sizes["OMP_NUM_THREADS"] == 2
    assert len(notes) == 2 and "AFFRUN_ENV_POLICY='strict'" in notes[0] and "'PATH'" in notes[1]


def test_a_live_ranks_plan_is_the_thread_plan_of_its_variables() -> None:
    plan = live_plan(RANK, 3)
    assert plan.local_rank == 1 and plan.main.cpus == (4, 5, 6, 7) and not plan.main.pinned
    assert [w.cpus for w in plan.workers] == [(4, 5), (6,), (7,)] and plan.interop.threads == 4
    pinned = live_plan({**RANK, "AFFRUN_MAIN_CPUS": "4", "AFFRUN_LOADER_CPUS": "7", "AFFRUN_COMPUTE_CPUS": "4-6",
                        "AFFRUN_THREADS": "3"}, 2)
    assert pinned.main.cpus == (4,) and pinned.main.pinned and pinned.interop.threads == 1
    assert [w.cpus for w in pinned.workers] == [(7,), (7,)] and pinned.pin_memory.cpus == (7,)


@pytest.mark.parametrize(("name", "value"), [("AFFRUN_MAIN_CPUS", "first"), ("AFFRUN_CPUS", "0-"),
                                             ("AFFRUN_THREADS", "four")])
def test_a_live_rank_with_a_malformed_variable_names_it(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        live_plan({**RANK, name: value})


def test_a_process_without_affrun_cpus_is_no_live_rank() -> None:
    with pytest.raises(LookupError):
        live_plan({"AFFRUN_LOCAL_RANK": "0"})


# ------------------------------------------------------------------------------ the startup hook's import hook
@pytest.fixture
def hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """build_backend/_affrun_startup.py loaded under a name of its own, a directory of fresh modules on sys.path,
    and sys.meta_path as it was afterwards."""
    spec = importlib.util.spec_from_file_location("_affrun_startup_under_test", ROOT / "build_backend" / "_affrun_startup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    for name in ("hook_probe_a", "hook_probe_b"):
        (tmp_path / f"{name}.py").write_text("ran = True\n")
        monkeypatch.delitem(sys.modules, name, raising=False)
    return module


def test_callbacks_run_once_the_module_has_run_and_the_hook_leaves(hook: Any) -> None:
    seen: list[tuple[str, bool]] = []

    def record(module: ModuleType) -> None:
        seen.append((module.__name__, module.ran))

    hook.when_imported("hook_probe_a", record)
    hook.when_imported("hook_probe_b", record)
    import hook_probe_a  # noqa: F401

    assert seen == [("hook_probe_a", True)] and hook.ImportHook in sys.meta_path  # b still waits
    import hook_probe_b  # noqa: F401

    assert seen == [("hook_probe_a", True), ("hook_probe_b", True)] and hook.ImportHook not in sys.meta_path
    importlib.reload(sys.modules["hook_probe_a"])
    assert len(seen) == 2


def test_a_failing_callback_is_one_warning_line_and_the_import_goes_on(hook: Any, capfd: pytest.CaptureFixture[str]) -> None:
    def fail(module: ModuleType) -> None:
        raise RuntimeError("broken")

    hook.when_imported("hook_probe_a", fail)
    import hook_probe_a

    assert hook_probe_a.ran
    assert capfd.readouterr().err == "affrun: warning: hook_probe_a: RuntimeError: broken\n"


def test_a_module_that_does_not_exist_still_fails_as_python_says(hook: Any) -> None:
    hook.when_imported("hook_probe_missing", lambda module: None)
    with pytest.raises(ModuleNotFoundError):
        import hook_probe_missing  # noqa: F401
    assert hook.ImportHook not in sys.meta_path
