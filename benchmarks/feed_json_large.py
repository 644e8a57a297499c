"""What a large ``--feed-json`` costs a metered loop (issue 40, item 2), as a ratio, and the bound of the work a
periodic write does in the loop's thread.

A rank of a 2-rank job (``RANK=0 WORLD_SIZE=2``: the front end keeps the file at the start) runs
``tests/programs/feed_loop.py`` for ``--seconds`` under ``affrun exec --feed-json F``, F pre-filled with ``--ranks``
valid figure objects (80,000: about 14 MiB, under the 16 MiB the front end takes) or empty, interleaved. The
figure is the loop's own batches/s (its own count and clock, not the meter's), median of the repeats, big over
empty: the goal is about 1 (before the fix: 0.002-0.3 here). Then the largest periodic merge the meter still does
in the loop's thread, a file of just under ``PERIODIC_JSON_LIMIT`` bytes, is timed in this process.
Usage: python benchmarks/feed_json_large.py [--repeats N] [--seconds S] [--ranks N] [--step-sleep S]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from typing import Any

from _common import AFFRUN, PY, ROOT, clean_env

LOOP = os.path.join(ROOT, "tests", "programs", "feed_loop.py")


def figure(rank: int) -> dict[str, Any]:
    return {"rank": rank, "batches": 1200, "seconds": 61.3, "batches_per_s": 19.6, "data_wait_fraction": 0.42,
            "loaders": 1, "num_workers": [2], "workers_source": "script", "final": True, "pid": 100000 + rank,
            "host": "node-0001"}


def rate(path: str, content: bytes, seconds: float, step_sleep: float) -> float:
    with open(path, "wb") as fh:
        fh.write(content)
    argv = [*AFFRUN, "exec", "--feed-json", path, "--", PY, LOOP, "--seconds", str(seconds), "--items", "10000000",
            "--item-sleep", "0", "--step-sleep", str(step_sleep)]
    proc = subprocess.run(argv, env=clean_env(RANK="0", WORLD_SIZE="2"), check=True, capture_output=True, text=True)
    own = json.loads(proc.stdout.strip().splitlines()[-1])
    return float(own["batches"] / own["seconds"])


def periodic_merge_ms(where: str, repeats: int = 20) -> tuple[int, float]:
    """The slowest merge a periodic write still does: a file just under the limit, rank 0 put in (median, ms)."""
    from launcher.feed.files import merge_json
    from launcher.feed.meter import PERIODIC_JSON_LIMIT

    ranks, r = [], 1
    while len(json.dumps([*ranks, figure(r), figure(0)], separators=(",", ":"))) < PERIODIC_JSON_LIMIT:
        ranks.append(figure(r))
        r += 1
    path = os.path.join(where, "limit.json")
    with open(path, "w") as fh:
        json.dump(ranks, fh, separators=(",", ":"))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        assert merge_json(path, figure(0), 0.05, PERIODIC_JSON_LIMIT) == "written"
        times.append(time.perf_counter() - t0)
    return len(ranks), 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind, interleaved")
    parser.add_argument("--seconds", type=float, default=5.0, help="the loop's time in each run")
    parser.add_argument("--ranks", type=int, default=80_000, help="figure objects in the big file")
    parser.add_argument("--step-sleep", type=float, default=0.002, help="each step's sleep (0: a tight loop)")
    args = parser.parse_args()
    big = json.dumps([figure(r) for r in range(1, args.ranks + 1)], separators=(",", ":")).encode()
    rates: dict[str, list[float]] = {"empty": [], "big": []}
    with tempfile.TemporaryDirectory(prefix="affrun-feed-json-") as where:
        for _ in range(args.repeats):
            for kind in rates:
                rates[kind].append(rate(os.path.join(where, f"{kind}.json"), big if kind == "big" else b"",
                                        args.seconds, args.step_sleep))
        ranks, ms = periodic_merge_ms(where)
    empty, full = statistics.median(rates["empty"]), statistics.median(rates["big"])
    print(f"loop of {args.seconds:g} s, step sleep {args.step_sleep:g} s, {args.repeats} runs of each kind "
          f"(loop's own batches/s, median (min-max))")
    for kind, values in rates.items():
        label = "empty file" if kind == "empty" else f"{args.ranks:,} ranks' figures, {len(big) / (1 << 20):.1f} MiB"
        print(f"  {label:<40} {statistics.median(values):>9.1f} ({min(values):.1f}-{max(values):.1f})")
    print(f"big / empty: {full / empty:.3f}")
    print(f"largest periodic merge in the loop's thread: {ranks:,} ranks' figures (just under the limit), "
          f"{ms:.1f} ms once a second (median of 20)")


if __name__ == "__main__":
    main()
