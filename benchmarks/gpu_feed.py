"""The headline benchmark: a DataLoader-fed training loop under affrun and under what users run today.

Every rank (benchmarks/gpu_feed_rank.py) runs a synthetic image pipeline with a realistic CPU cost per sample
(decode-like work on uint8 data, resize, random crop, flip, normalise, collate) through a DataLoader with
``--workers`` workers, does a MixUp of each batch on the CPU (torch intra-op threads), then a device step: a real
conv-net training step on CUDA, or, without a GPU, a calibrated wait that sleeps, so that a starved feed shows as
device-idle time. The wait is calibrated in the same run: the CPU time one batch costs, divided by the cores of a
rank (``--balance`` scales it).

Configurations, each a real launch in this run, ``--repeats`` times, interleaved, median reported:
  ceiling             affrun torchrun, the same device step with one batch already on the device and no loader:
                      the limit every other configuration is read against (``vs_ceiling``)
  torchrun            plain torchrun (it sets OMP_NUM_THREADS=1 for more than one rank)
  torchrun-collapse   torchrun with OMP_PROC_BIND=close OMP_PLACES=cores exported
  kmp-disabled        torchrun, Intel's libiomp5 LD_PRELOADed into every process, KMP_AFFINITY=disabled
  oversubscribed      torchrun with OMP_NUM_THREADS = all the cores, on every rank
  torchrun-numa       torchrun --numa-binding exclusive (needs numactl and a CUDA GPU; skipped otherwise)
  affrun              affrun torchrun, defaults
  affrun-...          affrun torchrun with each other choice of the options in AFFRUN_VARIANT_FLAGS, and
                      the rows of AFFRUN_VARIANTS, where the installed affrun has that option

Figures per configuration: samples per second (sum of the ranks), the fraction of the time the device waited for
data (mean of the ranks), thread migrations per second of the ranks and their workers (affrun doctor --pid's
/proc sampling: a lower bound), and GPU utilisation from NVML (when nvidia-ml-py and a GPU are present).

``--only`` runs the configurations named, in that order; with ``--budget`` a configuration starts only while the
budget holds one more launch (the slowest launch so far, else ``--launch-estimate``), and each launch is killed
if its ranks are not ready within ``--start-timeout``: the ones left out are listed with the reason.

Usage: python benchmarks/gpu_feed.py [--ranks N] [--repeats R] [--seconds S] [--json FILE] [--png FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from _common import AFFRUN, PY, byte_compile_affrun, clean_env
from gpu_feed_launch import Outcome, launch
from gpu_feed_report import add_ratios, draw_png, print_table

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "gpu_feed_rank.py")
TORCHRUN = [PY, "-m", "torch.distributed.run"]
# Intel's OpenMP runtime from the intel-openmp wheel, in this interpreter's prefix (where the tests find it too).
LIBIOMP5 = os.path.join(sys.prefix, "lib", "libiomp5.so")

# affrun options whose every non-default choice is measured as one variant, named affrun-<flag>-<choice>
# (--omp-bind core -> affrun-omp-bind-core). A flag the installed affrun lacks is left out, so the benchmark keeps
# working before and after an option lands.
AFFRUN_VARIANT_FLAGS: tuple[str, ...] = ("--omp-bind", "--spill")


@dataclass(frozen=True)
class Variant:
    """One more affrun variant: affrun torchrun options, and options for the rank script."""

    name: str
    affrun_args: tuple[str, ...]
    rank_args: tuple[str, ...] = ()
    min_cores_per_rank: int = 1
    why: str = ""


# Variants that are not one choice of one flag. Extend here.
AFFRUN_VARIANTS: tuple[Variant, ...] = (
    Variant("affrun-omp-bind-core-init", ("--omp-bind", "core"), ("--worker-init",),
            why="--omp-bind core with the DataLoader's worker_init_fn=launcher.torch.worker_init_fn, as README says"),
    Variant("affrun-loader-cores-1", ("--loader-cores", "1"), ("--worker-init",), min_cores_per_rank=2,
            why="one core of each rank for its DataLoader workers (worker_init_fn pins them there)"),
)


@dataclass(frozen=True)
class Config:
    name: str
    argv: tuple[str, ...]  # the launcher and its options, without --nproc-per-node and the script
    env: dict[str, str] = field(default_factory=dict)  # added to the cleaned environment
    rank_args: tuple[str, ...] = ()
    note: str = ""


@dataclass
class Result:
    config: Config
    outcomes: list[Outcome] = field(default_factory=list)

    def ok(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.error is None]

    def to_json(self) -> dict[str, Any]:
        ok = self.ok()
        error = next((o.error for o in self.outcomes if o.error), None)

        def median(values: list[float | None]) -> float | None:
            present = [v for v in values if v is not None]
            return statistics.median(present) if present else None

        return {
            "name": self.config.name,
            "samples_per_s": median([o.samples_per_s for o in ok]) or 0.0,
            # A run that failed delivered nothing: its device waited the whole time.
            "device_wait_fraction": median([o.device_wait_fraction for o in ok]) if ok else 1.0,
            "migrations_per_s": median([o.migrations_per_s for o in ok]),
            "gpu_util": median([o.gpu_util for o in ok]),
            "status": "ok" if ok and not error else ("failed" if not ok else "partly failed"),
            "error": error,
            "worker_cpus": next((o.worker_cpus for o in reversed(ok) if o.worker_cpus is not None), None),
            "runs": [o.samples_per_s if o.error is None else None for o in self.outcomes],
            "command": " ".join(self.config.argv),
            "env": self.config.env,
            "rank_args": list(self.config.rank_args),
            "note": self.config.note,
        }


def installed_affrun_options() -> dict[str, tuple[tuple[str, ...] | None, object]]:
    """flag -> (choices, default) of the binding options the installed affrun has."""
    from launcher.options.table import BINDING_OPTIONS

    return {o.flag: (o.choices, o.default) for o in BINDING_OPTIONS}


def unsupported(args: tuple[str, ...], options: dict[str, tuple[tuple[str, ...] | None, object]]) -> str:
    """The first flag, or flag's choice, in ``args`` that the installed affrun does not have ('' if none)."""
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        if arg not in options:
            return arg
        choices = options[arg][0]
        value = args[i + 1] if i + 1 < len(args) else None
        if choices and value not in choices:
            return f"{arg} {value}"
    return ""


def affrun_variants(cores_per_rank: int, options: dict[str, tuple[tuple[str, ...] | None, object]] | None = None,
                    ) -> tuple[list[Variant], list[dict[str, str]]]:
    """The affrun variants to measure, and the ones skipped with the reason (``options``: the installed affrun's)."""
    options = installed_affrun_options() if options is None else options
    chosen: list[Variant] = []
    skipped: list[dict[str, str]] = []
    for flag in AFFRUN_VARIANT_FLAGS:
        if flag not in options:
            skipped.append({"name": f"affrun-{flag.lstrip('-')}-*", "reason": f"this affrun has no {flag}"})
            continue
        choices, default = options[flag]
        for choice in choices or ():
            if choice != default:
                chosen.append(Variant(f"affrun-{flag.lstrip('-')}-{choice}", (flag, choice)))
    for v in AFFRUN_VARIANTS:
        missing = unsupported(v.affrun_args, options)
        if missing:
            skipped.append({"name": v.name, "reason": f"this affrun has no {missing}"})
        elif cores_per_rank < v.min_cores_per_rank:
            skipped.append({"name": v.name, "reason": f"needs {v.min_cores_per_rank} cores per rank, "
                                                      f"there are {cores_per_rank}"})
        else:
            chosen.append(v)
    return chosen, skipped


def plan_for(affrun_args: tuple[str, ...], ranks: int) -> Any:
    """What each rank gets (CPUs, compute cores, loader CPUs, threads, GPU) from ``affrun torchrun`` here with
    ``affrun_args``, or None when they are not all planning options
    (an environment option such as --omp-bind changes what a rank runs with, not the plan)."""
    from launcher.options.record import Options
    from launcher.options.table import options_in
    from launcher.plan.planner import make_plan
    from launcher.topology import load_topology

    specs = {s.flag: s for s in options_in("plan")}
    values: dict[str, Any] = {}
    i = 0
    while i < len(affrun_args):
        spec = specs.get(affrun_args[i])
        if spec is None:
            return None
        if spec.is_flag:
            values[spec.dest] = True
            i += 1
        else:
            values[spec.dest] = int(affrun_args[i + 1]) if spec.count else affrun_args[i + 1]
            i += 2
    opts = Options(**values)
    plan = make_plan(load_topology(gpus=not opts.no_gpu), opts.request(ranks))
    return tuple((r.cpus, r.compute_cores, r.loader_cpus, r.threads, r.gpu) for r in plan.ranks)


def configurations(cores: int, ranks: int, cuda: bool) -> tuple[list[Config], list[dict[str, str]]]:
    configs = [
        Config("ceiling", (*AFFRUN, "torchrun"), rank_args=("--ceiling",),
               note="the same device step, one batch already on the device, no loader: the device's limit"),
        Config("torchrun", tuple(TORCHRUN), note="torchrun's defaults"),
        Config("torchrun-collapse", tuple(TORCHRUN), {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
               note="the binding variables exported in the shell"),
    ]
    skipped: list[dict[str, str]] = []
    if os.path.exists(LIBIOMP5):
        configs.append(Config("kmp-disabled", tuple(TORCHRUN), {"LD_PRELOAD": LIBIOMP5, "KMP_AFFINITY": "disabled"},
                              note="libiomp5 of the intel-openmp wheel LD_PRELOADed: it serves torch's OpenMP calls"))
    else:
        skipped.append({"name": "kmp-disabled", "reason": f"{LIBIOMP5} not found (pip install intel-openmp)"})
    configs.append(Config("oversubscribed", tuple(TORCHRUN), {"OMP_NUM_THREADS": str(cores)},
                          note=f"OMP_NUM_THREADS={cores} on each of {ranks} rank(s)"))
    if not shutil.which("numactl"):
        skipped.append({"name": "torchrun-numa", "reason": "torchrun --numa-binding runs numactl, not installed"})
    elif not cuda:
        skipped.append({"name": "torchrun-numa", "reason": "torchrun --numa-binding binds to a CUDA GPU's NUMA node; "
                                                           "no GPU here"})
    else:
        configs.append(Config("torchrun-numa", (*TORCHRUN, "--numa-binding", "exclusive")))
    configs.append(Config("affrun", (*AFFRUN, "torchrun"), note="affrun's defaults"))
    variants, more = affrun_variants(cores // max(ranks, 1))
    skipped += more
    default_plan = plan_for((), ranks)
    for v in list(variants):
        plan = plan_for(v.affrun_args, ranks)
        if plan is not None and plan == default_plan:
            variants.remove(v)
            skipped.append({"name": v.name, "reason": f"{' '.join(v.affrun_args)} plans this machine as affrun's "
                                                      "default does: nothing different to measure"})
    configs += [Config(v.name, (*AFFRUN, "torchrun", *v.affrun_args), rank_args=v.rank_args, note=v.why)
                for v in variants]
    return configs, skipped


def probe(batch_size: int) -> dict[str, Any]:
    """The device and the pipeline's CPU cost of one batch, measured in a clean process like a rank."""
    import subprocess

    proc = subprocess.run([PY, RANK_SCRIPT, "--calibrate", "5", "--batch-size", str(batch_size)], env=clean_env(),
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"gpu_feed: calibration failed:\n{proc.stderr[-2000:]}")
    return dict(json.loads(proc.stdout.splitlines()[-1]))


def intel_runtime_check() -> str:
    """Show that an LD_PRELOADed libiomp5 really runs torch's parallel regions: its own verbose report."""
    import subprocess

    code = "import torch; torch.ones(1 << 20).mul_(2)"
    env = clean_env(LD_PRELOAD=LIBIOMP5, KMP_AFFINITY="verbose,none", OMP_NUM_THREADS="2")
    proc = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    threads = proc.stderr.count("bound to OS proc set")
    return (f"libiomp5 in use: under KMP_AFFINITY=verbose it reported {threads} OpenMP thread(s) of a torch op"
            if threads else "libiomp5 did NOT report torch's threads: kmp-disabled may not measure Intel's runtime")


def run_all(configs: list[Config], args: argparse.Namespace, rank_args: list[str], go_file: str,
            skipped: list[dict[str, str]]) -> list[Result]:
    """Every configuration once per repeat, interleaved (drift hits all alike); a first failure is not repeated.
    Under ``--budget``, a launch starts only while the budget holds one more (the first always starts); the ones
    left out join ``skipped``."""
    results = [Result(c) for c in configs]
    end = getattr(args, "started", time.monotonic()) + args.budget if args.budget else float("inf")
    estimate = args.launch_estimate or 0.0
    for repeat in range(args.repeats):
        for result in results:
            c = result.config
            if result.outcomes and all(o.error for o in result.outcomes):
                continue  # it failed on its first run: the same launch fails the same way
            left = end - time.monotonic()
            started = any(r.outcomes for r in results)
            if started and left < estimate:
                if not result.outcomes:
                    skipped.append({"name": c.name, "reason": f"out of budget: {max(0.0, left):.0f} s left of "
                                    f"{args.budget:g}, a launch takes {estimate:.0f} s"})
                continue
            argv = [*c.argv, "--nproc-per-node", str(args.ranks), RANK_SCRIPT, *rank_args, *c.rank_args,
                    "--go-file", go_file]
            timeout = min(args.start_timeout, max(5.0, left - args.seconds))
            outcome = launch(argv, clean_env(**c.env), args.seconds, args.ranks, go_file, timeout)
            estimate = max(estimate, outcome.wall_s)
            result.outcomes.append(outcome)
            print(f"  [{repeat + 1}/{args.repeats}] {c.name}: " + (
                f"{outcome.samples_per_s:.0f} samples/s" if outcome.error is None else f"failed: {outcome.error}")
                + f" (launch {outcome.wall_s:.1f} s, {outcome.start_s:.1f} s to the measured phase)", flush=True)
    results = [r for r in results if r.outcomes]
    return results


def ceiling_of(results: list[Result], args: argparse.Namespace, cuda: bool, step_ms: float) -> dict[str, Any] | None:
    """The device's limit in samples/s: the ``ceiling`` configuration measured here, else ``--ceiling-samples-per-s``,
    else (no GPU) the simulated device's own, batch x ranks / step."""
    measured = next((r.to_json() for r in results if r.config.name == "ceiling" and r.ok()), None)
    if measured is not None:
        return {"samples_per_s": measured["samples_per_s"], "source": "measured in this run (the ceiling config)"}
    if args.ceiling_samples_per_s:
        return {"samples_per_s": args.ceiling_samples_per_s, "source": "given (--ceiling-samples-per-s)"}
    if not cuda:
        return {"samples_per_s": args.batch_size * args.ranks * 1000.0 / step_ms,
                "source": "the simulated device: batch x ranks / step"}
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cores = len(os.sched_getaffinity(0))
    parser.add_argument("--ranks", type=int, default=min(2, cores), help="ranks (torchrun --nproc-per-node)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="launches of each configuration (median reported); 2 keeps the default run under 3 minutes on 2 cores")
    parser.add_argument("--seconds", type=float, default=1.5, help="measured seconds per run, after the warm-up")
    parser.add_argument("--warmup", type=float, default=0.5, help="warm-up seconds per run")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, help="DataLoader workers per rank (default: the cores of a rank)")
    parser.add_argument("--balance", type=float, default=1.0,
                        help="device step = balance x the CPU time of a batch / the cores of a rank")
    parser.add_argument("--model-steps", type=int, default=1,
                        help="on CUDA: training steps of the net per batch, for a busier GPU")
    parser.add_argument("--only", help="comma-separated configuration names to run (default: all)")
    parser.add_argument("--json", dest="json_path", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--png", metavar="FILE", help="draw a bar chart (needs matplotlib: pip install .[benchmarks])")
    parser.add_argument("--budget", type=float, default=0.0,
                        help="seconds for the launches: none starts once the budget cannot hold one more")
    parser.add_argument("--launch-estimate", type=float, default=0.0,
                        help="seconds one launch takes, until this run has measured one (with --budget)")
    parser.add_argument("--start-timeout", type=float, default=180.0,
                        help="seconds a launch's ranks have to be ready before it is killed (default 180)")
    parser.add_argument("--ceiling-samples-per-s", type=float, default=0.0,
                        help="the device's limit measured elsewhere (vs_ceiling), when the ceiling config is not run")
    parser.add_argument("--calibration", metavar="JSON",
                        help='the probe\'s figures, measured elsewhere: {"batch_s": S, "cuda": bool, "device": str}')
    args = parser.parse_args()
    if min(args.ranks, args.repeats, args.batch_size, args.model_steps) < 1 or args.seconds <= 0 or args.balance <= 0:
        parser.error("--ranks, --repeats, --batch-size, --model-steps must be >= 1; --seconds and --balance > 0")
    if min(args.budget, args.launch_estimate, args.ceiling_samples_per_s) < 0 or args.start_timeout <= 0:
        parser.error("--budget, --launch-estimate and --ceiling-samples-per-s must be >= 0, --start-timeout > 0")
    if args.png:
        try:
            import matplotlib  # noqa: F401  (checked before the run, drawn after it)
        except ImportError:
            parser.error("--png needs matplotlib: pip install '.[benchmarks]'")
    # SIGTERM unwinds like Ctrl-C, so that a running job is killed with its ranks and workers (launch's finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = args.started = time.monotonic()  # --budget counts from here: the probe and the checks are in it
    byte_compile_affrun()
    cores_per_rank = max(1, cores // args.ranks)
    workers = args.workers if args.workers is not None else cores_per_rank
    info = json.loads(args.calibration) if args.calibration else probe(args.batch_size)
    step_ms = args.balance * info["batch_s"] * 1000.0 / max(1, min(workers, cores_per_rank))
    configs, skipped = configurations(cores, args.ranks, bool(info["cuda"]))
    if args.only:
        by_name = {c.name: c for c in configs}
        configs = [by_name[n] for n in dict.fromkeys(args.only.split(",")) if n in by_name]
    intel = intel_runtime_check() if any(c.name == "kmp-disabled" for c in configs) else ""
    rank_args = ["--seconds", str(args.seconds), "--warmup", str(args.warmup), "--batch-size", str(args.batch_size),
                 "--workers", str(workers), "--step-ms", f"{step_ms:.3f}", "--model-steps", str(args.model_steps)]
    print(f"gpu_feed: {args.ranks} rank(s) on {cores} cores, device {info['device']}, {workers} worker(s) per rank, "
          f"batch {args.batch_size}: {info['batch_s'] * 1000:.0f} ms of CPU per batch"
          + ("" if info["cuda"] else f", device step {step_ms:.0f} ms (calibrated wait)"), flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu_feed-") as tmp:
        results = run_all(configs, args, rank_args, os.path.join(tmp, "go"), skipped)
    devices = sorted({r.device for res in results for o in res.outcomes for r in o.ranks})
    report: dict[str, Any] = {
        "device": ", ".join(devices) or str(info["device"]),
        "cores": cores,
        "ranks": args.ranks,
        "configs": [r.to_json() for r in results],
        "skipped": skipped,
        "workers_per_rank": workers,
        "batch_size": args.batch_size,
        "cpu_ms_per_batch": round(info["batch_s"] * 1000.0, 2),
        "device_step_ms": None if info["cuda"] else round(step_ms, 2),
        "seconds": args.seconds,
        "repeats": args.repeats,
        "intel_openmp": intel,
        "ceiling": ceiling_of(results, args, bool(info["cuda"]), step_ms),
        "budget_s": args.budget or None,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "wall_s": round(time.monotonic() - started, 1),
    }
    add_ratios(report["configs"], (report["ceiling"] or {}).get("samples_per_s"))
    print_table(report)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(report, fh, indent=2)
            fh.write("\n")
    if args.png:
        draw_png(report, args.png)


if __name__ == "__main__":
    main()
