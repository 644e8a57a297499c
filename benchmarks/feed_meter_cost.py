"""What the data-wait meter (``--feed-report``) costs a loop of tiny batches, as a ratio from one run.

In ranks started as ``affrun exec --feed-report -- python bench_feed_rank.py``, segments of the loop (1,000
batches each) alternate between torch's own ``__next__`` and the meter's, timed by the thread's CPU time: both
kinds run in the same process, interleaved, and what other processes take is left out. On a shared machine a
segment is also slowed by whatever ran beside it (caches, memory bandwidth), so the figure compares the least
disturbed segments of each kind: the 10th percentile of their times (min and median are printed too). The goal:
metered / unmetered batches/s >= 0.97 (at most 3% fewer). For information, ranks started without
``--feed-report`` give the unmetered rate through the entry point, interleaved with the metered ranks.

The loop is a DataLoader over a list of ints with ``batch_size=1`` and no workers: the issue's "loop of tiny
batches" (about 50,000 batches/s). The meter's cost is a fixed time per batch, printed too: a loop of B batches/s
loses about B x that time per second. Usage: python benchmarks/feed_meter_cost.py [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
from typing import Any

from _common import AFFRUN, PY, ROOT, clean_env

RANK = os.path.join(ROOT, "benchmarks", "bench_feed_rank.py")


def rank(feed: bool, pairs: int, batches: int) -> dict[str, Any]:
    argv = [*AFFRUN, "exec", *(["--feed-report"] if feed else []), "--", PY, RANK, str(pairs), str(batches)]
    proc = subprocess.run(argv, env=clean_env(), check=True, capture_output=True, text=True)
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if feed and not out["metered"]:
        raise SystemExit("the rank under --feed-report was not metered: is affrun's startup hook installed?")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="ranks of each kind, interleaved")
    parser.add_argument("--pairs", type=int, default=200, help="pairs of segments per rank")
    parser.add_argument("--batches", type=int, default=1000, help="batches per segment")
    args = parser.parse_args()
    plain: list[float] = []
    metered: list[float] = []
    alone: list[float] = []
    for _ in range(args.repeats):
        m = rank(True, args.pairs, args.batches)
        plain += [s[0] for s in m["plain"]]
        metered += [s[0] for s in m["metered"]]
        alone += [s[1] for s in rank(False, args.pairs, args.batches)["plain"]]
    n = args.batches
    print(f"tiny batches (batch_size=1, no workers), {len(plain)} segments of {n} batches of each kind in "
          f"{args.repeats} ranks; ranks without --feed-report: {n / statistics.median(alone):,.0f} batches/s (wall)")
    print(f"{'segments':<22} {'unmetered':>16} {'metered':>16} {'ratio':>6} {'cost per batch':>15}")
    for name, pick in (("fastest", min), ("10th percentile", lambda v: statistics.quantiles(v, n=10)[0]),
                       ("median", statistics.median)):
        tp, tm = pick(plain), pick(metered)
        print(f"{name:<22} {n / tp:>10,.0f} bat/s {n / tm:>10,.0f} bat/s {tp / tm:6.3f} {1e9 * (tm - tp) / n:>12.0f} ns")
    tp, tm = statistics.quantiles(plain, n=10)[0], statistics.quantiles(metered, n=10)[0]
    ratio = tp / tm
    print(f"metered / unmetered batches/s (10th percentile): {ratio:.3f}; goal >= 0.97: "
          f"{'ok' if ratio >= 0.97 else 'MISSED'}; at 50,000 batches/s the meter takes "
          f"{100 * 50_000 * (tm - tp) / n:.1f}%")


if __name__ == "__main__":
    main()
