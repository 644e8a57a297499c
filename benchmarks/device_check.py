"""The GPU validation as one command: every check the lent GPU machine is for, bounded, each failure recorded.

``bash benchmarks/device_check.sh`` runs this driver under a hard time limit. Each step (``STEPS``, in order of
importance) runs its commands as subprocesses with their own timeouts, never past the run's deadline (``--limit``
less a margin for the reports); a step that fails, overruns or cannot run is recorded with its reason and the next
one starts. After every step ``device_check.json`` and ``device_check.md`` are rewritten in ``--out`` (default
``$OUT``, else ``.out/device-check``), so a run killed from outside still leaves its reports; a short summary ends
the output. ``--rehearse`` runs it on a machine without a GPU: the CUDA, NCCL and NVML steps are skipped with
the reason, the rest runs on a fake GPU tree (tests/fakesys.py). What each step checks: docs/performance.md
("GPU validation").

Exit status: 0 when every step is ok or skipped, 1 when one failed or timed out, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's launcher, whatever is installed

from device_check_bind import bind_step, nccl_step, numa_binding_step  # noqa: E402
from device_check_report import summary, write_reports  # noqa: E402
from device_check_run import Context, Result  # noqa: E402
from device_check_setup import write_fake_trees  # noqa: E402
from device_check_steps import (  # noqa: E402
    doctor_feed_step,
    environment_step,
    gpu_feed_step,
    install_step,
    plan_step,
    topology_nvml_step,
    topology_step,
    torch_info_step,
    tune_step,
)

ROOT = HERE.parent
MARGIN = 25.0  # seconds of the limit kept for the reports and the exit
SETUP_STEPS = ("environment", "install", "torch-info", "topology")  # the facts every other step needs


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[Context], Result]
    what: str
    needs: tuple[str, ...] = ()  # "cuda", "nvml", "hook"
    min_seconds: float = 20.0  # not started with less time left


def steps(args: argparse.Namespace) -> list[Step]:
    extra = shlex.split(args.gpu_feed_args)
    return [
        Step("environment", environment_step, "kernel, NUMA nodes, the GPU's numa_node and local_cpulist, IB and net "
             "classes, whether sched_setaffinity takes effect", min_seconds=5),
        Step("install", partial(install_step, carry=Path(args.carry)), "this checkout's affrun in a venv that sees "
             "the machine's packages (pip --no-deps, else the hook by hand, else PYTHONPATH)", min_seconds=5),
        Step("torch-info", torch_info_step, "torch, CUDA, NCCL, NVML, numactl, libiomp5 as the steps see them",
             min_seconds=5),
        Step("topology", topology_step, "affrun topology --json against sysfs", min_seconds=5),
        Step("topology-nvml", topology_nvml_step, "affrun topology --nvml: UUIDs, NVML against sysfs", ("nvml",)),
        Step("plan-8", plan_step, "affrun plan --json for 8 ranks, whole", min_seconds=5),
        *(Step(f"bind-{n}", partial(bind_step, n=n), f"affrun torchrun, {n} rank(s): masks, GPU PCI against NVML, "
               "OpenMP places, DataLoader workers (pin_memory=True)") for n in (1, 4, 8)),
        Step("nccl-comm-cores", nccl_step, "NCCL all-reduce under --comm-cores 1: where NCCL's threads ran", ("cuda",)),
        Step("torchrun-numa-binding", numa_binding_step, "plain torchrun --numa-binding, each mode, 1 rank: masks",
             ("cuda",)),
        Step("doctor-feed-starved", partial(doctor_feed_step, starved=True), "a GPU job fed by its own process "
             "(0 workers): affrun doctor --pid --json, the meter's wait against NVML's utilisation"),
        Step("doctor-feed-fed", partial(doctor_feed_step, starved=False), "the same job with up to 8 workers"),
        Step("gpu-feed-1", partial(gpu_feed_step, n=1, extra=extra), "benchmarks/gpu_feed.py, 1 rank: affrun against "
             "torchrun, --numa-binding, the collapse, KMP_AFFINITY=disabled", min_seconds=60),
        Step("gpu-feed-8", partial(gpu_feed_step, n=8, extra=extra), "benchmarks/gpu_feed.py, 8 ranks", min_seconds=90),
        Step("tune", tune_step, "affrun tune, a few short trials on the real device step", ("hook",), min_seconds=60),
    ]


def unmet(ctx: Context, step: Step) -> str:
    """Why ``step`` cannot run here ('' if it can)."""
    for need in step.needs:
        if need == "hook" and not ctx.facts.get("hook"):
            return "needs affrun's startup hook (--feed-report), which the install step could not provide"
        if need in ("cuda", "nvml") and not ctx.facts.get(need):
            if ctx.rehearse:
                return f"rehearsal: needs {need.upper()}, which the device run has"
            return ("torch sees no CUDA device (torch-info)" if need == "cuda"
                    else "NVML is not available (nvidia-ml-py or the driver: torch-info)")
    return ""


def run_step(ctx: Context, step: Step, selected: bool) -> dict[str, Any]:
    t0 = time.monotonic()
    left = ctx.deadline - t0
    why = ("not selected (--only/--skip)" if not selected else unmet(ctx, step)
           or (f"out of time: {left:.0f} s left of the limit, the step needs {step.min_seconds:.0f}"
               if left < step.min_seconds else ""))
    if why:
        result = Result("skipped", why)
    else:
        ctx.step_end = ctx.deadline
        try:
            result = step.run(ctx)
        except Exception as exc:  # a bug or a surprise in one step: recorded, and the next step runs
            result = Result("failed", f"{type(exc).__name__}: {exc}", output_tail=traceback.format_exc()[-3000:])
        finally:
            ctx.stop_all()
        if result.status == "ok" and time.monotonic() >= ctx.deadline:
            result.status, result.reason = "timeout", "the run's deadline came during the step"
    return {"step": step.name, "what": step.what, "status": result.status, "reason": result.reason,
            "seconds": round(time.monotonic() - t0, 1), "headline": result.headline, "checks": result.checks,
            "figures": result.figures, "commands": result.commands, "output_tail": result.output_tail}


class Stopped(BaseException):
    """SIGTERM (the shell's time limit) or Ctrl-C: no step's ``except Exception`` may swallow it."""


def _stop(signum: int, _frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


def base_env() -> dict[str, str]:
    """This environment without the variables that would change a launcher's or a runtime's behaviour."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "AFFRUN_", "LOCAL_", "PET_",
                                "TORCHELASTIC_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rehearse", action="store_true",
                        help="no GPU here: skip the CUDA/NCCL/NVML steps, run the rest on a fake GPU tree")
    parser.add_argument("--out", help="folder for device_check.json/.md (default: $OUT, else .out/device-check)")
    parser.add_argument("--limit", type=float, default=480.0, help="seconds for the whole run (default 480)")
    parser.add_argument("--only", default="", help="comma-separated steps to run (and the setup steps)")
    parser.add_argument("--skip", default="", help="comma-separated steps not to run")
    parser.add_argument("--carry", default=str(ROOT / ".carry"),
                        help="folder of carried .deb and .whl files to unpack first (default .carry)")
    parser.add_argument("--gpu-feed-args", default="", help="more options for benchmarks/gpu_feed.py")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (venv, logs)")
    args = parser.parse_args()
    plan = steps(args)
    names = {s.name for s in plan}
    only, skip = ({n for n in text.split(",") if n} for text in (args.only, args.skip))
    if (only | skip) - names or args.limit < 60:
        parser.error(f"--limit must be at least 60; steps are {', '.join(s.name for s in plan)}")
    started, t0 = datetime.datetime.now(datetime.timezone.utc), time.monotonic()
    out = Path(args.out or os.environ.get("OUT") or ROOT / ".out" / "device-check").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="affrun-device-check-"))
    ctx = Context(args.rehearse, out, work, t0 + args.limit - MARGIN, sys.executable, base_env())
    meta: dict[str, Any] = {"schema": 1, "mode": "rehearsal" if args.rehearse else "device",
                            "started": started.strftime("%Y-%m-%d %H:%M:%S UTC"), "limit_s": args.limit,
                            "argv": sys.argv[1:], "out": str(out)}
    records: list[dict[str, Any]] = []
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        if args.rehearse:
            ctx.tree, ctx.plan_tree = write_fake_trees(work)
            ctx.env["AFFRUN_FSROOT"] = str(ctx.tree)
            meta["fake_tree"] = "this machine's CPUs, one NUMA node, one fake NVIDIA GPU (tests/fakesys.py)"
        for step in plan:
            selected = step.name not in skip and (not only or step.name in only or step.name in SETUP_STEPS)
            records.append(run_step(ctx, step, selected))
            r = records[-1]
            print(f"[{time.monotonic() - t0:6.1f} s] {r['step']}: {r['status']} ({r['seconds']} s) "
                  f"{(r['headline'] or r['reason'])[:150]}", flush=True)
            meta["wall_s"] = round(time.monotonic() - t0, 1)
            write_reports(out, meta, records)
    except Stopped as stop:
        meta["stopped"] = f"{stop} after {time.monotonic() - t0:.0f} s: the steps after the last one recorded did not run"
    finally:
        ctx.stop_all()
        meta["wall_s"] = round(time.monotonic() - t0, 1)
        write_reports(out, meta, records)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(summary(meta, records), flush=True)
    return 0 if all(r["status"] in ("ok", "skipped") for r in records) and "stopped" not in meta else 1


if __name__ == "__main__":
    sys.exit(main())
