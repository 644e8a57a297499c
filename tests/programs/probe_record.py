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


def ancestors(levels: int = 6) -> list[dict[str, object]]:
    """The parent, grandparent... (pid, argv, mask): the launchers above this process, as they really run."""
    out: list[dict[str, object]] = []
    pid = os.getppid()
    while pid > 1 and len(out) < levels:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
            with open(f"/proc/{pid}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
            out.append({"pid": pid, "argv": argv, "mask": cpus_allowed(str(pid))})
        except OSError:
            break
        pid = parent
    return out


def record(kind: str, **extra: object) -> None:
    out = {"kind": kind, "pid": os.getpid(), "ppid": os.getppid(), "mask": cpus_allowed(),
           "LOCAL_RANK": os.environ.get("LOCAL_RANK"), "AFFRUN_LOCAL_RANK": os.environ.get("AFFRUN_LOCAL_RANK"),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "OMP_PLACES": os.environ.get("OMP_PLACES"),
           "SLURM_LOCALID": os.environ.get("SLURM_LOCALID"), "ancestors": ancestors(), **extra}
    path = os.path.join(os.environ["PROBE_DIR"], f"{kind}-{os.getpid()}.json")
    with open(path, "w") as fh:
        json.dump(out, fh)
