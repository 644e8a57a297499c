from __future__ import annotations

import pytest

from launcher.context.local_rank import LocalRankError, detect_local_rank


def test_first_launcher_wins() -> None:
    env = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "2"}
    found = detect_local_rank(env)
    assert found is not None and (found.rank, found.size, found.source) == (1, 4, "LOCAL_RANK")


@pytest.mark.parametrize(("text", "node", "expected"), [("4", 0, 4), ("2(x3),1", 2, 2), ("2(x3),1", 3, 1), ("3,5", 1, 5)])
def test_slurm_compressed_tasks_per_node(text: str, node: int, expected: int) -> None:
    found = detect_local_rank({"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": text, "SLURM_NODEID": str(node)})
    assert found is not None and found.size == expected


def test_slurm_falls_back_to_ntasks_per_node() -> None:
    found = detect_local_rank({"SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2"})
    assert found is not None and (found.rank, found.size) == (1, 2)


@pytest.mark.parametrize(
    "env",
    [{"LOCAL_RANK": "x", "LOCAL_WORLD_SIZE": "2"}, {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, {"PMI_LOCAL_RANK": "0"},
     {"SLURM_LOCALID": "0"}],
)
def test_bad_values_are_errors(env: dict[str, str]) -> None:
    with pytest.raises(LocalRankError):
        detect_local_rank(env)


def test_nothing_set() -> None:
    assert detect_local_rank({}) is None


@pytest.mark.parametrize(("env", "message"), [
    ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE gives 0 local ranks (LOCAL_RANK=0)"),
    ({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=3 is outside 0..1 (LOCAL_WORLD_SIZE gives 2 local ranks)"),
    ({"SLURM_LOCALID": "2", "SLURM_NTASKS_PER_NODE": "2"},
     "SLURM_LOCALID=2 is outside 0..1 (SLURM_STEP_TASKS_PER_NODE/SLURM_NTASKS_PER_NODE gives 2 local ranks)"),
])
def test_a_rank_outside_its_size_names_both_variables(env: dict[str, str], message: str) -> None:
    with pytest.raises(LocalRankError) as caught:
        detect_local_rank(env)
    assert str(caught.value).startswith(message), str(caught.value)
