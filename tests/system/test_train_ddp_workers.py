"""examples/train_ddp.py sizes its DataLoader workers from affrun's plan and prints each worker's CPUs, as its
docstring promises (issue 21 item 5): no worker on a 1-CPU rank (so no torch warning), one per loader CPU."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.launch import affrun_argv, clean_env, require_torch, run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
NCPU = len(os.sched_getaffinity(0))


def test_one_cpu_ranks_get_no_worker_and_no_warning() -> None:
    require_torch()
    if NCPU < 2:
        pytest.skip("needs 2 CPUs")
    proc = run(affrun_argv("torchrun", "--nproc-per-node", str(NCPU), str(EXAMPLE), "--steps", "2"),
               env=clean_env(), timeout=300, check=True)
    for rank in range(NCPU):
        assert re.search(rf"^rank {rank}: cpus \d+ OMP_NUM_THREADS=1 .* workers 0$", proc.stdout, re.M), proc.stdout
    assert "Warning" not in proc.stderr and "warn" not in proc.stderr.lower(), proc.stderr[-3000:]


def test_loader_cores_give_one_worker_each_on_its_loader_cpu() -> None:
    require_torch()
    if NCPU < 2:
        pytest.skip("needs 2 CPUs")
    proc = run(affrun_argv("torchrun", "--loader-cores", "1", "--nproc-per-node", "1", str(EXAMPLE), "--steps", "2"),
               env=clean_env(), timeout=300, check=True)
    line = re.search(r"^rank 0: cpus (\S+) .* loader (\S+) gpu - workers (\d+)$", proc.stdout, re.M)
    assert line, proc.stdout
    loader = line.group(2)
    assert loader != "-" and line.group(3) == "1"
    workers = re.findall(r"^rank 0 worker (\d+): cpus (\S+)$", proc.stdout, re.M)
    assert workers == [("0", loader)], proc.stdout  # the worker runs on the rank's loader CPU, and says so
