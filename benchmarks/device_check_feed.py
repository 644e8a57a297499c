"""benchmarks/device_check.py's feed steps: the device's ceiling, the meter and doctor against NVML, gpu_feed.py, tune.

* ``ceiling``: one rank of gpu_feed_rank.py ``--ceiling`` (the same model step, one batch already on the device, no
  DataLoader): the device's limit in samples/s with NVML's utilisation meanwhile, the pipeline's CPU cost per batch,
  and the **launch cost** (start to the rank's ready line) that sizes every later launch of the run.
* ``doctor-feed-starved``/``-fed``: one rank fed by 0 or up to 8 workers under ``--feed-json``, audited by
  ``affrun doctor --pid --json``: the meter's data wait and verdict, doctor's verdict for the rank, NVML.
* ``gpu-feed-N``: benchmarks/gpu_feed.py with the step's time as its budget, its configurations in priority order.
* ``tune``: ``affrun tune`` on the same device step within 60 s: tuned/ceiling, tuned/default, and what bounds it.
Every samples/s is also given as a fraction of the ceiling. The verdict keys are read as docs/doctor.md may spell
them (present or not): :func:`verdict_of`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from device_check_run import HERE, Context, Result, json_document, json_lines, nvml_utilisation

FEED_RANK = str(HERE / "gpu_feed_rank.py")
GPU_FEED = str(HERE / "gpu_feed.py")
# gpu_feed.py's configurations in the order they run (most telling first): as many as the step's time holds
GPU_FEED_CONFIGS = ("affrun", "torchrun", "torchrun-collapse", "affrun-loader-cores-1", "torchrun-numa",
                    "kmp-disabled")
REHEARSAL_CONFIGS = GPU_FEED_CONFIGS[:3]
MODEL_STEPS = "8"  # on CUDA: training steps per batch in every feed job, so that a fed GPU is busy
STEP_MS = "20"  # without CUDA: the simulated device's step in the ceiling, doctor-feed and tune jobs
BATCH = 32  # gpu_feed_rank.py's default batch size
GOAL = 0.9  # tuned >= 0.9 x the ceiling, wherever the CPUs can decode that fast


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def pct(value: Any) -> str:
    return f"{100 * value:.0f}%" if isinstance(value, (int, float)) else "n/a"


def _wait_for(path: Path, text: str, proc: Any, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end and proc.poll() is None:
        if path.exists() and text in path.read_text(errors="replace"):
            return True
        time.sleep(0.1)
    return False


def start_timeout(ctx: Context) -> float:
    """Seconds a job may take to its ready line: three times the measured launch cost (at least 30), else 120."""
    launch = ctx.facts.get("launch_s")
    return max(30.0, 3.0 * launch) if isinstance(launch, (int, float)) else 120.0


def of_ceiling(ctx: Context, samples_per_s: Any) -> float | None:
    top = (ctx.facts.get("ceiling") or {}).get("samples_per_s")
    return round(samples_per_s / top, 3) if isinstance(samples_per_s, (int, float)) and top else None


# ------------------------------------------------------------------------------------------------ ceiling
def ceiling_step(ctx: Context) -> Result:
    seconds, warmup = (1.0, 0.5) if ctx.rehearse else (3.0, 1.0)
    argv = ctx.affrun("torchrun", "--nproc-per-node", "1", FEED_RANK, "--ceiling", "--seconds", str(seconds),
                      "--warmup", str(warmup), "--step-ms", STEP_MS, "--model-steps", MODEL_STEPS, "--calibrate", "5")
    res = Result()
    t0 = time.monotonic()
    proc, out, err = ctx.start(argv)
    res.commands.append(" ".join(argv))
    ready = _wait_for(out, '"phase": "ready"', proc, ctx.left() - seconds - 5)
    ready_s = time.monotonic() - t0
    util, nvml = nvml_utilisation(seconds * 0.8) if ready else (None, "the job never got ready")
    job = ctx.finish(proc, out, err, seconds + 60, t0)
    res.output_tail = job.tail()
    final = [r for r in json_lines(job.out) if "samples_per_s" in r]
    res.checks["ceiling_measured"] = bool(final)
    if not final:
        res.status = "timeout" if job.timed_out else "failed"
        res.reason = "the ceiling job reported nothing"
        return res
    r = final[0]
    ceiling = {"samples_per_s": r["samples_per_s"], "device": r["device"], "cuda": r.get("cuda"),
               "batch_s": r.get("batch_s"), "nvml_utilisation": util}
    ready_line = next((r for r in json_lines(job.out) if r.get("phase") == "ready"), {})
    ctx.facts.update(ceiling=ceiling, launch_s=round(ready_s, 1))
    res.figures = {**ceiling, "nvml": nvml, "launch_s": round(ready_s, 1), "job_s": round(job.seconds, 1),
                   "rank_startup": ready_line.get("startup"),
                   "device_wait": r["device_wait_fraction"], "model_steps": MODEL_STEPS,
                   "what": "the model step with one batch already on the device, no DataLoader, no MixUp"}
    res.headline = (f"{r['device']}: {r['samples_per_s']:.0f} samples/s, NVML util "
                    + (", ".join(f"{u:.0f}%" for u in util) if util else "n/a")
                    + f"; launch {ready_s:.1f} s to ready; pipeline {1000 * (r.get('batch_s') or 0):.0f} ms CPU/batch")
    return res.judge(job.rc)


# ------------------------------------------------------------------------------------------------ doctor-feed
def verdict_of(holder: Any) -> dict[str, Any] | None:
    """The verdict ``holder`` carries, however it is spelled (``"verdict": "fed"``, or an object with ``verdict``
    or ``kind``), in itself or in its ``feed``; ``None`` where there is none (before issue 39 landed)."""
    for place in (holder, holder.get("feed") if isinstance(holder, dict) else None):
        value = place.get("verdict") if isinstance(place, dict) else None
        if isinstance(value, str):
            return {"verdict": value}
        if isinstance(value, dict):
            kind = value.get("verdict", value.get("kind"))
            if isinstance(kind, str):
                return {"verdict": kind, **{k: value[k] for k in ("evidence", "fix", "cause")
                                            if isinstance(value.get(k), str)}}
    return None


def finding_line(f: Any) -> str:
    """One doctor finding in a few words: severity, id, and its subject where it has one (docs/doctor.md: the
    ``subject`` key is optional)."""
    if not isinstance(f, dict):
        return str(f)[:200]
    head = f"{f.get('severity', '?')} {f.get('id', '?')}"
    subject = f.get("subject")
    return f"{head}: {subject}" if subject else head


THREAD_VERDICTS = ("home", "strayed", "unplanned")  # a thread's verdict in doctor's JSON, not a rank's


def _dicts(node: Any, depth: int = 0) -> list[dict[str, Any]]:
    """Every object in a JSON document, outermost first (at most 8 levels deep)."""
    if depth > 8:
        return []
    if isinstance(node, dict):
        return [node, *(d for v in node.values() for d in _dicts(v, depth + 1))]
    if isinstance(node, list):
        return [d for v in node for d in _dicts(v, depth + 1)]
    return []


def rank_verdict(doctor: Any, rank: dict[str, Any] | None) -> dict[str, Any] | None:
    """doctor's verdict for ``rank``, wherever its JSON puts it: in the rank's own object (or its ``feed``), else in
    an object naming the rank's pid, else the first rank verdict anywhere (never a thread's home/strayed)."""
    found = verdict_of(rank) if rank is not None else None
    if found is not None:
        return found
    pid = rank.get("pid") if rank is not None else None
    holders = [d for d in _dicts(doctor) if d is not rank and "verdict" in d]
    verdicts = [(d, v) for d in holders if (v := verdict_of(d)) is not None and v["verdict"] not in THREAD_VERDICTS]
    return next((v for d, v in verdicts if pid is not None and d.get("pid") == pid),
                verdicts[0][1] if verdicts else None)


def doctor_figures(doctor: Any) -> dict[str, Any]:
    """What the check keeps of ``affrun doctor --pid --json``: the rank's meter figures and verdict, NVML's
    utilisation per GPU, the findings. Every key is read as optional."""
    if not isinstance(doctor, dict):
        return {"doctor_verdict": None, "meter_data_wait": None, "nvml_utilisation": None, "findings": []}
    procs = doctor.get("processes")
    ranks = [p for p in procs if isinstance(p, dict) and p.get("role") == "rank"] if isinstance(procs, list) else []
    feed = _dict(ranks[0].get("feed")) if ranks else {}
    gpus = _dict(doctor.get("gpus"))
    utils = [g.get("utilisation_mean") for g in gpus.get("gpus") or [] if isinstance(g, dict)]
    verdict = rank_verdict(doctor, ranks[0] if ranks else None)
    findings = doctor.get("findings")
    return {"doctor_verdict": verdict, "meter_data_wait": feed.get("data_wait_fraction"),
            "nvml_utilisation": utils or None, "gpu_report": gpus.get("reason"),
            "findings": [finding_line(f) for f in findings] if isinstance(findings, list) else []}


def meter_record(path: Path) -> dict[str, Any] | None:
    """The rank's object in ``--feed-json``'s file (a list, one object per rank), or ``None``."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    items = doc if isinstance(doc, list) else [doc]
    return next((d for d in items if isinstance(d, dict)), None)


def doctor_feed_step(ctx: Context, starved: bool) -> Result:
    """One rank of gpu_feed_rank.py under ``--feed-json``, 0 workers (starved) or up to 8; ``affrun doctor --pid``
    samples it while it measures."""
    cores = int(ctx.facts.get("cores") or 1)
    workers = 0 if starved else max(1, min(8, cores))
    hook = bool(ctx.facts.get("hook"))
    measure, sample = (4.0, 2.0) if ctx.rehearse else (5.0, 2.5)
    feed_json = ctx.work / f"feed-{'starved' if starved else 'fed'}.json"
    argv = ctx.affrun("torchrun", *(["--feed-json", str(feed_json)] if hook else []), "--nproc-per-node", "1",
                      FEED_RANK, "--seconds", str(measure), "--warmup", "1", "--workers", str(workers),
                      "--step-ms", STEP_MS, "--model-steps", MODEL_STEPS)
    res = Result(figures={"workers": workers, "feed_meter": "on" if hook else "off: no startup hook (install)"})
    t0 = time.monotonic()
    proc, out, err = ctx.start(argv)
    res.commands.append(" ".join(argv))
    doctor: Any = None
    if _wait_for(out, '"phase": "ready"', proc, min(start_timeout(ctx), ctx.left() - measure - 5)):
        time.sleep(1.0)  # the meter writes its live file about once a second
        call = ctx.call(ctx.affrun("doctor", "--pid", str(proc.pid), "--json", "--duration", str(sample),
                                   "--interval", "0.1"), timeout=sample + 30)
        res.commands.append(" ".join(call.argv))
        doctor = json_document(call.out) if call.out.strip() else None
        res.checks["doctor_answered"] = call.rc in (0, 1) and isinstance(doctor, dict)
    job = ctx.finish(proc, out, err, measure + 60, t0)
    res.output_tail = job.tail()
    final = [r for r in json_lines(job.out) if "samples_per_s" in r]
    res.checks["job_reported"] = bool(final)
    res.figures.update(doctor_figures(doctor), doctor=doctor)
    meter = meter_record(feed_json) if hook else None
    res.figures["meter_verdict"] = verdict_of(meter) if meter else None
    res.figures["meter"] = meter
    if hook:
        res.checks["meter_seen_by_doctor"] = res.figures["meter_data_wait"] is not None
    if final:
        res.figures.update(device_wait=final[0]["device_wait_fraction"], samples_per_s=final[0]["samples_per_s"],
                           device=final[0]["device"], of_ceiling=of_ceiling(ctx, final[0]["samples_per_s"]))

    def said(key: str) -> str:
        v = res.figures.get(key)
        return v["verdict"] if isinstance(v, dict) else "absent"

    util = res.figures.get("nvml_utilisation")
    res.headline = (f"{workers} worker(s): {res.figures.get('samples_per_s', 0):.0f} samples/s "
                    f"({pct(res.figures.get('of_ceiling'))} of the ceiling), NVML util "
                    + (", ".join(f"{u:.0f}%" for u in util if u is not None) if util else "n/a")
                    + f"; meter wait {pct(res.figures.get('meter_data_wait'))}, device idle "
                    f"{pct(res.figures.get('device_wait'))}; verdict: meter {said('meter_verdict')}, "
                    f"doctor {said('doctor_verdict')}")
    if job.timed_out:
        res.status, res.reason = "timeout", "the job did not end in time"
    return res.judge(job.rc)


# ------------------------------------------------------------------------------------------------ gpu-feed
def gpu_feed_step(ctx: Context, n: int, extra: list[str]) -> Result:
    """gpu_feed.py at ``n`` ranks (as many as there are whole cores), its launches sized by the step's time: a
    configuration starts only while the time left holds one more launch (the launch cost measured by ``ceiling``,
    then gpu_feed.py's own slowest)."""
    ranks = min(n, int(ctx.facts.get("cores") or 1))
    seconds, warmup = (0.5, 0.2) if ctx.rehearse else (2.0, 1.0)
    order = REHEARSAL_CONFIGS if ctx.rehearse else GPU_FEED_CONFIGS
    launch = ctx.facts.get("launch_s")  # start to ready, one rank; more ranks start a little slower
    estimate = launch * (1 + 0.1 * (ranks - 1)) + seconds + 3 if isinstance(launch, (int, float)) else 0.0
    budget = max(1.0, ctx.left() - 12 - seconds)  # a launch's last window, gpu_feed.py's report and chart
    report_path = ctx.work / f"gpu_feed-{n}.json"
    argv = [ctx.python, GPU_FEED, "--ranks", str(ranks), "--repeats", "1", "--seconds", str(seconds), "--warmup",
            str(warmup), "--only", ",".join(order), "--json", str(report_path), "--budget", f"{budget:.0f}",
            "--launch-estimate", f"{estimate:.1f}", "--start-timeout", f"{start_timeout(ctx):.0f}",
            "--model-steps", MODEL_STEPS]
    ceiling = ctx.facts.get("ceiling") or {}
    if ceiling.get("batch_s"):
        argv += ["--calibration", json.dumps({k: ceiling[k] for k in ("batch_s", "cuda", "device")})]
    if ceiling.get("cuda"):  # without CUDA, gpu_feed.py knows its simulated device's limit exactly
        argv += ["--ceiling-samples-per-s", f"{ceiling['samples_per_s']:.1f}"]
    if ctx.facts.get("matplotlib"):
        argv += ["--png", str(ctx.out / f"gpu_feed-{n}.png")]
    argv += extra
    res = Result(figures={"ranks_requested": n, "ranks": ranks, "budget_s": round(budget), "launch_estimate_s":
                          round(estimate, 1), "order": list(order)})
    call = ctx.call(argv, timeout=ctx.left())
    res.commands.append(" ".join(argv))
    res.output_tail = call.tail()
    if not report_path.exists():
        res.status = "timeout" if call.timed_out else "failed"
        res.reason = "gpu_feed.py wrote no report"
        return res
    report = json.loads(report_path.read_text())
    keep = ("name", "status", "samples_per_s", "vs_affrun", "vs_ceiling", "device_wait_fraction", "gpu_util",
            "migrations_per_s", "worker_cpus", "error", "command", "env")
    res.figures.update({k: report.get(k) for k in ("device", "cores", "workers_per_rank", "cpu_ms_per_batch",
                                                    "device_step_ms", "seconds", "skipped", "intel_openmp",
                                                    "wall_s", "ceiling")},
                       configs=[{k: c.get(k) for k in keep} for c in report["configs"]])
    if ranks > 1 and ceiling.get("cuda"):
        res.figures["ceiling_note"] = "the ceiling of one rank alone on the GPU"
    parts = []
    for c in report["configs"]:
        if c["status"] != "ok":
            parts.append(f"{c['name']} failed")
        else:
            parts.append(f"{c['name']} {c['samples_per_s']:.0f}/s {pct(c.get('vs_ceiling'))} of ceiling"
                         + (f" (workers {c['worker_cpus']})" if "collapse" in c["name"] else ""))
    left_out = [s["name"] for s in report.get("skipped", []) if "out of budget" in s.get("reason", "")]
    res.headline = f"{report['device']}: " + "; ".join(parts) + (f"; not run: {', '.join(left_out)}" if left_out else "")
    res.checks["a_configuration_measured"] = any(c["status"] == "ok" for c in report["configs"])
    return res.judge(call.rc)


# ------------------------------------------------------------------------------------------------ tune
def cpu_bound(batch_s: Any, cpus: int, ceiling_sps: Any) -> dict[str, Any] | None:
    """Whether the CPUs can decode at the ceiling's pace: the pipeline's CPU seconds per batch × the ceiling's
    batches/s against the CPUs there are; ``bound_samples_per_s``: what ``cpus`` CPUs decode at most."""
    if not isinstance(batch_s, (int, float)) or not isinstance(ceiling_sps, (int, float)) or batch_s <= 0 or cpus < 1:
        return None
    need = batch_s * ceiling_sps / BATCH
    return {"cpus_needed": round(need, 2), "cpus": cpus, "cpu_bound": need > cpus,
            "bound_samples_per_s": round(cpus / batch_s * BATCH, 1),
            "text": (f"{1000 * batch_s:.0f} ms of CPU per batch x {ceiling_sps / BATCH:.1f} batches/s at the ceiling"
                     f" = {need:.1f} CPUs " + ("> " if need > cpus else "<= ") + f"the {cpus} there are")}


def tune_judgement(tuned_sps: float | None, ceiling_sps: Any, bound: dict[str, Any] | None) -> str:
    if tuned_sps is None or not isinstance(ceiling_sps, (int, float)) or not ceiling_sps:
        return "not judged: no tuned or ceiling figure"
    if bound is not None and bound["cpu_bound"]:
        top = min(ceiling_sps, bound["bound_samples_per_s"])
        return (f"bounded by the CPUs ({bound['text']}): tuned is {tuned_sps / top:.0%} of the "
                f"{top:.0f} samples/s they can decode")
    reached = tuned_sps >= GOAL * ceiling_sps
    return (f"goal {'met' if reached else 'missed'}: tuned {tuned_sps / ceiling_sps:.0%} of the ceiling "
            f"(goal {GOAL:.0%}" + (f"; {bound['text']}" if bound else "") + ")")


def tune_step(ctx: Context) -> Result:
    trial, warmup, budget = (1.0, 0.5, 40.0) if ctx.rehearse else (2.0, 1.0, 60.0)
    budget = max(5.0, min(budget, ctx.left() - 12))  # tune's own start, the last trial's stop, the sweep
    argv = ctx.affrun("tune", "--nproc-per-node", "1", "--trial-seconds", str(trial), "--warmup-seconds",
                      str(warmup), "--budget", f"{budget:.0f}", "--start-seconds", f"{start_timeout(ctx):.0f}",
                      "--json", "--svg", str(ctx.out / "tune.svg"), FEED_RANK, "--seconds", "100000", "--warmup",
                      "0.5", "--workers", "2", "--step-ms", STEP_MS, "--model-steps", MODEL_STEPS)
    res = Result(figures={"budget_s": round(budget)})
    call = ctx.call(argv, timeout=ctx.left())
    res.commands.append(" ".join(argv))
    res.output_tail = call.tail()
    try:
        doc = json_document(call.out)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        res.status = "timeout" if call.timed_out else "failed"
        res.reason = "affrun tune printed no JSON"
        return res
    keep = ("options", "median", "data_wait_fraction", "vs_default", "num_workers", "workers_source", "pruned",
            "failures")
    trials = [t for t in doc.get("trials") or [] if isinstance(t, dict)]
    measured = [t for t in trials if isinstance(t.get("median"), (int, float))]
    best = _dict(doc.get("best"))
    chosen = next((t for t in measured if t.get("options") == best.get("options")), None) if best else None
    if chosen is None or best.get("default_stands"):
        chosen = next((t for t in measured if not t.get("options")), None)
    tuned = chosen["median"] * BATCH if chosen else None
    default = next((t["median"] * BATCH for t in measured if not t.get("options")), None)
    ceiling = ctx.facts.get("ceiling") or {}
    bound = cpu_bound(ceiling.get("batch_s"), len(ctx.facts.get("allowed_cpus") or []), ceiling.get("samples_per_s"))
    res.figures.update(trials=[{k: t.get(k) for k in keep} for t in trials], best=best, stopped=doc.get("stopped"),
                       workers=doc.get("workers"), tuned_samples_per_s=tuned, default_samples_per_s=default,
                       ceiling_samples_per_s=ceiling.get("samples_per_s"), tuned_vs_ceiling=of_ceiling(ctx, tuned),
                       tuned_vs_default=round(tuned / default, 3) if tuned and default else None, cpu_bound=bound,
                       goal=tune_judgement(tuned, ceiling.get("samples_per_s"), bound))
    res.checks["a_trial_measured"] = bool(measured)
    res.headline = (f"{len(measured)} trial(s) in {budget:.0f} s; "
                    + ("default stands" if best.get("default_stands") else
                       f"best {' '.join(best.get('options') or []) or '?'}")
                    + f": {tuned or 0:.0f} samples/s, {pct(res.figures['tuned_vs_ceiling'])} of the ceiling, "
                    f"{res.figures['tuned_vs_default'] or 0:.2f}x the default; {res.figures['goal']}")
    return res.judge(call.rc)
