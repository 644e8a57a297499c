"""``launcher.torch.worker_init_fn`` keeps DataLoader workers off every comm core (issue 40, item 4): the rank's
own (``AFFRUN_COMM_CPUS``) and, in ``numa``/``socket`` modes, its sharers', which its mask holds but its compute
and loader CPUs do not. A real DataLoader, fork workers, the rule of :func:`launcher.plan.threads.worker_pool`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import need
from tests.launch import clean_env, run
from tests.system.test_worker_init_foreign_cpus import PROGRAM

pytestmark = pytest.mark.torch

HERE = sorted(os.sched_getaffinity(0))


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("comm") / "masks.py"
    path.write_text(PROGRAM)
    return path


def test_workers_keep_off_a_sharer_s_comm_core(program: Path) -> None:
    # A numa-mode rank whose mask holds two CPUs: it computes on the first, and the second is the comm core of
    # the rank it shares them with (in its mask, in neither its compute nor its comm CPUs). Its workers take the
    # first only (before: both, the sharer's comm core included).
    need(len(HERE) >= 2, "needs two usable CPUs")
    a, b = HERE[:2]
    env = clean_env(AFFRUN_CPUS=f"{a},{b}", AFFRUN_COMPUTE_CPUS=str(a), AFFRUN_THREADS="1")
    proc = run([sys.executable, str(program), "fork"], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    workers = json.loads(proc.stdout)["workers"]
    assert workers and all(mask == [a] for mask in workers), workers
    # its own comm core too, where its variables name it
    env = clean_env(AFFRUN_CPUS=f"{a},{b}", AFFRUN_COMPUTE_CPUS=str(a), AFFRUN_COMM_CPUS=str(b), AFFRUN_THREADS="1")
    proc = run([sys.executable, str(program), "fork"], env=env, timeout=300)
    assert proc.returncode == 0 and all(mask == [a] for mask in json.loads(proc.stdout)["workers"]), proc.stderr[-3000:]
