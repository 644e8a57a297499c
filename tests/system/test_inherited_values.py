"""Inherited ``AFFRUN_*`` values that cannot be the binding affrun made (issue 40, class 3): a thread count above
the rank's CPUs, CPUs the process may not run on, lists no plan makes. Every consumer reads them through one strict
reader (``launcher.bind.readback.read_binding``) and refuses them: the startup hook applies nothing and says so on
one line while the script runs as torch alone would run it; ``affrun doctor --pid`` reports the same words as the
reason the rank has no plan; an inherited ``AFFRUN_PLAN`` whose CPUs this process may not use is an error. Values
are built from this machine's CPUs, never assumed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.base.cpulist import format_cpulist
from tests.launch import affrun_argv, clean_env, run
from tests.system.test_doctor_live import _refused, audit, running

pytestmark = pytest.mark.torch

HERE = sorted(os.sched_getaffinity(0))
ABSENT = max(HERE) + 1  # no CPU this test may use has this id
ALL = format_cpulist(HERE)

# What the script reports: torch's pools, and the threads that ran after a parallel operation.
SCRIPT = """
import json, os, torch
x = torch.ones(1 << 21)
for _ in range(4):
    x.sin_()
print(json.dumps({"interop": torch.get_num_interop_threads(), "threads": torch.get_num_threads(),
                  "tasks": len(os.listdir("/proc/self/task")),
                  "patched": hasattr(torch.set_num_interop_threads, "__wrapped__")}))
"""

# name: (variables beside AFFRUN_LOCAL_RANK=0, the variable the refusal names)
HOSTILE: dict[str, tuple[dict[str, str], str]] = {
    "threads-65536": ({"AFFRUN_CPUS": ALL, "AFFRUN_THREADS": "65536"}, "AFFRUN_THREADS=65536"),
    "cpus-0-65535": ({"AFFRUN_CPUS": f"{HERE[0]}-65535"}, "AFFRUN_CPUS="),
    "threads-above-compute": ({"AFFRUN_CPUS": ALL, "AFFRUN_COMPUTE_CPUS": str(HERE[0]), "AFFRUN_THREADS": "2"},
                              "AFFRUN_THREADS=2"),
    "main-off-compute": ({"AFFRUN_CPUS": ALL, "AFFRUN_COMPUTE_CPUS": str(HERE[0]), "AFFRUN_MAIN_CPUS": str(ABSENT)},
                         "AFFRUN_MAIN_CPUS="),
    "loader-absent": ({"AFFRUN_CPUS": ALL, "AFFRUN_LOADER_CPUS": str(ABSENT)}, "AFFRUN_LOADER_CPUS="),
    "rank-past-world": ({"AFFRUN_CPUS": ALL, "AFFRUN_LOCAL_RANK": "3", "AFFRUN_LOCAL_WORLD_SIZE": "2"},
                        "AFFRUN_LOCAL_RANK=3"),
}


def report(env: dict[str, str], *, pin: int | None = None) -> tuple[dict[str, Any], list[str]]:
    """The script's report and its stderr lines, under ``env`` (``pin``: started on that one CPU)."""
    argv = [sys.executable, "-c", SCRIPT]
    if pin is not None:  # the interpreter the hook runs in starts on CPU `pin`
        argv = [sys.executable, "-c", f"import os, sys; os.sched_setaffinity(0, {{{pin}}}); "
                f"os.execv(sys.executable, [sys.executable, '-c', {SCRIPT!r}])"]
    proc = run(argv, env=env, timeout=180)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr.splitlines()


def refused_once(lines: list[str], named: str) -> str:
    """The one line the hook says: the hooks are off, and why, naming the variable."""
    assert len(lines) == 1, lines
    (line,) = lines
    assert line.startswith(f"affrun: warning: the rank's thread hooks are off: {named}"), line
    return line.removeprefix("affrun: warning: the rank's thread hooks are off: ")


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_the_hook_refuses_what_cannot_be_the_binding(case: str) -> None:
    """One warning line; nothing applied or patched: torch's pools are what torch alone gives this process (the
    same script without any ``AFFRUN_*`` variable), never the inherited count."""
    variables, named = HOSTILE[case]
    plain, quiet = report(clean_env())
    assert not quiet, quiet
    seen, lines = report(clean_env(**{"AFFRUN_LOCAL_RANK": "0", **variables}))
    refused_once(lines, named)
    assert seen == plain, (seen, plain)


LOADER = """
import json, sys, torch
from torch.utils.data import DataLoader, TensorDataset
data = TensorDataset(torch.arange(8.0))
for context in ("fork", "spawn"):
    batches = sum(1 for _ in DataLoader(data, batch_size=2, num_workers=2, multiprocessing_context=context))
print(json.dumps({"interop": torch.get_num_interop_threads(), "batches": batches}))
"""


def test_a_rank_and_its_workers_say_it_once() -> None:
    """The rank that refuses its values says so; its forked and spawned DataLoader workers, which inherit the same
    values, do not say it again (one line for the job, not one per worker and epoch)."""
    variables, named = HOSTILE["threads-65536"]
    proc = run([sys.executable, "-c", LOADER], env=clean_env(AFFRUN_LOCAL_RANK="0", **variables), timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    refused_once([line for line in proc.stderr.splitlines() if line.startswith("affrun:")], named)
    assert json.loads(proc.stdout)["batches"] == 4 and json.loads(proc.stdout)["interop"] != 65536


def test_cpus_outside_the_mask_the_process_started_with_are_refused() -> None:
    """The rank's CPUs must be the process's own: a process started on one CPU that inherited a rank of two
    (a subprocess under ``taskset``) sizes no pool to two."""
    if len(HERE) < 2:
        pytest.skip("needs 2 CPUs: the rank's two, the process started on one")
    plain, _ = report(clean_env(), pin=HERE[0])
    seen, lines = report(clean_env(AFFRUN_LOCAL_RANK="0", AFFRUN_CPUS=ALL), pin=HERE[0])
    said = refused_once(lines, f"AFFRUN_CPUS={ALL} names CPUs this process may not run on")
    assert format_cpulist(HERE[1:]) in said and seen == plain, (said, seen, plain)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["threads-65536", "threads-above-compute", "main-off-compute"])
def test_the_doctor_reports_what_the_hook_refuses_in_the_same_words(case: str) -> None:
    """``affrun doctor --pid`` reads a live rank's variables with the same reader: no thread plan, and the reason
    is the hook's own."""
    variables, named = HOSTILE[case]
    env = clean_env(**{"AFFRUN_LOCAL_RANK": "0", "AFFRUN_PLAN_ID": "test", "LOCAL_RANK": "0",
                       "LOCAL_WORLD_SIZE": "1", **variables})
    _, lines = report(env)
    said = refused_once(lines, named)
    sleeper = "import os, time\nos.write(1, f'READY {os.getpid()}\\n'.encode())\ntime.sleep(600)\n"
    with running([sys.executable, "-c", sleeper], env) as (proc, _lines):
        _, data = audit(proc.pid, 0.2)
    (rank,) = [p for p in data["processes"] if p["pid"] == proc.pid]
    assert rank["thread_plan"] is None and rank["plan_problem"] == said, rank


def _plan_for_a_wider_machine(tmp_path: Path) -> tuple[str, str]:
    """``affrun run``'s plan (its dry run) of one rank on this machine's CPUs and two it does not have, and the
    role it gives: what a plan made elsewhere, and inherited here, looks like."""
    from tests.fakesys import this_machine_with_gpus, write_tree

    machine = this_machine_with_gpus(0)
    machine.cores += [(ABSENT,), (ABSENT + 1,)]
    machine.node_of_core += [0, 0]
    machine.package_of_core += [0, 0]
    machine.l3_of_core += [0, 0]
    root = write_tree(tmp_path / "wider", machine)
    proc = run(affrun_argv("run", "--fsroot", str(root), "--nproc-per-node", "1", "--dry-run", "--", "python"),
               env=clean_env(), check=True)
    found = dict(line.split("=", 1) for line in proc.stdout.splitlines() if line.startswith("AFFRUN_"))
    return found["AFFRUN_PLAN"], found["AFFRUN_RUN"]


def test_an_inherited_plan_for_cpus_this_process_may_not_use_is_refused(tmp_path: Path) -> None:
    """The plan channel: a rank's record in an inherited ``AFFRUN_PLAN`` is checked as its variables are. Its CPUs
    are not all here: ``affrun exec`` below a launcher, and the startup hook under ``affrun run``, end with one
    error line and exit 2 instead of running the command on a narrowed mask with the plan's thread counts."""
    plan, role = _plan_for_a_wider_machine(tmp_path)
    named = (f"the inherited plan (AFFRUN_PLAN) cannot be rank 0's binding here: AFFRUN_CPUS="
             f"{format_cpulist([*HERE, ABSENT, ABSENT + 1])} names CPUs this process may not run on")
    script = [sys.executable, "-c", "print('the command ran')"]
    under_launcher = run(affrun_argv("exec", "--", *script),
                         env=clean_env(AFFRUN_PLAN=plan, LOCAL_RANK="0", LOCAL_WORLD_SIZE="1"))
    under_run = run(script, env=clean_env(AFFRUN_PLAN=plan, AFFRUN_RUN=role))
    for proc in (under_launcher, under_run):
        _refused(proc, named)
        assert "the command ran" not in proc.stdout
