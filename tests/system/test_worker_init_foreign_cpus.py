"""``launcher.torch.worker_init_fn`` under ``AFFRUN_*`` CPU lists from another machine (issue 26, class 11).

CPUs the lists name that this machine does not have: a real DataLoader with workers (fork, spawn, forkserver, two
epochs) runs, says so once for the process (not once per worker, nor per epoch), and pins every worker to CPUs
that exist here; never an ``OSError`` in every worker. The values are refused as a whole, as every reader of them
refuses them (issue 40: one strict reader): the workers share the CPUs the process has.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from launcher.base.cpulist import format_cpulist
from tests.launch import clean_env, run

pytestmark = pytest.mark.torch

HERE = sorted(os.sched_getaffinity(0))
ABSENT = max(HERE) + 1  # no CPU of this machine that the test may use has this id or any above it

PROGRAM = '''
import json, os, sys
import torch
from torch.utils.data import DataLoader, Dataset
from launcher.torch import worker_init_fn


class Masks(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.tensor([os.getpid(), *sorted(os.sched_getaffinity(0))])


if __name__ == "__main__":
    masks = {}
    for epoch in range(2):
        for t in DataLoader(Masks(), batch_size=None, num_workers=2, worker_init_fn=worker_init_fn,
                            multiprocessing_context=sys.argv[1]):
            values = t.tolist()
            masks[values[0]] = values[1:]
    sys.stdout.write(json.dumps({"workers": list(masks.values())}) + "\\n")
'''

CASES = {
    "all-absent": {"AFFRUN_CPUS": f"{ABSENT}-{ABSENT + 3}", "AFFRUN_LOADER_CPUS": f"{ABSENT + 2}-{ABSENT + 3}"},
    "loader-absent": {"AFFRUN_CPUS": format_cpulist(HERE), "AFFRUN_LOADER_CPUS": f"{ABSENT},{ABSENT + 5}"},
    "one-absent": {"AFFRUN_CPUS": f"{HERE[0]},{ABSENT}", "AFFRUN_LOADER_CPUS": f"{HERE[0]},{ABSENT}"},
    "largest-id": {"AFFRUN_CPUS": "65535", "AFFRUN_COMPUTE_CPUS": "65535"},
}


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("foreign") / "masks.py"
    path.write_text(PROGRAM)
    return path


# Every case with fork (Linux's default); spawn and forkserver workers import this module afresh: one case each.
STARTS = [("fork", case) for case in sorted(CASES)] + [("spawn", "all-absent"), ("forkserver", "one-absent")]


@pytest.mark.parametrize(("start", "case"), STARTS)
def test_workers_use_what_exists_and_the_process_warns_once(program: Path, start: str, case: str) -> None:
    variables = CASES[case]
    proc = run([sys.executable, str(program), start], env=clean_env(**variables), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OSError" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("WorkerCpusWarning:") == 1, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "WorkerCpusWarning:" in ln]
    assert "worker_init_fn" in line and str(ABSENT if case != "largest-id" else 65535) in line, line
    workers = json.loads(proc.stdout)["workers"]
    assert len(workers) == 4, workers  # 2 workers in each of 2 epochs
    for mask in workers:
        assert mask and set(mask) <= set(HERE), (mask, HERE)


def test_variables_of_this_machine_say_nothing(program: Path) -> None:
    proc = run([sys.executable, str(program), "fork"],
               env=clean_env(AFFRUN_CPUS=format_cpulist(HERE), AFFRUN_LOADER_CPUS=str(HERE[-1])), timeout=300)
    assert proc.returncode == 0 and "WorkerCpusWarning" not in proc.stderr, proc.stderr[-3000:]
    for mask in json.loads(proc.stdout)["workers"]:
        assert mask == [HERE[-1]]
