"""What finding priority cores adds to a topology read (docs/priority-cores.md, "Cost"): a fake sysfs tree of
2 packages x 64 cores x SMT2 = 256 PUs whose every PU has the clock files of a real host (``tests/fakesys.py``,
``with_clocks``: CPPC highest_perf, cpufreq behind policy links, ITMT on; 8 priority cores per package).

Measured in-process, as medians (and minimums) of ``--repeats`` runs:

* the whole read (``read_sysfs``, no GPUs, under the fsroot confinement every ``--fsroot`` read has), which finds
  the priority cores;
* the priority reader after the kinds reader (what ``read_sysfs`` runs: it reads CPPC ``highest_perf`` and the ITMT
  switch, the kinds reader having read the frequencies), under the fsroot and with paths opened as they are (what
  the live machine's ``/`` costs); and alone (every file read by itself).

Printed with the priority reader's share of the whole read; never a pass/fail test.

Usage: python benchmarks/priority_cost.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.topology.fsroot import within  # noqa: E402
from launcher.topology.kinds_sysfs import kinds_from_sysfs, priority_from_sysfs  # noqa: E402
from launcher.topology.sysfs import read_sysfs  # noqa: E402
from tests.fakesys import CoreClock, itmt_desktop, uniform, with_clocks, write_tree  # noqa: E402


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    fn()
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - start)
    return statistics.median(walls) * 1e3, min(walls) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    m = uniform(2, 64, threads=2)
    flags = itmt_desktop().files["proc/cpuinfo"].split("flags\t\t: ", 1)[1].split("\n", 1)[0]

    def clock(ci: int) -> CoreClock:
        return CoreClock(46, 4_600_000, 2_300_000) if ci % 32 < 4 else CoreClock(42, 4_200_000, 2_300_000)

    with_clocks(m, clock, ("Intel(R) Xeon(R) 6776P", 173, 1), flags, itmt=True, policy_links=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = str(write_tree(Path(tmp) / "t", m))
        topo = read_sysfs(root, gpus=False)
        cores = [c.pus for c in topo.cores]
        read: dict[str, dict[int, int]] = {}
        kinds = kinds_from_sysfs(root, topo.online, read=read)
        def confined(fn: Callable[[], object]) -> Callable[[], object]:
            def run() -> None:
                with within(root):
                    fn()
            return run

        rows: list[tuple[str, Callable[[], object]]] = [
            ("whole read (read_sysfs, under the fsroot)", lambda: read_sysfs(root, gpus=False)),
            ("priority after kinds, under the fsroot", confined(lambda: priority_from_sysfs(root, cores, kinds, read))),
            ("priority after kinds, paths as they are", lambda: priority_from_sysfs(root, cores, kinds, read)),
            ("priority alone, under the fsroot", confined(lambda: priority_from_sysfs(root, cores, kinds))),
        ]
        print(f"{len(topo.online)} PUs; found {topo.priority.source!r} on {len(topo.priority.cpus)} CPUs")
        whole = 0.0
        for name, fn in rows:
            median, least = timed(fn, args.repeats)
            whole = whole or median
            share = "" if median == whole else f"  {median / whole:4.0%} of the whole read"
            print(f"{name:44}{median:7.1f} ms (min {least:5.1f}){share}")

if __name__ == "__main__":
    main()
