"""Run as a training script: report what this rank really got, as one JSON line on stdout.

Reports the kernel's view (Cpus_allowed_list), torch's thread count, the environment affrun sets, argv, and
the libgomp binding of the main thread as printed by the runtime itself (omp_display_affinity).
"""

import ctypes
import json
import os
import sys

import torch

# Enter a parallel region so that OMP_DISPLAY_AFFINITY prints every team thread's binding (stderr).
torch.ones(4_000_000).add_(1).sum()

gomp = [line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line and line.split()[-1].endswith(".so.1")]
if gomp:
    lib = ctypes.CDLL(gomp[0])
    buf = ctypes.create_string_buffer(256)
    lib.omp_capture_affinity(buf, 256, b"%A")  # this (main) thread's place, as the runtime sees it
    main_affinity = buf.value.decode()
else:
    main_affinity = None

with open("/proc/self/status") as status:
    allowed = next(line.split(":", 1)[1].strip() for line in status if line.startswith("Cpus_allowed_list"))
env = {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "KMP_", "MKL_", "OPENBLAS_", "AFFRUN_"))}
# One write per line: ranks share the pipe, and print() under python -u writes the text and "\n" separately.
sys.stdout.write(json.dumps({
    "local_rank": int(os.environ.get("LOCAL_RANK", "-1")),
    "pid": os.getpid(),
    "mask": sorted(os.sched_getaffinity(0)),
    "cpus_allowed_list": allowed,
    "torch_threads": torch.get_num_threads(),
    "gomp_main_affinity": main_affinity,
    "env": env,
    "argv": sys.argv[1:],
}) + "\n")
sys.stdout.flush()
code = int(os.environ.get("PROBE_EXIT_RANK_CODE", "0") or 0)
if code and os.environ.get("LOCAL_RANK") == os.environ.get("PROBE_EXIT_RANK", "1"):
    sys.exit(code)
