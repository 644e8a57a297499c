"""``launcher.torch.worker_init_fn`` given what torch never passes it: one ``ConfigError`` naming ``worker_id``,
raised in a real DataLoader worker (torch re-raises it in the loop), and outside any worker, where pinning would
move the process that called it (the rank's main thread, after ``bind_rank``)."""

from __future__ import annotations

import sys

import pytest

from tests.launch import clean_env, run

PROGRAM = '''
import os, sys
import torch
from torch.utils.data import DataLoader
from launcher.errors import ConfigError
from launcher.torch import worker_init_fn

before = os.sched_getaffinity(0)
try:
    worker_init_fn(0)
except ConfigError as exc:
    print("outside:", exc)
assert os.sched_getaffinity(0) == before
bad = eval(sys.argv[1])
loader = DataLoader(range(4), num_workers=2, worker_init_fn=lambda k: worker_init_fn(bad(k)),
                    multiprocessing_context="fork")
try:
    list(loader)
except ConfigError as exc:
    print("worker:", str(exc).splitlines()[-1])  # torch re-raises the worker's ConfigError, its traceback in it
'''


@pytest.mark.torch
@pytest.mark.parametrize(("bad", "shown"), [
    ("lambda k: k + 2", "worker_id=2 "), ("lambda k: -1", "worker_id=-1 "), ("lambda k: True", "worker_id=True "),
    ("lambda k: str(k)", "worker_id='0' "), ("lambda k: 2 ** 70", "worker_id=1180591620717411303424 "),
    ("lambda k: None", "worker_id=None ")])
def test_a_worker_id_that_is_no_worker_of_the_loader_is_one_config_error(bad: str, shown: str) -> None:
    done = run([sys.executable, "-c", PROGRAM, bad], env=clean_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    outside, worker = done.stdout.splitlines()
    assert outside.startswith("outside: worker_init_fn: not in a DataLoader worker")
    assert worker == f"worker: launcher.errors.ConfigError: worker_init_fn: {shown}is not one of the DataLoader's 2 " \
                     "worker(s) (0-1)"
