"""The "training program" of the Slurm tests: writes what this process really got, as JSON, to $REPORT_DIR.

With REPORT_GLOO=1 it first joins torch.distributed (gloo, env://, as torchrun sets it up) and all-reduces
rank + 1, so the report proves the rendezvous worked. Arguments are recorded as hex bytes, unchanged.
"""

import json
import os
import socket
import sys


def cpuset() -> str:
    for line in open("/proc/self/cgroup"):
        _hid, controllers, path = line.rstrip("\n").split(":", 2)
        if "cpuset" in controllers.split(","):
            for name in ("cpuset.cpus", "cpuset.effective_cpus"):
                try:
                    return open(f"/sys/fs/cgroup/cpuset{path}/{name}").read().strip()
                except OSError:
                    pass
    return ""


report = {
    "argv_hex": [os.fsencode(a).hex() for a in sys.argv[1:]],
    "allowed": sorted(os.sched_getaffinity(0)),
    "cpuset": cpuset(),
    "host": socket.gethostname(),
    "env": {k: v for k, v in os.environ.items()
            if k.startswith(("AFFRUN_", "SLURM_", "SLURMD_", "OMP_", "CUDA_VISIBLE")) or k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE")},
}
if os.environ.get("REPORT_GLOO") == "1":
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(value)
    report["allreduce"] = int(value.item())
    report["world_size"] = dist.get_world_size()
    report["rank"] = dist.get_rank()
    dist.destroy_process_group()
rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID", "0")
with open(os.path.join(os.environ["REPORT_DIR"], f"rank{rank}.json"), "w") as fh:
    json.dump(report, fh)
