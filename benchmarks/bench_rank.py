"""One rank of the binding-quality benchmark: an OpenMP-threaded torch matmul loop for a fixed time.

Prints one JSON line: local rank, iterations per second, threads, and the CPUs the rank could use.
"""

import json
import os
import sys
import time

import torch

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
a = torch.randn(256, 256)
b = torch.randn(256, 256)
for _ in range(20):  # warm-up
    torch.mm(a, b)
n = 0
t0 = time.perf_counter()
while time.perf_counter() - t0 < seconds:
    torch.mm(a, b)
    n += 1
elapsed = time.perf_counter() - t0
# One write per line: ranks share the pipe, and print() under python -u writes the text and "\n" separately.
sys.stdout.write(json.dumps({"rank": int(os.environ.get("LOCAL_RANK", "0")), "it_per_s": n / elapsed,
                  "threads": torch.get_num_threads(), "cpus": sorted(os.sched_getaffinity(0))}) + "\n")
sys.stdout.flush()
