"""One rank of the feed meter's cost benchmark: a loop of tiny batches (a DataLoader over a list of ints,
``batch_size=1``, no workers: about 50,000-85,000 batches per CPU second here), timed by itself in segments.

argv: pairs of segments, batches per segment. Under ``--feed-report`` the segments alternate between torch's own
``__next__`` and the meter's (the patched method keeps torch's as ``__wrapped__``), so that both are timed in the
same process, interleaved (the first of each pair switching sides: a drift hits both alike). Without it every
segment runs torch's own. Prints one JSON line: whether it was metered, and for each kind of segment its CPU
seconds (the thread's CPU time: what other processes take is left out) and wall seconds, one per segment.
"""

import json
import sys
import time

from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

if __name__ == "__main__":
    pairs, batches = int(sys.argv[1]), int(sys.argv[2])
    metered = _BaseDataLoaderIter.__dict__["__next__"]
    plain = getattr(metered, "__wrapped__", metered)
    it = iter(DataLoader(list(range(1 << 24)), batch_size=1))
    segments: dict[str, list[list[float]]] = {"plain": [], "metered": []}
    for k in range(2 * pairs + 1):  # segment 0 warms up (and takes the meter's first flush)
        pair, second = divmod(k - 1, 2)
        kind = "metered" if (k == 0 or second == pair % 2) and metered is not plain else "plain"
        _BaseDataLoaderIter.__next__ = metered if kind == "metered" else plain
        c0 = time.thread_time()
        t0 = time.perf_counter()
        for _ in range(batches):
            next(it)
        wall = time.perf_counter() - t0
        if k:
            segments[kind].append([time.thread_time() - c0, wall])
    _BaseDataLoaderIter.__next__ = metered
    sys.stdout.write(json.dumps({"metered": metered is not plain, "batches": batches, **segments}) + "\n")
