"""What affrun adds to a launch, as ratios against baselines measured in the same run.

1. ``affrun torchrun --nproc-per-node 2 noop.py`` vs ``torchrun --nproc-per-node 2 noop.py``  (goal <= 1.05x),
   and, for information, vs the same torchrun with its agent's garbage collector treated as affrun's is
2. ``affrun exec -- true`` vs ``python -c pass``, both from a venv where affrun is installed as the README says
   (a regular ``pip install .``, not the development venv's editable install)                   (information):
   a rank under srun/mpirun/submitit, which reads the topology and plans by itself. Its old goal (<= 2x) was
   given up with issue 19: the planner's records are the standard library's dataclasses again, whose code
   generation costs this rank about 45 ms for its 22 classes (cProfile), against the rank's own ``import torch``
   of about a second
3. the same with ``AFFRUN_PLAN`` set, as under ``affrun torchrun``/``affrun run``: the rank reads its parent's
   record of it (launcher.bind.wire) and plans nothing, vs the least any such rank must do, a ``python -c`` that
   imports re, json and os, parses the plan, sets its mask and execs ``true``                   (information: its
   goal of <= 1.3x went with issue 42, where every command's parser became click's, about 20 ms a rank)

Usage: python benchmarks/launch_overhead.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from _common import AFFRUN, PY, byte_compile_affrun, clean_env, install_affrun, median_walls

# Plain torchrun with the collector treatment affrun's agent gets (launcher.launch.torchrun.main): the baseline that
# shows what affrun's own work (plan, AFFRUN_PLAN, the exec hop per rank) costs, apart from that gain.
TORCHRUN_FROZEN = ("import gc, sys; gc.disable(); import torch.distributed.run as r; gc.freeze(); gc.enable(); "
                   "sys.argv[0] = 'torchrun'; r.main()")
NOOP = "import torch.distributed as dist\ndist.init_process_group('gloo')\ndist.barrier()\ndist.destroy_process_group()\n"


# The physical floor of a rank under a parent plan: read the plan, set the mask, exec.
MINIMAL_RANK = ("import re, json, os, sys; plan = json.loads(os.environ['AFFRUN_PLAN']); "
                "os.sched_setaffinity(0, plan['plan']['ranks'][int(os.environ['LOCAL_RANK'])]['cpus']); "
                "os.execv(sys.argv[1], [sys.argv[1]])")


def parent_plan(nproc: int) -> str:
    """The ``AFFRUN_PLAN`` that ``affrun torchrun --nproc-per-node NPROC`` gives its workers on this machine."""
    from launcher.bind.handoff import plan_job
    from launcher.options.record import Options

    return plan_job(Options(), nproc)[1].to_env()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--exec-only", action="store_true", help="only rows 2 and 3 (no torchrun runs)")
    args = parser.parse_args()
    byte_compile_affrun()
    nproc = str(min(2, len(os.sched_getaffinity(0))))
    true = shutil.which("true") or "/bin/true"
    with tempfile.TemporaryDirectory() as tmp:
        python, affrun = install_affrun(tmp)
        exec_times = median_walls(
            {"python -c pass": [python, "-c", "pass"], "affrun exec -- true": [affrun, "exec", "--", true],
             "parent plan": [affrun, "exec", "--", true], "minimal rank": [python, "-c", MINIMAL_RANK, true]},
            args.repeats * 3,
            envs={name: clean_env(AFFRUN_PLAN=parent_plan(int(nproc)), LOCAL_RANK="0", LOCAL_WORLD_SIZE=nproc)
                  for name in ("parent plan", "minimal rank")},
        )
    rows = [
        ("affrun exec -- true", exec_times["affrun exec -- true"], "python -c pass", exec_times["python -c pass"], None),
        ("affrun exec -- true, AFFRUN_PLAN set", exec_times["parent plan"], "python -c: json, mask, exec",
         exec_times["minimal rank"], None),
    ]
    if not args.exec_only:
        rows += torchrun_rows(nproc, args.repeats)
    print(f"{'command':<48} {'median':>9} {'baseline':<40} {'median':>9} {'ratio':>6} {'goal':>6}")
    for name, t, base, tb, goal in rows:
        ratio = t / tb
        verdict = "(info)" if goal is None else f"{'<=' + str(goal):>6} {'ok' if ratio <= goal else 'MISSED'}"
        print(f"{name:<48} {t * 1000:7.1f}ms {base:<40} {tb * 1000:7.1f}ms {ratio:6.2f} {verdict}")


def torchrun_rows(nproc: str, repeats: int) -> list[tuple[str, float, str, float, float | None]]:
    with tempfile.TemporaryDirectory() as tmp:
        noop = os.path.join(tmp, "noop.py")
        with open(noop, "w") as fh:
            fh.write(NOOP)
        run_times = median_walls(
            {
                "torchrun": [PY, "-m", "torch.distributed.run", "--nproc-per-node", nproc, noop],
                "affrun torchrun": [*AFFRUN, "torchrun", "--nproc-per-node", nproc, noop],
                "torchrun, gc frozen": [PY, "-c", TORCHRUN_FROZEN, "--nproc-per-node", nproc, noop],
            },
            repeats,
        )
    return [
        (f"affrun torchrun --nproc-per-node {nproc} noop.py", run_times["affrun torchrun"],
         f"torchrun --nproc-per-node {nproc} noop.py", run_times["torchrun"], 1.05),
        (f"affrun torchrun --nproc-per-node {nproc} noop.py", run_times["affrun torchrun"],
         "the same torchrun, agent's gc frozen", run_times["torchrun, gc frozen"], None),
    ]

if __name__ == "__main__":
    main()
