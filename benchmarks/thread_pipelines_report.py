"""benchmarks/thread_pipelines.py's figures: each configuration's runs summed up (median, min, max, the ratio of
medians to the base configuration and the ratios of each repeat to the base's run of the same repeat), what its
processes ran with (threads per worker and per rank, the workers' CPUs, the pools), and the tables, as text or
markdown."""

from __future__ import annotations

import statistics
from typing import Any

# The pools shown, in order: the runtimes threadpoolctl finds ("openmp:libgomp", "openblas:libscipy_openblas"...,
# shown by library name), OpenCV's, numexpr's, Rayon's size (built at its first parallel use, at RAYON_NUM_THREADS,
# else one thread per CPU it may use), torch's intra-op and inter-op pools.
POOLS = (("cv2", "cv2"), ("numexpr", "numexpr"), ("rayon", "Rayon"), ("torch", "torch"), ("interop", "inter-op"))


def pool_keys(processes: list[dict[str, Any]]) -> list[tuple[str, str]]:
    runtimes = sorted({key for p in processes for key in p["pools"] if ":" in key})
    return [(key, key.split(":", 1)[1]) for key in runtimes] + list(POOLS)


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def pool_values(processes: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Each pool's distinct values over ``processes`` (workers or ranks of every run)."""
    out: dict[str, list[Any]] = {}
    for key, _ in pool_keys(processes):
        seen = {p["pools"].get(key, "-") for p in processes if key in p["pools"]}
        if seen:
            out[key] = sorted(seen, key=str)
    return out


def summarize(runs: dict[str, list[dict[str, Any]]], base: str) -> list[dict[str, Any]]:
    """One summary per configuration, in the order of ``runs``; ratios against ``base`` of the same run."""
    base_runs = runs[base]
    base_ok = [r["samples_per_s"] for r in base_runs if r["status"] == "ok"]
    base_median = statistics.median(base_ok) if base_ok else None
    out = []
    for name, results in runs.items():
        ok = [r for r in results if r["status"] == "ok"]
        values = [r["samples_per_s"] for r in ok]
        median = statistics.median(values) if values else None
        paired = [r["samples_per_s"] / b["samples_per_s"] for r, b in zip(results, base_runs, strict=True)
                  if r["status"] == "ok" and b["status"] == "ok" and b["samples_per_s"] > 0]
        ranks = [rank for r in ok for rank in r["ranks"]]
        workers = [w for rank in ranks for w in rank["workers"]]
        failed = [r["error"] for r in results if r["status"] != "ok"]
        out.append({
            "name": name, "status": "failed" if failed else "ok", "error": failed[0] if failed else None,
            "samples_per_s": round(median, 1) if median is not None else None,
            "min": round(min(values), 1) if values else None, "max": round(max(values), 1) if values else None,
            "runs": [round(v, 1) for v in values],
            "vs_a": round(median / base_median, 3) if median is not None and base_median else None,
            "paired_vs_a": [round(p, 3) for p in paired],
            "worker_threads": spread([w["threads"] for w in workers]),
            "worker_native_threads": spread([w["threads"] - len(w["python_threads"]) for w in workers]),
            "rank_threads": spread([rank["threads"] for rank in ranks]),
            "worker_cpus": sorted({w["cpus"] for w in workers}),
            "rank_cpus": sorted({rank["cpus"] for rank in ranks}),
            "worker_pools": pool_values(workers), "rank_pools": pool_values(ranks),
            "rank_env": {k: sorted({rank["env"][k] for rank in ranks}, key=str) for k in (ranks[0]["env"] if ranks else {})},
        })
    return out


def pools_text(pools: dict[str, list[Any]]) -> str:
    words = []
    for key, label in [(key, key.split(":", 1)[-1]) for key in pools if ":" in key] + list(POOLS):
        if key in pools:
            values = ["unset" if v is None else str(v) for v in pools[key]]
            words.append(f"{label} {'|'.join(values)}")
    return ", ".join(words)


def threads_text(s: dict[str, float] | None) -> str:
    if s is None:
        return "-"
    if s["min"] == s["max"]:
        return f"{s['median']:g}"
    return f"{s['median']:g} ({s['min']:g}-{s['max']:g})"


def rows(report: dict[str, Any]) -> tuple[list[list[str]], list[list[str]]]:
    """The throughput rows and the why rows, one per pipeline and configuration."""
    speed, why = [], []
    for pipeline in report["pipelines"]:
        for c in pipeline["configs"]:
            label = report["configs"][c["name"]]
            if c["samples_per_s"] is None:
                speed.append([pipeline["name"], label, "failed", "", "", "", c["error"] or ""])
            else:
                paired = c["paired_vs_a"]
                span = f"{min(paired):.2f}-{max(paired):.2f}" if paired and c["name"] != report["base"] else ""
                ratio = f"{c['vs_a']:.2f}x" if c["vs_a"] is not None else "-"
                speed.append([pipeline["name"], label, f"{c['samples_per_s']:.0f}", f"{c['min']:.0f}",
                              f"{c['max']:.0f}", ratio, span])
            threads = f"{threads_text(c['worker_threads'])}: {threads_text(c['worker_native_threads'])} native"
            why.append([pipeline["name"], label, threads, threads_text(c["rank_threads"]),
                        " | ".join(c["worker_cpus"]), pools_text(c["worker_pools"])])
    return speed, why


SPEED = ["pipeline", "configuration", "samples/s", "min", "max", "vs (a)", "each repeat vs (a)"]
WHY = ["pipeline", "configuration", "threads per worker: beyond Python's", "threads per rank", "worker CPUs",
       "pools in a worker"]


def heading(report: dict[str, Any]) -> str:
    load = ", ".join(f"{x:g}" for x in report["load_before"])
    return (f"{report['date']}: {report['ranks']} ranks x {report['workers']} DataLoader workers, {report['cores']} "
            f"CPUs, {report['repeats']} interleaved runs of {report['seconds']:g} s per configuration; load average "
            f"before {load}, after {', '.join(f'{x:g}' for x in report['load_after'])}; {report['wall_s']:g} s")


def text_tables(report: dict[str, Any]) -> str:
    lines = [heading(report)]
    for header, body in zip((SPEED, WHY), rows(report), strict=True):
        widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
        lines.append("")
        for r in [header, *body]:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    lines += [f"skipped {s['name']}: {s['reason']}" for s in report["skipped"]]
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    lines = [heading(report)]
    for header, body in zip((SPEED, WHY), rows(report), strict=True):
        lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in r) + " |" for r in body]
    lines += [f"\nSkipped `{s['name']}`: {s['reason']}." for s in report["skipped"]]
    return "\n".join(lines)
