"""What ``affrun doctor --pid --interval 0.05`` costs the job it samples, as a ratio.

A job (one busy main thread counting loop iterations, plus ``--threads`` idle threads and ``--children`` idle
child processes, so that every sample reads hundreds of threads) reports its count every 50 ms. This process
samples it with the doctor's own sampler (:func:`launcher.doctor.sampling.sample_job`, what ``doctor --pid``
runs after its imports) for ``--window`` seconds, then leaves it alone for as long, ``--repeats`` times, and
compares the job's iterations/s in the two kinds of windows (interleaved: drift hits both alike).

The job and the sampler are pinned to the same CPU (``--cpu``): the sampler's every microsecond is then taken
from the job, an upper bound of the slowdown on a machine whose CPUs are all busy; ``--sampler-cpu`` puts the
sampler on another (the job then loses only what they share: caches, memory, the kernel's locks). The sampler's
CPU time per sample is printed too. The goal: sampled / alone >= 0.97 where the sampler has a CPU of its own.
Usage: python benchmarks/doctor_sampling_cost.py [--threads N] [--sampler-cpu C]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

from _common import PY, ROOT, clean_env

JOB = r"""
import os, sys, threading, time
threads, children = int(sys.argv[1]), int(sys.argv[2])
for _ in range(children):
    if os.fork() == 0:
        time.sleep(3600)
        os._exit(0)
stop = threading.Event()
for _ in range(threads):
    threading.Thread(target=stop.wait, daemon=True).start()
count, next_report = 0, time.monotonic()
while True:
    count += 1
    if count % 2000 == 0 and time.monotonic() >= next_report:
        os.write(1, f"{time.monotonic():.4f} {count}\n".encode())
        next_report += 0.05
"""


class Counts:
    """The job's (time, count) reports, read by a thread."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.points: list[tuple[float, int]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            t, n = line.split()
            with self._lock:
                self.points.append((float(t), int(n)))

    def rate(self, start: float, end: float) -> float:
        """Iterations per second between the first report after ``start`` and the last before ``end``."""
        with self._lock:
            inside = [p for p in self.points if start <= p[0] <= end]
        if len(inside) < 2:
            raise SystemExit("the job reported too little: is it running?")
        (t0, n0), (t1, n1) = inside[0], inside[-1]
        return (n1 - n0) / (t1 - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=6, help="pairs of windows, interleaved")
    parser.add_argument("--window", type=float, default=2.0, help="seconds per window")
    parser.add_argument("--interval", type=float, default=0.05, help="the doctor's --interval")
    parser.add_argument("--threads", type=int, default=300, help="idle threads in the job's main process")
    parser.add_argument("--children", type=int, default=20, help="idle child processes of the job")
    parser.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)), help="the job's CPU")
    parser.add_argument("--sampler-cpu", type=int, default=None, help="the sampler's CPU (default: the job's)")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    from launcher.doctor.sampling import sample_job

    sampler = args.cpu if args.sampler_cpu is None else args.sampler_cpu
    os.sched_setaffinity(0, {sampler})
    job = subprocess.Popen([PY, "-c", JOB, str(args.threads), str(args.children)], env=clean_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
                           preexec_fn=lambda: os.sched_setaffinity(0, {args.cpu}))
    counts = Counts(job)
    try:
        time.sleep(1.0)
        sample_job(job.pid, duration=0.2, interval=args.interval)  # warm: imports, topology, the job's threads
        alone: list[float] = []
        sampled: list[float] = []
        per_sample: list[float] = []
        threads = 0
        for _ in range(args.repeats):
            t0 = time.monotonic()
            time.sleep(args.window)
            alone.append(counts.rate(t0, time.monotonic()))
            t0, cpu0 = time.monotonic(), time.process_time()
            audit = sample_job(job.pid, duration=args.window, interval=args.interval)
            sampled.append(counts.rate(t0, time.monotonic()))
            per_sample.append((time.process_time() - cpu0) / audit.samples)
            threads = sum(len(p.threads) for p in audit.processes)
    finally:
        os.killpg(job.pid, 9)  # the job and its children: a session of their own
        job.wait()
    ratios = [s / a for s, a in zip(sampled, alone)]
    print(f"job: 1 busy thread + {args.threads} idle threads, {args.children} idle children ({threads} threads "
          f"sampled); the job on CPU {args.cpu}, the sampler on CPU {sampler}; {args.repeats} pairs of {args.window:g} s windows, "
          f"--interval {args.interval:g}")
    print(f"iterations/s alone   median {statistics.median(alone):,.0f}")
    print(f"iterations/s sampled median {statistics.median(sampled):,.0f}")
    print(f"ratio sampled/alone  min {min(ratios):.3f}  median {statistics.median(ratios):.3f}  max {max(ratios):.3f}")
    print(f"sampler CPU per sample: median {1000 * statistics.median(per_sample):.2f} ms "
          f"({1e6 * statistics.median(per_sample) / max(threads, 1):.1f} us per thread)")


if __name__ == "__main__":
    main()
