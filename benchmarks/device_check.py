"""The GPU validation as one command: every check the lent GPU machine is for, bounded, each failure recorded.

``bash benchmarks/device_check.sh`` runs this driver under a hard time limit. Each step (:func:`steps`, in order of
importance) has its share of the time plan (``cap``, seconds of a run on the lent machine, where the whole check
ends within ``DEVICE_LIMIT``); it runs its commands as subprocesses that are killed at the end of its share, never
past the run's deadline, and the steps that launch jobs size themselves from the launch cost ``ceiling`` measured.
A step that fails, overruns or cannot run is recorded with its reason and the next one starts. After every step ``device_check.json`` and ``device_check.md`` are rewritten in ``--out`` (default
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
from device_check_feed import ceiling_step, doctor_feed_step, gpu_feed_step, tune_step  # noqa: E402
from device_check_report import summary, write_reports  # noqa: E402
from device_check_run import Context, Result  # noqa: E402
from device_check_setup import write_fake_trees  # noqa: E402
from device_check_steps import (  # noqa: E402
    environment_step,
    install_step,
    plan_step,
    topology_nvml_step,
    topology_step,
    torch_info_step,
)

ROOT = HERE.parent
DEVICE_LIMIT = 360.0  # seconds: the whole check on the lent machine, tune included (a second call still fits)
REHEARSAL_SCALE = 2.0  # a rehearsal's shares: a loaded 2-core machine takes longer for the same step
MARGIN = 10.0  # seconds of the limit kept for the reports and the exit
SETUP_STEPS = ("environment", "install", "torch-info", "topology")  # the facts every other step needs
CEILING_USERS = ("doctor-feed-starved", "doctor-feed-fed", "gpu-feed-1", "gpu-feed-8", "tune")


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[Context], Result]
    what: str
    cap: float  # its share of the time plan: seconds on the lent machine (x the scale elsewhere)
    needs: tuple[str, ...] = ()  # "cuda", "nvml", "hook"
    min_seconds: float = 5.0  # not started with less time left


def steps(args: argparse.Namespace) -> list[Step]:
    """The steps in order of importance with their shares: those up to ``tune`` hold the run's whole time plan;
    the ones after (held by the first device run) take what the steps before them left."""
    extra = shlex.split(args.gpu_feed_args)
    return [
        Step("environment", environment_step, "kernel, NUMA nodes, the GPU's numa_node and local_cpulist, IB and net "
             "classes, whether sched_setaffinity takes effect", 5),
        Step("install", partial(install_step, carry=Path(args.carry)), "this checkout's affrun in a venv that sees "
             "the machine's packages (pip --no-deps, else the hook by hand, else PYTHONPATH)", 25),
        Step("torch-info", torch_info_step, "torch, CUDA, NCCL, NVML, numactl, libiomp5 as the steps see them", 15),
        Step("topology", topology_step, "affrun topology --json against sysfs", 5),
        Step("topology-nvml", topology_nvml_step, "affrun topology --nvml: UUIDs, NVML against sysfs", 5, ("nvml",)),
        Step("plan-8", plan_step, "affrun plan --json for 8 ranks, whole", 5),
        Step("ceiling", ceiling_step, "the device's limit: the model step with the batch already on the device, no "
             "loader; NVML meanwhile; the launch cost every later launch is sized by", 40, min_seconds=20),
        Step("nccl-comm-cores", nccl_step, "an all-reduce under --comm-cores 1: each thread born with the process "
             "group, its CPU time and where it ran; the busy ones on the comm cores", 30, min_seconds=15),
        Step("doctor-feed-starved", partial(doctor_feed_step, starved=True), "a GPU job fed by its own process "
             "(0 workers): affrun doctor --pid --json and the meter (wait, verdict) against NVML", 35, min_seconds=20),
        Step("doctor-feed-fed", partial(doctor_feed_step, starved=False), "the same job with up to 8 workers", 35,
             min_seconds=20),
        Step("gpu-feed-1", partial(gpu_feed_step, n=1, extra=extra), "benchmarks/gpu_feed.py, 1 rank: affrun against "
             "torchrun, the collapse, --loader-cores 1, --numa-binding, KMP_AFFINITY=disabled, as time allows", 70,
             min_seconds=30),
        Step("tune", tune_step, "affrun tune on the same device step within 60 s: tuned against the ceiling and the "
             "default", 72, ("hook",), min_seconds=30),
        Step("gpu-feed-8", partial(gpu_feed_step, n=8, extra=extra), "benchmarks/gpu_feed.py, 8 ranks, as time allows",
             80, min_seconds=30),
        *(Step(f"bind-{n}", partial(bind_step, n=n), f"affrun torchrun, {n} rank(s): masks, GPU PCI against NVML, "
               "OpenMP places, DataLoader workers (pin_memory=True)", cap, min_seconds=10)
          for n, cap in ((8, 35), (1, 25), (4, 25))),
        Step("torchrun-numa-binding", numa_binding_step, "plain torchrun --numa-binding, each mode, 1 rank: masks", 60,
             ("cuda",), min_seconds=10),
    ]


def plan_scale(args: argparse.Namespace, plan: list[Step], selected: set[str]) -> float:
    """How much each share is stretched: ``--scale``, else 1 on the device and :data:`REHEARSAL_SCALE` in a
    rehearsal; with ``--only``, at least enough for the chosen steps to share the whole limit."""
    scale = args.scale or (REHEARSAL_SCALE if args.rehearse else 1.0)
    if args.only:
        chosen = sum(s.cap for s in plan if s.name in selected)
        scale = max(scale, (args.limit - MARGIN) / chosen) if chosen else scale
    return scale


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


def run_step(ctx: Context, step: Step, selected: bool, scale: float, run_t0: float) -> dict[str, Any]:
    """Run ``step`` with its share of the plan (x ``scale``, never past the deadline) as its time; its record says
    when it started (``started_s``, from the run's start), the seconds it was given and the seconds it took."""
    t0 = time.monotonic()
    left = ctx.deadline - t0
    planned = min(step.cap * scale, left)
    why = ("not selected (--only/--skip)" if not selected else unmet(ctx, step)
           or (f"out of time: {left:.0f} s left of the limit, the step needs {step.min_seconds:.0f}"
               if left < step.min_seconds else ""))
    if why:
        result = Result("skipped", why)
        planned = 0.0
    else:
        ctx.step_end = t0 + planned
        try:
            result = step.run(ctx)
        except Exception as exc:  # a bug or a surprise in one step: recorded, and the next step runs
            result = Result("failed", f"{type(exc).__name__}: {exc}", output_tail=traceback.format_exc()[-3000:])
        finally:
            ctx.stop_all()
        if result.status == "ok" and time.monotonic() >= ctx.step_end:
            result.status, result.reason = "timeout", f"the step's {planned:.0f} s of the plan ran out during it"
    return {"step": step.name, "what": step.what, "status": result.status, "reason": result.reason,
            "started_s": round(t0 - run_t0, 1), "planned_s": round(planned, 1),
            "seconds": round(time.monotonic() - t0, 1),
            "headline": result.headline, "checks": result.checks,
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
    parser.add_argument("--limit", type=float, help=f"seconds for the whole run (default {DEVICE_LIMIT:.0f}, a "
                        f"rehearsal {DEVICE_LIMIT * REHEARSAL_SCALE:.0f})")
    parser.add_argument("--scale", type=float, default=0.0,
                        help=f"stretch every step's share (default 1, a rehearsal {REHEARSAL_SCALE:g})")
    parser.add_argument("--only", default="", help="comma-separated steps to run (and the setup steps)")
    parser.add_argument("--skip", default="", help="comma-separated steps not to run")
    parser.add_argument("--carry", default=str(ROOT / ".carry"),
                        help="folder of carried .deb and .whl files to unpack first (default .carry)")
    parser.add_argument("--gpu-feed-args", default="", help="more options for benchmarks/gpu_feed.py")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (venv, logs)")
    args = parser.parse_args()
    if args.limit is None:
        args.limit = DEVICE_LIMIT * (REHEARSAL_SCALE if args.rehearse else 1.0)
    plan = steps(args)
    names = {s.name for s in plan}
    only, skip = ({n for n in text.split(",") if n} for text in (args.only, args.skip))
    if (only | skip) - names or args.limit < 60 or args.scale < 0:
        parser.error(f"--limit must be at least 60, --scale positive; steps are {', '.join(s.name for s in plan)}")
    if only & set(CEILING_USERS):
        only.add("ceiling")  # the launch cost and the ceiling they are sized and judged by
    selected = {s.name for s in plan if s.name not in skip and (not only or s.name in only or s.name in SETUP_STEPS)}
    scale = plan_scale(args, plan, selected)
    started, t0 = datetime.datetime.now(datetime.timezone.utc), time.monotonic()
    out = Path(args.out or os.environ.get("OUT") or ROOT / ".out" / "device-check").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="affrun-device-check-"))
    ctx = Context(args.rehearse, out, work, t0 + args.limit - MARGIN, sys.executable, base_env())
    meta: dict[str, Any] = {"schema": 2, "mode": "rehearsal" if args.rehearse else "device",
                            "started": started.strftime("%Y-%m-%d %H:%M:%S UTC"), "limit_s": args.limit,
                            "argv": sys.argv[1:], "out": str(out),
                            "plan": {"device_limit_s": DEVICE_LIMIT, "margin_s": MARGIN, "scale": round(scale, 3),
                                     "shares": {s.name: s.cap for s in plan}}}
    records: list[dict[str, Any]] = []
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        if args.rehearse:
            ctx.tree, ctx.plan_tree = write_fake_trees(work)
            ctx.env["AFFRUN_FSROOT"] = str(ctx.tree)
            meta["fake_tree"] = "this machine's CPUs, one NUMA node, one fake NVIDIA GPU (tests/fakesys.py)"
        for step in plan:
            records.append(run_step(ctx, step, step.name in selected, scale, t0))
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
