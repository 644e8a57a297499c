"""Every example in examples/ runs, the way the README says."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.launch import affrun_argv, clean_env, run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.torch
def test_train_ddp_under_affrun_torchrun() -> None:
    nproc = str(min(2, len(os.sched_getaffinity(0))))
    proc = run(affrun_argv("torchrun", "--nproc-per-node", nproc, str(EXAMPLES / "train_ddp.py"), "--steps", "4"),
               env=clean_env(), timeout=300, check=True)
    for rank in range(int(nproc)):
        assert f"rank {rank}: 4 steps" in proc.stdout, proc.stdout + proc.stderr
