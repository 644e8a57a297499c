"""One rank of the feed meter's cost benchmark: a loop of tiny batches (a DataLoader over a list of ints,
``batch_size=1``, no workers: about 50,000 batches per CPU second here), timed by itself in short alternating
segments.

argv: pairs of segments, seconds per segment. Under ``--feed-report`` the segments alternate between torch's own
``__next__`` and the meter's (the patched method keeps torch's as ``__wrapped__``), so that both are timed in the
same process, interleaved (the first of each pair switching sides: a drift hits both alike). Without it every
segment runs torch's own. Prints one JSON line: whether it was metered, and for each kind of segment a list of
``[batches, wall seconds, CPU seconds of the thread]``, one per segment.
"""

import json
import sys
import time

from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

if __name__ == "__main__":
    pairs, seconds = int(sys.argv[1]), float(sys.argv[2])
    metered = _BaseDataLoaderIter.__dict__["__next__"]
    plain = getattr(metered, "__wrapped__", metered)
    it = iter(DataLoader(list(range(1 << 24)), batch_size=1))
    segments: dict[str, list[list[float]]] = {"plain": [], "metered": []}
    for k in range(2 * pairs + 1):  # segment 0 warms up
        pair, second = divmod(k - 1, 2)
        kind = "metered" if k and (second == pair % 2) and metered is not plain else "plain"
        _BaseDataLoaderIter.__next__ = metered if kind == "metered" else plain
        n = 0
        c0 = time.thread_time()
        t0 = time.perf_counter()
        end = t0 + seconds
        while True:
            for _ in range(256):
                next(it)
            n += 256
            now = time.perf_counter()
            if now >= end:
                break
        if k:
            segments[kind].append([n, now - t0, time.thread_time() - c0])
    _BaseDataLoaderIter.__next__ = metered
    sys.stdout.write(json.dumps({"metered": metered is not plain, **segments}) + "\n")
