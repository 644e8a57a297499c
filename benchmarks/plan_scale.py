"""How topology reading, planning and env generation scale with the machine: 16, 64, 256 and 1,024 PUs.

Each machine is a fake sysfs tree (2 sockets, SMT2, several NUMA nodes, 8 GPUs from 256 PUs up) written with
``tests/fakesys.py`` into a temporary directory. Measured, as medians of ``--repeats`` runs:

* in-process, per step: topology read (``load_topology(fsroot=T)``), planning (``make_plan``, 8 ranks, with the
  cores of GPU-less nodes spilled to them), planning one rank per core in ``--gpu-order closest`` (GPUs shared by
  the ranks of their domain: the most per-rank work the planner does), environment generation
  (``rank_environment`` for the 8 ranks);
* end to end, each in a fresh interpreter, interleaved with ``python -c pass`` measured in the same run:
  ``affrun plan --fsroot T --json`` (the CLI, click included) and ``python -c`` running read + plan + env
  through the library (the cost ``affrun exec`` pays before a rank starts).

Goal: ``affrun plan`` at most 100 ms beyond ``python -c pass`` at 1,024 PUs (each repeat's CLI time less the
same repeat's ``pass``; min, median and max printed), and the sysfs read in the low tens of ms. Printed as tables
with ratios to ``python -c pass``; never a pass/fail test. ``--profile N`` prints cProfile's top entries for the
read of the N-PU tree.

Usage: python benchmarks/plan_scale.py [--repeats N] [--sizes 16,64,256,1024] [--profile 1024]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import affrun_argv, byte_compile_affrun, wall  # noqa: E402

from launcher.env.policy import rank_environment  # noqa: E402
from launcher.options.record import Options  # noqa: E402
from launcher.plan.planner import make_plan  # noqa: E402
from launcher.topology import load_topology  # noqa: E402
from tests.fakesys import FakeGPU, FakeMachine, uniform, write_tree  # noqa: E402

# PUs -> (packages, cores per package, NUMA nodes per package, L3 per node, GPUs)
SHAPES: dict[int, tuple[int, int, int, int, int]] = {
    16: (2, 4, 1, 1, 0),
    64: (2, 16, 2, 1, 0),
    256: (2, 64, 4, 2, 8),
    1024: (2, 256, 4, 4, 8),
}
NPROC = 8
GOAL_BEYOND_MS = 100.0  # affrun plan --json at 1,024 PUs, beyond `python -c pass` (issue 42)
LIBRARY_PATH = (
    "from launcher.topology import load_topology; from launcher.plan.planner import make_plan; "
    "from launcher.options.record import Options; from launcher.env.policy import rank_environment; "
    "t = load_topology(fsroot={root!r}, environ={{}}); p = make_plan(t, Options().request({n})); "
    "[rank_environment(r, local_world_size={n}, user_env={{}}) for r in p.ranks]"
)


def machine(pus: int) -> FakeMachine:
    packages, cores, nodes, l3, gpus = SHAPES[pus]
    m = uniform(packages, cores, threads=2, nodes_per_package=nodes, l3_per_node=l3)
    all_nodes = packages * nodes
    m.gpus = [FakeGPU(pci=f"0000:{0x10 + 0x10 * i:02x}:00.0", numa_node=i * all_nodes // gpus) for i in range(gpus)]
    return m


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def interleaved_ms(commands: dict[str, list[str]], repeats: int, env: dict[str, str]) -> dict[str, list[float]]:
    """Each command's wall times in ms, one of each per repeat, in turn (so drift and load hit all alike)."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, argv in commands.items():
            times[name].append(wall(argv, env) * 1000)
    return times


def spread(values: list[float]) -> str:
    """``min / median / max``."""
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--sizes", default="16,64,256,1024")
    parser.add_argument("--profile", type=int, metavar="PUS", help="cProfile the topology read of this tree")
    args = parser.parse_args(argv)
    byte_compile_affrun()
    sizes = [int(s) for s in args.sizes.split(",")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AFFRUN_", "OMP_", "KMP_")) and not k.endswith("_VISIBLE_DEVICES")}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    rows = []
    with tempfile.TemporaryDirectory(prefix="affrun-plan-scale-") as tmp:
        for pus in sizes:
            root = str(write_tree(Path(tmp) / f"m{pus}", machine(pus)))
            topo = load_topology(fsroot=root, environ={})
            assert len(topo.allowed) == pus, (pus, len(topo.allowed))
            request = Options().request(NPROC)
            plan = make_plan(topo, request)
            read = median_ms(lambda root=root: load_topology(fsroot=root, environ={}), args.repeats)
            planning = median_ms(lambda topo=topo, request=request: make_plan(topo, request), args.repeats)
            per_core = Options(gpu_order="closest").request(len(topo.allowed_cores()))
            planning_all = median_ms(lambda topo=topo, request=per_core: make_plan(topo, request), args.repeats)
            envs = median_ms(
                lambda plan=plan: [rank_environment(r, local_world_size=NPROC, user_env={}) for r in plan.ranks],
                args.repeats,
            )
            walls = interleaved_ms(
                {
                    "pass": [sys.executable, "-c", "pass"],
                    "cli": [*affrun_argv(), "plan", "--fsroot", root, "--nproc-per-node", str(NPROC), "--json"],
                    "library": [sys.executable, "-c", LIBRARY_PATH.format(root=root, n=NPROC)],
                },
                args.repeats,
                env,
            )
            rows.append((pus, len(topo.gpus), read, planning, planning_all, envs, walls))
            if args.profile == pus:
                profiler = cProfile.Profile()
                profiler.runcall(load_topology, fsroot=root, environ={})
                pstats.Stats(profiler).sort_stats("tottime").print_stats(12)

    print(f"median of {args.repeats} runs, {NPROC} ranks; ms (ratio to `python -c pass` of the same run)")
    print(f"{'PUs':>5} {'GPUs':>4} {'read':>7} {'plan':>7} {'plan/core':>9} {'env':>7} {'pass':>7} {'lib e2e':>15} "
          f"{'affrun plan e2e':>17}")
    for pus, gpus, read, planning, planning_all, envs, walls in rows:
        base = statistics.median(walls["pass"])
        lib, cli = statistics.median(walls["library"]), statistics.median(walls["cli"])
        print(f"{pus:>5} {gpus:>4} {read:>7.2f} {planning:>7.2f} {planning_all:>9.2f} {envs:>7.2f} {base:>7.1f} "
              f"{f'{lib:.1f} ({lib / base:.1f}x)':>15} {f'{cli:.1f} ({cli / base:.1f}x)':>17}")
    print(f"\nbeyond `python -c pass` (each repeat less its own pass), ms, min / median / max of {args.repeats}; "
          f"goal for affrun plan at 1,024 PUs: {GOAL_BEYOND_MS:.0f}")
    print(f"{'PUs':>5} {'pass':>22} {'lib beyond pass':>22} {'affrun plan beyond pass':>24}  goal")
    for pus, _, _, _, _, _, walls in rows:
        lib_beyond = [t - p for t, p in zip(walls["library"], walls["pass"])]
        cli_beyond = [t - p for t, p in zip(walls["cli"], walls["pass"])]
        verdict = ""
        if pus == 1024:
            verdict = "met" if statistics.median(cli_beyond) <= GOAL_BEYOND_MS else "MISSED"
        print(f"{pus:>5} {spread(walls['pass']):>22} {spread(lib_beyond):>22} {spread(cli_beyond):>24}  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
