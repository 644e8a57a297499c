"""What the data-wait meter (``--feed-report``) costs a loop of tiny batches, as a ratio from one run.

In ranks started as ``affrun exec --feed-report -- python bench_feed_rank.py``, short segments of the loop alternate
between torch's own ``__next__`` and the meter's: each pair of adjacent segments gives one ratio, metered /
unmetered batches/s, and the median of all pairs is the figure (goal >= 0.97: at most 3% fewer batches/s). Adjacent
segments of one process see the same machine, so the ratio holds on a busy machine where whole runs would not.
The loop never waits, so its batches per second of the thread's CPU time are its batches/s on an idle machine: that
ratio is the goal's figure (on a machine shared with other work, wall-time rates swing with what the others run;
their ratio is printed too).
For information, ranks started without ``--feed-report`` (every segment torch's own) give the unmetered rate
through the entry point, interleaved with the metered ranks.

The loop is a DataLoader over a list of ints with ``batch_size=1`` and no workers: about 50,000 batches per second,
the issue's "loop of tiny batches". The meter's cost per batch is printed too: a loop of B batches/s loses about
B x that cost. Usage: python benchmarks/feed_meter_cost.py [--repeats N]
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


def rank(feed: bool, pairs: int, seconds: float) -> dict[str, Any]:
    argv = [*AFFRUN, "exec", *(["--feed-report"] if feed else []), "--", PY, RANK, str(pairs), str(seconds)]
    proc = subprocess.run(argv, env=clean_env(), check=True, capture_output=True, text=True)
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if feed and not out["metered"]:
        raise SystemExit("the rank under --feed-report was not metered: is affrun's startup hook installed?")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="ranks of each kind, interleaved")
    parser.add_argument("--pairs", type=int, default=100, help="pairs of segments per rank")
    parser.add_argument("--seconds", type=float, default=0.04, help="per segment")
    args = parser.parse_args()
    pairs: list[float] = []
    walls: list[float] = []
    plain: list[list[float]] = []
    metered: list[list[float]] = []
    alone: list[list[float]] = []
    for _ in range(args.repeats):
        m = rank(True, args.pairs, args.seconds)
        pairs += [(b[0] / b[2]) / (a[0] / a[2]) for a, b in zip(m["plain"], m["metered"], strict=True)]
        walls += [(b[0] / b[1]) / (a[0] / a[1]) for a, b in zip(m["plain"], m["metered"], strict=True)]
        plain += m["plain"]
        metered += m["metered"]
        alone += rank(False, args.pairs, args.seconds)["plain"]

    def per_cpu_second(segments: list[list[float]]) -> float:  # all batches over all CPU seconds
        return sum(s[0] for s in segments) / sum(s[2] for s in segments)

    ratio = per_cpu_second(metered) / per_cpu_second(plain)
    q = statistics.quantiles(pairs, n=4)
    cost = 1e9 * (1 / per_cpu_second(metered) - 1 / per_cpu_second(plain))
    wall_alone = sum(s[0] for s in alone) / sum(s[1] for s in alone)
    print(f"tiny batches, {len(pairs)} pairs of {args.seconds:g} s segments in {args.repeats} ranks: "
          f"{per_cpu_second(plain):,.0f} batches per CPU second unmetered, {per_cpu_second(metered):,.0f} metered "
          f"(the meter: {cost:.0f} ns per batch); ranks without --feed-report: {wall_alone:,.0f} batches/s")
    verdict = "ok" if ratio >= 0.97 else "MISSED"
    print(f"metered / unmetered batches/s (per CPU second): {ratio:.3f}; pairs: median {statistics.median(pairs):.3f}, "
          f"quartiles {q[0]:.3f}-{q[2]:.3f}; goal >= 0.97: {verdict}")
    print(f"metered / unmetered batches/s (per wall second, pairs' median, information): {statistics.median(walls):.3f}")

if __name__ == "__main__":
    main()
