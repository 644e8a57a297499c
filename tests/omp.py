"""Real OpenMP ranks under affrun's environment: a probe program, the runtimes' affinity lines, hostile user values."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from launcher.env.policy import (
    rank_environment,
)
from launcher.plan.planner import RankPlan, Request, make_plan
from launcher.topology import load_topology

# ---------------------------------------------------------------------------------------------- real runtimes
OMP_SOURCE = r"""
#include <omp.h>
#include <stdio.h>
int main(void) {
    double total = 0.0;
    int team = 0;
#pragma omp parallel reduction(+ : total)
    {
        for (long i = 0; i < 200000; i++) total += (double)i * 1e-9;
#pragma omp single
        team = omp_get_num_threads();
        /* libgomp's OMP_DISPLAY_AFFINITY report skips a team of one: ask each thread for the same report. */
#pragma omp critical
        {
            omp_display_affinity(NULL);
            fflush(stdout);
        }
    }
    printf("team=%d total=%.1f\n", team, total);
    return 0;
}
"""


GOMP_LINE = re.compile(r"^level 1 thread (0x[0-9a-f]+) affinity (\S+)$", re.M)


IOMP_LINE = re.compile(r"^OMP: pid \d+ tid \d+ thread (\d+) bound to OS proc set \{([^}]*)\}$", re.M)


HOSTILE = {"KMP_AFFINITY": "disabled", "OMP_PLACES": "cores", "OMP_NUM_THREADS": "16", "GOMP_CPU_AFFINITY": "0-1023"}


def live_rank(cpus: str) -> RankPlan:
    """The plan of one rank on this machine, restricted to ``cpus`` (the real reader and planner)."""
    topo = load_topology(cpus=cpus)
    return make_plan(topo, Request(nproc=1)).ranks[0]


def run_rank(binary: Path, rank: RankPlan, user_env: dict[str, str], bind: str) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_"))}
    base.update(user_env)
    e = rank_environment(rank, local_world_size=1, user_env=base, bind=bind)
    env = e.apply_to(base)
    env["OMP_DISPLAY_AFFINITY"] = "true"
    mask = set(rank.cpus)
    proc = subprocess.run(
        [str(binary)],
        env=env,
        preexec_fn=lambda: os.sched_setaffinity(0, mask),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


PLACES_SAMPLES = ["{0-1}", "0-1", "{0:2}", "{0,1}", "{0},{1}", "0,1", "0:2", " {0} , {1} ", "{0 ,1}", "{1}:2:-1",
                  "{0}:2:-1", "{!0,1}", "{0:2,!1}", "!{0},{1}", "{0},{1},!{1}", "{0},,{1}", "{}", "{0,}", "{1 0}",
                  "{0}:0", "{0:0}", "{0}!{1}", "{0}:2:1:1"]

