"""Every thread's home, measured: real DataLoader pipelines (tests/programs/data_pipelines.py: JPEGs decoded by
Pillow, OpenCV decode + blur + resize, a BPE tokenizer in the collate, numpy features through OpenBLAS and
numexpr), 2 ranks with DataLoader workers each (benchmarks/thread_pipelines_rank.py), launched three ways:

  a) affrun torchrun                     (each worker pinned in its rank's CPUs, every pool sized to its CPUs)
  b) torchrun                            (plain: it sets OMP_NUM_THREADS=1 itself when it starts 2+ ranks)
  c) torchrun, OMP_NUM_THREADS=1 only    (the usual advice, exported by the user; the other pools unset)

interleaved (a, b, c, a, b, c, ...) in one run. Each rank counts its own samples per second over the same window
(after a warm-up and a barrier); a run's figure is the ranks' sum. Reports each configuration's median, min and
max, its ratio to (a)'s median, and the ratios of each repeat against (a)'s run of the same repeat; with them, what
each process ran with: threads per worker and per rank (/proc/PID/task), the CPUs of the workers, and the pools
the runtimes report. Reading and caveats: docs/performance.md, "Every thread's home: pools in workers".
Usage: python benchmarks/thread_pipelines.py [--repeats N] [--seconds S] [--pipelines a,b] [--json FILE] [--markdown]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import AFFRUN, PY, ROOT, byte_compile_affrun, clean_env
from thread_pipelines_rank import PIPELINES
from thread_pipelines_report import markdown, summarize, text_tables

sys.path.insert(0, os.path.join(ROOT, "tests", "programs"))
import data_pipelines

RANK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "thread_pipelines_rank.py")
TORCHRUN = [PY, "-m", "torch.distributed.run"]
CONFIGS = {
    "affrun": "a) `affrun torchrun`",
    "torchrun": "b) `torchrun`",
    "torchrun-omp1": "c) `torchrun`, `OMP_NUM_THREADS=1` only",
}
NEEDS = {"image-opencv": "cv2", "tokenizer": "tokenizers", "numpy-blas": "numexpr"}
# What no configuration may inherit from the shell: every pool variable of docs/threads.md (clean_env takes the
# OpenMP, MKL and OpenBLAS ones and affrun's own).
POOL_PREFIXES = ("BLIS_", "NUMEXPR_", "OPENCV_", "RAYON_", "TOKENIZERS_")


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if not k.startswith(POOL_PREFIXES)}
    env.update(extra)
    return env


def launches(ranks: int) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each configuration's launcher and environment; the same script and arguments follow in all three."""
    nproc = ["--standalone", "--nproc-per-node", str(ranks)]  # --standalone: a free port, whatever else runs here
    return {
        "affrun": ([*AFFRUN, "torchrun", *nproc], base_env()),
        "torchrun": ([*TORCHRUN, *nproc], base_env()),
        "torchrun-omp1": ([*TORCHRUN, *nproc], base_env(OMP_NUM_THREADS="1")),
    }


def run_once(argv: list[str], env: dict[str, str], out: str, ranks: int, pipelines: list[str],
             timeout: float) -> dict[str, dict[str, Any]]:
    """One launch: each pipeline's figure and its ranks' reports, or the reason the launch failed (its last error
    line) for every pipeline."""
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=out)
    except subprocess.TimeoutExpired:
        return {p: {"status": "failed", "error": f"timed out after {timeout:g} s"} for p in pipelines}
    paths = [os.path.join(out, f"rank-{r}.json") for r in range(ranks)]
    if proc.returncode != 0 or not all(os.path.exists(p) for p in paths):
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line or "error:" in line] or lines or ["no output"]
        error = f"exit {proc.returncode}: {errors[-1].strip()[:300]}"
        return {p: {"status": "failed", "error": error} for p in pipelines}
    reports = []
    for path in paths:
        with open(path) as fh:
            reports.append(json.load(fh))
    return {p: {"status": "ok", "samples_per_s": sum(r["pipelines"][p]["samples_per_s"] for r in reports),
                "ranks": [r["pipelines"][p] for r in reports]} for p in pipelines}


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "numpy", "cv2", "tokenizers", "numexpr", "PIL", "threadpoolctl"):
        try:
            out[name] = str(__import__(name).__version__)
        except (ImportError, AttributeError):
            out[name] = "missing"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each configuration (default 3)")
    parser.add_argument("--seconds", type=float, default=2.0, help="each rank's measured window (default 2)")
    parser.add_argument("--warmup", type=float, default=1.0, help="each rank's warm-up before the barrier")
    parser.add_argument("--pipelines", default=",".join(PIPELINES),
                        help=f"comma-separated, of {', '.join(PIPELINES)} (default: all)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank (default 2)")
    parser.add_argument("--json", default="", help="write every figure to FILE")
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    args = parser.parse_args()
    chosen = [p for p in args.pipelines.split(",") if p]
    unknown = [p for p in chosen if p not in PIPELINES]
    if unknown or not chosen or args.repeats < 1 or args.seconds <= 0 or args.ranks < 1 or args.workers < 1:
        parser.error(f"--pipelines takes {', '.join(PIPELINES)}; --repeats, --ranks, --workers and --seconds "
                     f"are positive" + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    skipped = {p: f"{NEEDS[p]} is not installed" for p in chosen
               if p in NEEDS and importlib.util.find_spec(NEEDS[p]) is None}
    pipelines = [p for p in chosen if p not in skipped]
    byte_compile_affrun()
    started, load_before = time.monotonic(), os.getloadavg()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {p: {c: [] for c in CONFIGS} for p in pipelines}
    with tempfile.TemporaryDirectory(prefix="thread-pipelines-") as tmp:
        images = os.path.join(tmp, "images")
        data_pipelines.make_images(images, classes=4, per_class=16, shape=(240, 320))
        tokenizer = os.path.join(tmp, "tokenizer.json")
        trained = data_pipelines.make_tokenizer()  # here: no rank has used Rayon before its workers fork
        if trained is not None:
            trained.save(tokenizer)
        timeout = 120 + 10 * len(pipelines) * (args.seconds + args.warmup)
        for repeat in range(args.repeats):
            for config, (argv, env) in launches(args.ranks).items():
                out = tempfile.mkdtemp(dir=tmp)
                script = [RANK, "--pipelines", ",".join(pipelines), "--images", images, "--tokenizer", tokenizer,
                          "--out", out, "--seconds", str(args.seconds), "--warmup", str(args.warmup),
                          "--workers", str(args.workers)]
                for pipeline, result in run_once([*argv, *script], env, out, args.ranks, pipelines, timeout).items():
                    runs[pipeline][config].append(result)
                    figure = f"{result['samples_per_s']:.1f}" if result["status"] == "ok" else result["error"]
                    print(f"  [{repeat + 1}/{args.repeats}] {config:<14} {pipeline:<13} {figure}", flush=True)
    report = {
        "date": datetime.date.today().isoformat(), "command": " ".join(["python", *sys.argv]),
        "cores": len(os.sched_getaffinity(0)), "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()], "wall_s": round(time.monotonic() - started, 1),
        "versions": versions(), "ranks": args.ranks, "workers": args.workers, "seconds": args.seconds,
        "repeats": args.repeats, "configs": CONFIGS, "base": "affrun",
        "pipelines": [{"name": p, "configs": summarize(runs[p], "affrun")} for p in pipelines],
        "skipped": [{"name": p, "reason": reason} for p, reason in skipped.items()],
    }
    print(markdown(report) if args.markdown else text_tables(report))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    if any(c["status"] != "ok" for p in report["pipelines"] for c in p["configs"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
