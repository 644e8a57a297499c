"""benchmarks/device_check.py's other steps: the machine, the install, the topology and plan, the feed, tune.

Each step takes the run's :class:`~device_check_run.Context` and returns a :class:`~device_check_run.Result`;
what later steps need (CUDA, NVML, the allowed CPUs, the whole cores, the hook) goes into ``ctx.facts``.
The feed steps run benchmarks/gpu_feed_rank.py (a DataLoader-fed training step on the real device, a timed
wait without one) under ``affrun torchrun --feed-report``, audited by ``affrun doctor --pid``; benchmarks/gpu_feed.py
against plain torchrun, ``--numa-binding``, the collapse and ``KMP_AFFINITY=disabled``; and ``affrun tune``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from device_check_run import HERE, Call, Context, Result, json_document, json_lines
from device_check_setup import install

from launcher.base.cpulist import format_cpulist

SETUP = str(HERE / "device_check_setup.py")
FEED_RANK = str(HERE / "gpu_feed_rank.py")
GPU_FEED = str(HERE / "gpu_feed.py")
# gpu_feed.py's configurations the check runs (the affrun variants are its own business); a rehearsal runs the
# first three only (each launch costs 10-20 s on a loaded 2-core machine; tests/system/test_gpu_feed_smoke.py runs all)
GPU_FEED_CONFIGS = ("torchrun", "torchrun-collapse", "affrun", "kmp-disabled", "torchrun-numa", "affrun-loader-cores-1")
MODEL_STEPS = "8"  # on CUDA: training steps per batch in the doctor-feed job, so that a fed GPU is busy


def _document(call: Call, res: Result) -> Any:
    res.commands.append(" ".join(call.argv))
    res.output_tail = call.tail()
    try:
        return json_document(call.out)
    except ValueError:
        return None


def environment_step(ctx: Context) -> Result:
    res = Result()
    fsroot = str(ctx.tree or "/")
    doc = _document(ctx.call([sys.executable, SETUP, "environment", "--fsroot", fsroot], timeout=60), res)
    if not isinstance(doc, dict):
        return Result("failed", "the environment probe printed no JSON", output_tail=res.output_tail)
    res.output_tail = ""
    res.figures = doc
    ctx.facts["sysfs"] = doc["sysfs"]
    sysfs = doc["sysfs"]
    effect = [a.get("takes_effect") for a in doc["setaffinity"]]
    read_back = all(a.get("read_back") == [a["cpu"]] for a in doc["setaffinity"])
    gpus = ", ".join(f"{g['pci']} node {g['numa_node']} cpus {g['local_cpulist']}" for g in sysfs["gpus"]) or "none"
    res.headline = (f"kernel {doc['uname_r']}; {len(sysfs['nodes'])} NUMA node(s); GPU {gpus}; "
                    f"ib {sysfs['infiniband'] or '-'}; sched_setaffinity read back {'yes' if read_back else 'NO'}, "
                    "a bound thread ran inside its mask: " + ("yes" if all(effect) else "NO" if not any(effect) else "partly"))
    return res


def install_step(ctx: Context, carry: Path) -> Result:
    interp = install(ctx.work, carry, timeout=max(10.0, ctx.left() - 30))
    ctx.python = interp.python
    ctx.env.update(interp.env)
    ctx.facts["hook"] = interp.hook
    res = Result(figures={"tier": interp.tier, "python": interp.python, "imports": interp.ok, "hook": interp.hook,
                          "log": interp.log, "carried": interp.carried, "env": interp.env})
    needs_hook = "doctor-feed (its meter), tune"
    res.headline = (f"{interp.tier}: imports {'ok' if interp.ok else 'FAILED'}, startup hook "
                    + ("answers" if interp.hook else f"absent ({needs_hook} need it)"))
    if not interp.ok:
        res.status, res.reason = "failed", "no interpreter imports this checkout's affrun and torch"
    return res


def torch_info_step(ctx: Context) -> Result:
    res = Result()
    doc = _document(ctx.call([ctx.python, SETUP, "torch-info"], timeout=120), res)
    if not isinstance(doc, dict):
        return res.judge(1)
    res.output_tail = ""
    res.figures = doc
    ctx.facts.update(cuda=bool(doc.get("cuda")) and not ctx.rehearse, nvml=bool(doc.get("nvml_gpus")) and not ctx.rehearse,
                     matplotlib=doc["modules"].get("matplotlib", False))
    gpus = doc.get("devices") or []
    res.headline = (f"torch {doc.get('torch', '?')}, CUDA {'yes: ' + ', '.join(gpus) if doc.get('cuda') else 'no'}"
                    + (f", NCCL {doc['nccl']}" if doc.get("nccl") else "")
                    + (f", NVML driver {doc['nvml_driver']}" if doc.get("nvml_driver") else ", no NVML")
                    + f"; numactl {'yes' if doc.get('numactl') else 'no'}; libiomp5 {'yes' if doc.get('libiomp5') else 'no'}")
    return res.judge(0 if "torch" in doc else 1)


def _gpu_rows(topo: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"pci": g["pci"], "numa_node": g["numa_node"], "cpus": format_cpulist(g["cpus"]), "uuid": g.get("uuid")}
            for g in topo.get("gpus", [])]


def topology_step(ctx: Context) -> Result:
    res = Result()
    call = ctx.call(ctx.affrun("topology", "--json"), timeout=60)
    topo = _document(call, res)
    if not isinstance(topo, dict):
        return res.judge(call.rc or 1)
    allowed = frozenset(topo["cpus"])
    ctx.facts["allowed_cpus"] = sorted(allowed)
    ctx.facts["cores"] = sum(1 for core in topo["cores"] if set(core) <= allowed)
    sysfs = {g["pci"]: g for g in ctx.facts.get("sysfs", {}).get("gpus", [])}
    gpus = _gpu_rows(topo)
    res.figures = {"allowed_cpus": format_cpulist(allowed), "whole_cores": ctx.facts["cores"], "gpus": gpus,
                   "numa_nodes": [n["id"] for n in topo["numa_nodes"]], "nics": topo.get("nics"),
                   "warnings": topo.get("warnings"), "source": topo.get("source")}
    # A numa_node of -1 in sysfs leaves affrun to place the GPU by its local_cpulist: any node is then its answer.
    res.checks["gpus_as_sysfs_says"] = (
        sorted(sysfs) == sorted(g["pci"] for g in gpus)
        and all(sysfs[g["pci"]]["numa_node"] in ("-1", str(g["numa_node"])) for g in gpus))
    res.headline = (f"{ctx.facts['cores']} whole cores, CPUs {format_cpulist(allowed)}; GPUs "
                    + (", ".join(f"{g['pci']} node {g['numa_node']} cpus {g['cpus']}" for g in gpus) or "none"))
    return res.judge(call.rc)


def topology_nvml_step(ctx: Context) -> Result:
    res = Result()
    call = ctx.call(ctx.affrun("topology", "--json", "--nvml"), timeout=60)
    topo = _document(call, res)
    if not isinstance(topo, dict):
        return res.judge(call.rc or 1)
    gpus = _gpu_rows(topo)
    nvml_warnings = [w for w in topo.get("warnings", []) if "NVML" in w]
    res.figures = {"gpus": gpus, "nvml_warnings": nvml_warnings}
    res.checks = {"every_gpu_has_an_nvml_uuid": bool(gpus) and all(g["uuid"] for g in gpus),
                  "nvml_agrees_with_sysfs": not nvml_warnings}
    res.headline = ", ".join(f"{g['pci']} {g['uuid']}" for g in gpus) + (f"; {nvml_warnings}" if nvml_warnings else "")
    return res.judge(call.rc)


def plan_step(ctx: Context, ranks: int = 8) -> Result:
    res = Result()
    where = ["--fsroot", str(ctx.plan_tree)] if ctx.plan_tree else []
    call = ctx.call(ctx.affrun("plan", *where, "--json", "--nproc-per-node", str(ranks)), timeout=60)
    plan = _document(call, res)
    if not isinstance(plan, dict):
        return res.judge(call.rc or 1)
    if ctx.plan_tree:
        res.figures["machine"] = "rehearsal: a fake 16-core, one-GPU tree shaped like the lent machine"
    res.figures["plan"] = plan
    cpus = [r["cpus"] for r in plan["ranks"]]
    res.checks["cpus_disjoint"] = sum(map(len, cpus)) == len({c for r in cpus for c in r})
    res.headline = " ".join(f"{r['local_rank']}:{format_cpulist(r['cpus'])}/gpu {r['gpu'] if r['gpu'] is not None else '-'}"
                            for r in plan["ranks"])
    return res.judge(call.rc)


def _wait_for(path: Path, text: str, proc: Any, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end and proc.poll() is None:
        if path.exists() and text in path.read_text(errors="replace"):
            return True
        time.sleep(0.2)
    return False


def doctor_feed_step(ctx: Context, starved: bool) -> Result:
    """One rank of gpu_feed_rank.py under ``--feed-report``, 0 workers (starved) or up to 8; ``affrun doctor --pid``
    samples it while it measures: the meter's data wait, NVML's utilisation, the rank's own device-idle share."""
    cores = int(ctx.facts.get("cores") or 1)
    workers = 0 if starved else max(1, min(8, cores))
    hook = bool(ctx.facts.get("hook"))
    measure = 8.0
    argv = ctx.affrun("torchrun", *(["--feed-report"] if hook else []), "--nproc-per-node", "1", FEED_RANK,
                      "--seconds", str(measure), "--warmup", "1", "--workers", str(workers), "--step-ms", "20",
                      "--model-steps", MODEL_STEPS)
    res = Result(figures={"workers": workers, "feed_meter": "on" if hook else "off: no startup hook (install)"})
    t0 = time.monotonic()
    proc, out, err = ctx.start(argv)
    res.commands.append(" ".join(argv))
    doctor: Any = None
    if _wait_for(out, '"phase": "ready"', proc, min(180.0, ctx.left() - 20)):
        time.sleep(1.5)  # the meter writes its live file about once a second
        call = ctx.call(ctx.affrun("doctor", "--pid", str(proc.pid), "--json", "--duration", "3", "--interval", "0.1"),
                        timeout=60)
        res.commands.append(" ".join(call.argv))
        doctor = json_document(call.out) if call.out.strip() else None
        res.checks["doctor_answered"] = call.rc in (0, 1) and isinstance(doctor, dict)
    job = ctx.finish(proc, out, err, measure + 90, t0)
    res.output_tail = job.tail()
    final = [r for r in json_lines(job.out) if "samples_per_s" in r]
    res.checks["job_reported"] = bool(final)
    if isinstance(doctor, dict):
        ranks = [p for p in doctor.get("processes", []) if p.get("role") == "rank"]
        feed = (ranks[0].get("feed") or {}) if ranks else {}
        utils = [g.get("utilisation_mean") for g in (doctor.get("gpus") or {}).get("gpus", [])]
        res.figures.update(meter_data_wait=feed.get("data_wait_fraction"), nvml_utilisation=utils or None,
                           gpu_report=(doctor.get("gpus") or {}).get("reason"),
                           findings=[f"{f['severity']} {f['id']}: {f['subject']}" for f in doctor.get("findings", [])],
                           doctor=doctor)
        if hook:
            res.checks["meter_seen_by_doctor"] = feed.get("data_wait_fraction") is not None
    if final:
        res.figures.update(device_wait=final[0]["device_wait_fraction"], samples_per_s=final[0]["samples_per_s"],
                           device=final[0]["device"])

    def pct(v: Any) -> str:
        return "n/a" if not isinstance(v, (int, float)) else f"{100 * v:.0f}%"

    util = res.figures.get("nvml_utilisation")
    res.headline = (f"{workers} worker(s): meter wait {pct(res.figures.get('meter_data_wait'))}, device idle "
                    f"{pct(res.figures.get('device_wait'))}, NVML util "
                    + (", ".join(f"{u:.0f}%" for u in util if u is not None) if util else "n/a")
                    + f", {res.figures.get('samples_per_s', 0):.0f} samples/s")
    if job.timed_out:
        res.status, res.reason = "timeout", "the job did not end in time"
    return res.judge(job.rc)


def gpu_feed_step(ctx: Context, n: int, extra: list[str]) -> Result:
    ranks = min(n, int(ctx.facts.get("cores") or 1))
    seconds, warmup = ("0.5", "0.2") if ctx.rehearse else ("2", "1")
    only = GPU_FEED_CONFIGS[:3] if ctx.rehearse else GPU_FEED_CONFIGS
    report_path = ctx.work / f"gpu_feed-{n}.json"
    argv = [ctx.python, GPU_FEED, "--ranks", str(ranks), "--repeats", "1", "--seconds", seconds, "--warmup", warmup,
            "--only", ",".join(only), "--json", str(report_path), *extra]
    if ctx.facts.get("matplotlib"):
        argv += ["--png", str(ctx.out / f"gpu_feed-{n}.png")]
    res = Result(figures={"ranks_requested": n, "ranks": ranks})
    call = ctx.call(argv, timeout=420)
    res.commands.append(" ".join(argv))
    res.output_tail = call.tail()
    if not report_path.exists():
        res.status = "timeout" if call.timed_out else "failed"
        res.reason = "gpu_feed.py wrote no report"
        return res
    report = json.loads(report_path.read_text())
    keep = ("name", "status", "samples_per_s", "vs_affrun", "device_wait_fraction", "gpu_util", "migrations_per_s",
            "worker_cpus", "error", "command", "env")
    res.figures.update({k: report[k] for k in ("device", "cores", "workers_per_rank", "cpu_ms_per_batch",
                                                "device_step_ms", "seconds", "skipped", "intel_openmp", "wall_s")},
                       configs=[{k: c.get(k) for k in keep} for c in report["configs"]])
    parts = []
    for c in report["configs"]:
        if c["status"] != "ok":
            parts.append(f"{c['name']} failed")
        elif c["name"] == "affrun":
            parts.append(f"affrun {c['samples_per_s']:.0f}/s wait {100 * c['device_wait_fraction']:.0f}%")
        else:
            parts.append(f"{c['name']} {c['vs_affrun']}x" + (f" (workers {c['worker_cpus']})" if "collapse" in c["name"] else ""))
    res.headline = f"{report['device']}: " + "; ".join(parts)
    return res.judge(call.rc)


def tune_step(ctx: Context) -> Result:
    trial, budget = ("1", "40") if ctx.rehearse else ("3", "60")
    svg = ["--svg", str(ctx.out / "tune.svg")]
    argv = ctx.affrun("tune", "--nproc-per-node", "1", "--trial-seconds", trial, "--warmup-seconds", "1", "--budget",
                      budget, "--start-seconds", "90", "--json", *svg, FEED_RANK, "--seconds", "100000", "--warmup",
                      "0.5", "--workers", "2", "--step-ms", "20")
    res = Result()
    call = ctx.call(argv, timeout=float(budget) + 150)
    doc = _document(call, res)
    if not isinstance(doc, dict):
        res.status = "timeout" if call.timed_out else "failed"
        res.reason = "affrun tune printed no JSON"
        return res
    keep = ("options", "median", "data_wait_fraction", "vs_default", "num_workers", "workers_source", "pruned",
            "failures")
    res.figures = {"trials": [{k: t.get(k) for k in keep} for t in doc["trials"]], "best": doc.get("best"),
                   "stopped": doc.get("stopped"), "workers": doc.get("workers")}
    measured = [t for t in doc["trials"] if t.get("median") is not None]
    best = doc.get("best") or {}
    res.checks["a_trial_measured"] = bool(measured)
    res.headline = (f"{len(measured)} trial(s) measured; "
                    + ("default stands" if best.get("default_stands") else
                       f"best {' '.join(best.get('options') or []) or '?'} ({best.get('vs_default') or 0:.2f}x the default)"))
    return res.judge(call.rc)
