"""``affrun tune`` on a loader-bound and a compute-bound stand-in of a training loop (benchmarks/tune_standin.py),
and, side by side, each one's batches/s under the default plan, under the tuned options and under plain torchrun.

Two measurements per stand-in, in one run:
- the tune's own table (the meter's figures in each trial, median, min and max over ``--repeats``);
- the loop's own count (the stand-in counts its batches after its first second, no meter), ``--repeats`` runs of
  ``--run-seconds`` each, interleaved: ``affrun torchrun`` (the default plan), ``affrun torchrun`` with the tuned
  options, and plain ``torchrun`` (the stand-in's workers are then the 2 a script hard-codes).

    python benchmarks/tune_feed.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

from _common import AFFRUN, PY, ROOT, byte_compile_affrun, clean_env

STANDIN = os.path.join(ROOT, "benchmarks", "tune_standin.py")


def tune(kind: str, nproc: int, trial_seconds: float, repeats: int) -> dict[str, Any]:
    argv = [*AFFRUN, "tune", "--nproc-per-node", str(nproc), "--trial-seconds", str(trial_seconds),
            "--repeats", str(repeats), "--json", STANDIN, "--kind", kind]
    proc = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"affrun tune failed ({proc.returncode}):\n{proc.stderr}")
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def own_rate(argv: list[str]) -> float:
    proc = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{argv} failed ({proc.returncode}):\n{proc.stderr}")
    return float(sum(json.loads(line)["batches_per_s"] for line in lines))  # every rank's line, summed


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}–{max(values):.0f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--trial-seconds", type=float, default=4.0)
    p.add_argument("--run-seconds", type=float, default=6.0)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    byte_compile_affrun()
    rows = []
    for kind in ("loader", "compute"):
        result = tune(kind, args.nproc, args.trial_seconds, args.repeats)
        trials = {tuple(t["options"]): t for t in result["trials"]}
        default = trials[()]
        best = list(result["best"]["options"])
        chosen = trials[tuple(best)]
        script = [STANDIN, "--kind", kind, "--seconds", str(args.run_seconds)]
        commands = {
            "default": [*AFFRUN, "torchrun", "--nproc-per-node", str(args.nproc), *script],
            "tuned": [*AFFRUN, "torchrun", "--nproc-per-node", str(args.nproc), *best, *script],
            "torchrun": [PY, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc), *script],
        }
        own: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeats):
            for name, argv in commands.items():
                own[name].append(own_rate(argv))

        def meter(trial: dict[str, Any]) -> str:
            rates = trial["batches_per_s"]
            return spread(rates if isinstance(rates, list) else [rates])

        rows.append((kind, " ".join(best) or "(the default stands)", meter(default), meter(chosen),
                     spread(own["default"]), spread(own["tuned"]), spread(own["torchrun"]),
                     statistics.median(own["tuned"]) / statistics.median(own["default"])))
    print(f"{args.nproc} rank(s); tune: {args.trial_seconds:g} s trials x {args.repeats}; own count: "
          f"{args.run_seconds:g} s runs x {args.repeats}, interleaved. batches/s: median (min-max)")
    print("| stand-in | tuned options | tune: default | tune: tuned | own count: affrun default | own count: tuned "
          "| own count: plain torchrun | tuned / default |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, best_text, md, mt, od, ot, op, ratio in rows:
        print(f"| {kind}-bound | `{best_text}` | {md} | {mt} | {od} | {ot} | {op} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
