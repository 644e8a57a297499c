"""examples/train_ddp.py sizes its DataLoader workers from affrun's plan and prints each worker's CPUs, as its
docstring promises (issue 21 item 5): no worker on a 1-CPU rank (so no torch warning), one per loader CPU."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.launch import affrun_argv, clean_env, run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
NCPU = len(os.sched_getaffinity(0))


@pytest.mark.torch
def test_one_cpu_ranks_get_no_worker_and_no_warning() -> None:
    if NCPU < 2:
        pytest.skip("needs 2 CPUs")
    proc = run(affrun_argv("torchrun", "--nproc-per-node", str(NCPU), str(EXAMPLE), "--steps", "2"),
               env=clean_env(), timeout=300, check=True)
    for rank in range(NCPU):
        assert re.search(rf"^rank {rank}: cpus \d+ OMP_NUM_THREADS=1 .* workers 0$", proc.stdout, re.M), proc.stdout
    assert "Warning" not in proc.stderr and "warn" not in proc.stderr.lower(), proc.stderr[-3000:]


@pytest.mark.torch
def test_loader_cores_give_one_worker_each_on_its_loader_cpu() -> None:
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


EXIT_PROBE = """\
import atexit, os, runpy, sys
def threads_at_exit() -> None:
    sys.stdout.write(f"rank {os.environ['RANK']} threads at exit: {len(os.listdir('/proc/self/task'))}\\n")
atexit.register(threads_at_exit)  # runs after the script's main() returns, before the interpreter finalizes
sys.argv[0] = EXAMPLE
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.torch
def test_no_thread_outlives_the_script(tmp_path: Path) -> None:
    """The script frees its process group before it ends, so that no gloo thread is left when the interpreter
    exits: one still freeing the last allreduce then needs the GIL, Python ends that thread, and the rank
    aborts ("terminate called without an active exception", at random: docs/design.md, torchrun)."""
    if NCPU < 2:
        pytest.skip("needs 2 CPUs")
    probe = tmp_path / "exit_probe.py"
    probe.write_text(EXIT_PROBE.replace("EXAMPLE", repr(str(EXAMPLE))))
    proc = run(affrun_argv("torchrun", "--nproc-per-node", "2", str(probe), "--steps", "2"),
               env=clean_env(), timeout=300, check=True)
    assert sorted(re.findall(r"^rank (\d) threads at exit: (\d+)$", proc.stdout, re.M)) == [("0", "1"), ("1", "1")], \
        proc.stdout + proc.stderr[-3000:]
