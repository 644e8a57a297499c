"""benchmarks/device_check.py's reports: ``device_check.json`` (everything), ``device_check.md`` (for a reader),
and the short summary printed at the end of the run (the device tool returns the output's last 12,000 characters).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from launcher.base.cpulist import format_cpulist

STATUS_MARK = {"ok": "ok", "failed": "**FAILED**", "timeout": "**TIMEOUT**", "skipped": "skipped"}
BIG = ("doctor", "plan", "ranks_seen", "configs", "trials", "log", "sysfs", "live_sysfs", "setaffinity", "by_mode",
       "threads", "rank_lines", "meter", "busy_threads", "idle_threads_not_judged",
       "busy_threads_off_the_comm_cores")  # figures shown in tables below, or left to the JSON


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # a reader never sees half a report


def write_reports(out: Path, meta: dict[str, Any], records: list[dict[str, Any]]) -> None:
    _write(out / "device_check.json", json.dumps({**meta, "steps": records}, indent=1, default=str) + "\n")
    _write(out / "device_check.md", markdown(meta, records))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(_cell(v) for v in row) + " |" for row in rows), ""]


def _pct(value: Any) -> str:
    return f"{100 * value:.0f}%" if isinstance(value, (int, float)) else "-"


def _details(r: dict[str, Any]) -> list[str]:
    f = r["figures"]
    lines: list[str] = []
    if f.get("setaffinity"):
        lines += ["sched_setaffinity: " + "; ".join(
            f"to CPU {a['cpu']}: read back {a.get('read_back')}, ran on {a.get('ran_on')}, takes effect "
            f"{a['takes_effect']}" + (f" ({a['error']})" if a.get("error") else "") for a in f["setaffinity"]), ""]
    for key in ("sysfs", "live_sysfs"):
        if f.get(key):
            s = f[key]
            lines += [f"{key} ({s['fsroot']}): nodes {s['node_dir']}; " + ", ".join(
                f"{n} cpus {v['cpulist']}" for n, v in s["nodes"].items()), f"GPUs {s['gpus']}",
                f"infiniband {s['infiniband']}; net {s['net']}", ""]
    if f.get("plan"):
        lines += _table(["rank", "cpus", "GPU", "PCI", "OMP threads", "loader", "comm"],
                        [[p["local_rank"], format_cpulist(p["cpus"]), p["gpu"], p["gpu_pci"], p["threads"],
                          format_cpulist(p["loader_cpus"]), format_cpulist(p.get("comm_cpus", []))]
                         for p in f["plan"]["ranks"]])
    if f.get("ranks_seen") is not None:
        lines += _table(["rank", "mask", "AFFRUN_CPUS", "GPU", "AFFRUN_GPU_PCI", "NVML PCI", "OMP threads",
                         "OMP main", "OMP team", "workers"],
                        [[x["rank"], x["mask"], x["affrun_cpus"], x["gpu"] or "-", x["gpu_pci"] or "-",
                          x["nvml_pci"] or (x["nvml_error"] or "-")[:40], x["omp_num_threads"], x["omp_main"],
                          " ".join(f"{k}:{v}" for k, v in x["omp_team"].items()), " ".join(x["workers"])]
                         for x in f["ranks_seen"]])
    if f.get("by_mode"):
        lines += _table(["--numa-binding", "mask", "OMP team", "workers", "error"],
                        [[m, v.get("mask"), " ".join(f"{k}:{c}" for k, c in (v.get("omp_team") or {}).items()),
                          " ".join(v.get("workers") or []), v.get("error")] for m, v in f["by_mode"].items()])
    if f.get("configs"):
        lines += _table(["configuration", "samples/s", "of ceiling", "vs affrun", "device wait", "GPU util (NVML)",
                         "migr./s", "worker CPUs", "error"],
                        [[c["name"], c["samples_per_s"], _pct(c.get("vs_ceiling")), c["vs_affrun"],
                          _pct(c["device_wait_fraction"]), c["gpu_util"], c["migrations_per_s"], c["worker_cpus"],
                          c["error"]] for c in f["configs"]])
    if f.get("trials"):
        lines += _table(["options", "batches/s", "vs default", "data wait", "workers", "pruned"],
                        [[" ".join(t["options"]) or "(default)", t["median"], t["vs_default"],
                          _pct(t["data_wait_fraction"]), t["num_workers"], t["pruned"]] for t in f["trials"]])
    if f.get("threads") and isinstance(f["threads"], list):
        for key, title in (("busy_threads", "Judged (used CPU time over the loop)"),
                           ("busy_threads_off_the_comm_cores", "**Off the comm cores**"),
                           ("idle_threads_not_judged", "Not judged (no CPU time over the loop)")):
            if f.get(key):
                lines += [f"{title}:", "", *(f"- `{t}`" for t in f[key]), ""]
        lines += ["Every thread of the rank:", "", *(f"- `{t}`" for t in f["threads"]), ""]
    if f.get("rank_lines"):
        lines += ["```text", *f["rank_lines"], "```", ""]
    small = {k: v for k, v in f.items() if k not in BIG and len(json.dumps(v, default=str)) <= 300}
    lines += [f"- {k}: `{json.dumps(v, default=str)}`" for k, v in small.items()]
    lines += [f"- {k}: (in device_check.json)" for k in f if k not in small and k not in BIG]
    if r["checks"]:
        lines += ["", "Checks: " + ", ".join(f"{k} **{v}**" if v is False else f"{k} {v}" for k, v in r["checks"].items())]
    if r["status"] in ("failed", "timeout") and r["output_tail"]:
        lines += ["", "```text", r["output_tail"][-2500:], "```"]
    return [*lines, ""]


def _verdict(value: Any) -> str:
    return str(value.get("verdict")) if isinstance(value, dict) else "absent"


def feed_table(records: list[dict[str, Any]]) -> list[str]:
    rows = [[r["step"], r["figures"].get("workers"), r["figures"].get("samples_per_s"),
             _pct(r["figures"].get("of_ceiling")),
             ", ".join(f"{u:.0f}%" for u in r["figures"].get("nvml_utilisation") or [] if u is not None) or "-",
             _pct(r["figures"].get("meter_data_wait")), _pct(r["figures"].get("device_wait")),
             _verdict(r["figures"].get("meter_verdict")), _verdict(r["figures"].get("doctor_verdict")),
             "; ".join(r["figures"].get("findings") or [])]
            for r in records if r["step"].startswith("doctor-feed") and r["status"] != "skipped"]
    if not rows:
        return []
    return ["## The feed meter and the verdicts against NVML", "",
            "One rank of benchmarks/gpu_feed_rank.py under `affrun torchrun --feed-json`, sampled by "
            "`affrun doctor --pid --json` (its whole output is in device_check.json); `absent`: this affrun writes "
            "no verdict yet.", "",
            *_table(["step", "workers", "samples/s", "of ceiling", "NVML utilisation", "meter: data wait",
                     "device idle (rank's own)", "meter verdict", "doctor verdict", "findings"], rows)]


def markdown(meta: dict[str, Any], records: list[dict[str, Any]]) -> str:
    env: dict[str, Any] = next((r["figures"] for r in records if r["step"] == "environment" and r["status"] == "ok"), {})
    lines = [f"# affrun GPU validation: {meta['mode']} run, {meta['started']}", "",
             f"Command: `bash benchmarks/device_check.sh {' '.join(meta['argv'])}`; "
             f"{meta.get('wall_s', 0):.0f} s of a {meta['limit_s']:.0f} s limit."]
    if env:
        lines.append(f"Kernel `{env['uname_r']}`, Python {env['python']}, {env['cpu_count']} CPUs "
                     f"(allowed {len(env['allowed_cpus'])}).")
    plan = meta.get("plan") or {}
    if plan:
        lines.append(f"Time plan: each step's share of a {plan['device_limit_s']:.0f} s run on the lent machine, "
                     f"x {plan['scale']:g} here, never past the limit less {plan['margin_s']:.0f} s ('planned s').")
    if meta.get("fake_tree"):
        lines.append(f"Rehearsal: the affrun commands read a fake tree ({meta['fake_tree']}).")
    if meta.get("stopped"):
        lines.append(f"**Stopped**: {meta['stopped']}.")
    lines += ["", "## Steps", "", *_table(["step", "status", "s", "planned s", "result"],
                                          [[r["step"], STATUS_MARK[r["status"]], r["seconds"], r.get("planned_s"),
                                            r["headline"] if r["status"] == "ok" else r["reason"] or r["headline"]]
                                           for r in records])]
    lines += feed_table(records)
    for r in records:
        if r["status"] == "skipped":
            continue
        lines += [f"## {r['step']}", "", f"{r['what']}. **{r['status']}**" + (f": {r['reason']}" if r["reason"] else ""),
                  "", *(f"`{c}`" for c in r["commands"][:3]), "", *_details(r)]
    return "\n".join(lines) + "\n"


def summary(meta: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """The run in a few dozen lines: each step's status, seconds and result."""
    counts = {s: sum(r["status"] == s for r in records) for s in STATUS_MARK}
    lines = ["", f"device_check ({meta['mode']}): {meta.get('wall_s', 0):.0f} s of {meta['limit_s']:.0f}; "
             + ", ".join(f"{n} {s}" for s, n in counts.items() if n)]
    if meta.get("stopped"):
        lines.append(f"STOPPED: {meta['stopped']}")
    for r in records:
        text = r["headline"] if r["status"] == "ok" else r["reason"] or r["headline"]
        lines.append(f"  {r['step']:<22} {r['status']:<8} {r['seconds']:5.1f}/{r.get('planned_s') or 0:3.0f} s  "
                     f"{text[:200]}")
        bad = [k for k, v in r["checks"].items() if v is False]
        if bad:
            lines.append(f"  {'':<22} false checks: {', '.join(bad)}")
    lines.append(f"reports: {meta['out']}/device_check.json, device_check.md")
    return "\n".join(lines)
