"""How ``affrun show`` scales with the machine: 1,024 to 65,536 CPUs, against ``affrun topology`` on the same input.

Each machine is a topology snapshot (``--topology FILE``) of one package and one NUMA node holding N single-PU
cores and one GPU: the shape whose picture is the largest for its size. Measured, each in a fresh interpreter
and interleaved in the same run, as medians of ``--repeats`` runs: ``affrun topology --topology F`` (the
baseline: it reads the same input and prints it), ``affrun show --topology F`` (the terminal picture, 100
columns) and ``affrun show --topology F --svg OUT`` (the picture, then the SVG, 120 columns). Printed as seconds
with the ratio to the baseline of the same size: a picture whose cost grows as the input does keeps that ratio
flat as N grows (it used to grow with N: 12 s for ``show`` at 16,384 CPUs against about 1 s for ``topology``).
Never a pass/fail test. ``--profile N`` prints cProfile's top entries for one in-process SVG of N CPUs.

Usage: python benchmarks/show_scale.py [--repeats N] [--sizes 1024,4096,16384,65536] [--profile 16384]
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import os
import pstats
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import affrun_argv, byte_compile_affrun, clean_env, median_walls  # noqa: E402

from launcher.plan.planner import Request, make_plan  # noqa: E402
from launcher.show.svg import svg  # noqa: E402
from launcher.topology import load_topology  # noqa: E402
from launcher.topology.model import Core, Package, Topology  # noqa: E402
from launcher.topology.snapshot import to_snapshot  # noqa: E402
from tests.fakesys import FakeGPU, uniform, write_tree  # noqa: E402


def machine(small: Topology, cpus: int) -> Topology:
    """``small`` (one package, one node, one GPU) grown to ``cpus`` single-PU cores."""
    every = frozenset(range(cpus))
    return dataclasses.replace(
        small,
        packages=(Package(small.packages[0].os_index, every),),
        numa_nodes=(dataclasses.replace(small.numa_nodes[0], cpus=every),),
        l3_groups=(),
        cores=tuple(Core(i, (i,), 0, 0, None) for i in range(cpus)),
        online=every,
        allowed=every,
        gpus=tuple(dataclasses.replace(g, cpus=every) for g in small.gpus),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="1024,4096,16384,65536")
    parser.add_argument("--profile", type=int, metavar="CPUS", help="cProfile one in-process SVG of this machine")
    args = parser.parse_args(argv)
    byte_compile_affrun()
    env = clean_env(COLUMNS="100")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    rows = []
    with tempfile.TemporaryDirectory(prefix="affrun-show-scale-") as tmp:
        small_tree = uniform(1, 4)
        small_tree.gpus = [FakeGPU(pci="0000:10:00.0", numa_node=0)]
        small = load_topology(fsroot=str(write_tree(Path(tmp) / "small", small_tree)), environ={})
        for cpus in (int(s) for s in args.sizes.split(",")):
            topo = machine(small, cpus)
            path = Path(tmp) / f"{cpus}_cpus.json"
            path.write_text(json.dumps(to_snapshot(topo)))
            assert len(load_topology(topology_file=str(path), environ={}).cores) == cpus
            affrun = [*affrun_argv()]
            seconds = median_walls(
                {
                    "topology": [*affrun, "topology", "--topology", str(path)],
                    "show": [*affrun, "show", "--topology", str(path)],
                    "show --svg": [*affrun, "show", "--topology", str(path), "--svg", str(Path(tmp) / "out.svg")],
                },
                args.repeats,
                env,
            )
            rows.append((cpus, seconds))
            if args.profile == cpus:
                plan = make_plan(topo, Request(1))
                profiler = cProfile.Profile()
                profiler.runcall(svg, topo, plan)
                pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)

    print(f"median of {args.repeats} runs; seconds (ratio to `affrun topology` of the same size and run)")
    print(f"{'CPUs':>6} {'topology':>9} {'show':>14} {'show --svg':>14}")
    for cpus, s in rows:
        base = s["topology"]
        cells = [f"{s[k]:.2f} ({s[k] / base:.1f}x)" for k in ("show", "show --svg")]
        print(f"{cpus:>6} {base:>9.2f} {cells[0]:>14} {cells[1]:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
