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

Goal: end to end under 100 ms at 1,024 PUs, and the sysfs read in the low tens of ms. Printed as a table with
ratios to ``python -c pass``; never a pass/fail test. ``--profile N`` prints cProfile's top entries for the
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

from _common import affrun_argv, byte_compile_affrun, median_walls  # noqa: E402

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
            seconds = median_walls(
                {
                    "pass": [sys.executable, "-c", "pass"],
                    "cli": [*affrun_argv(), "plan", "--fsroot", root, "--nproc-per-node", str(NPROC), "--json"],
                    "library": [sys.executable, "-c", LIBRARY_PATH.format(root=root, n=NPROC)],
                },
                args.repeats,
                env,
            )
            walls = {name: s * 1000 for name, s in seconds.items()}
            rows.append((pus, len(topo.gpus), read, planning, planning_all, envs, walls))
            if args.profile == pus:
                profiler = cProfile.Profile()
                profiler.runcall(load_topology, fsroot=root, environ={})
                pstats.Stats(profiler).sort_stats("tottime").print_stats(12)

    print(f"median of {args.repeats} runs, {NPROC} ranks; ms (ratio to `python -c pass` of the same run)")
    print(f"{'PUs':>5} {'GPUs':>4} {'read':>7} {'plan':>7} {'plan/core':>9} {'env':>7} {'pass':>7} {'lib e2e':>15} "
          f"{'affrun plan e2e':>17}")
    for pus, gpus, read, planning, planning_all, envs, walls in rows:
        base = walls["pass"]
        lib = f"{walls['library']:.1f} ({walls['library'] / base:.1f}x)"
        cli = f"{walls['cli']:.1f} ({walls['cli'] / base:.1f}x)"
        print(f"{pus:>5} {gpus:>4} {read:>7.2f} {planning:>7.2f} {planning_all:>9.2f} {envs:>7.2f} {base:>7.1f} {lib:>15} "
              f"{cli:>17}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
