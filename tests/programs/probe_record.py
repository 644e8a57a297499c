"""What a process under test really runs with, written as one JSON file per process into $PROBE_DIR."""

import json
import os


def cpus_allowed(task: str = "self") -> str:
    with open(f"/proc/{task}/status") as fh:
        for line in fh:
            if line.startswith("Cpus_allowed_list:"):
                return line.split()[1]
    return ""


def thread_masks() -> list[str]:
    return sorted({cpus_allowed(f"self/task/{t}") for t in os.listdir("/proc/self/task")})


def record(kind: str, **extra: object) -> None:
    out = {"kind": kind, "pid": os.getpid(), "ppid": os.getppid(), "mask": cpus_allowed(),
           "LOCAL_RANK": os.environ.get("LOCAL_RANK"), "AFFRUN_LOCAL_RANK": os.environ.get("AFFRUN_LOCAL_RANK"),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "OMP_PLACES": os.environ.get("OMP_PLACES"), **extra}
    path = os.path.join(os.environ["PROBE_DIR"], f"{kind}-{os.getpid()}.json")
    with open(path, "w") as fh:
        json.dump(out, fh)
