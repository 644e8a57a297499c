"""The GPU-feed benchmark's table (stdout) and bar chart (PNG, with matplotlib from the ``benchmarks`` extra)."""

from __future__ import annotations

from typing import Any


def _num(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def add_ratios(configs: list[dict[str, Any]], ceiling: float | None = None) -> None:
    """Give each configuration ``vs_affrun``: its samples per second over affrun's, measured in the same run
    (``None`` when affrun's run failed), and ``vs_ceiling``: over the device's limit (``None`` without one)."""
    base = next((c["samples_per_s"] for c in configs if c["name"] == "affrun" and c["status"] == "ok"), None)
    for c in configs:
        c["vs_affrun"] = round(c["samples_per_s"] / base, 3) if base else None
        c["vs_ceiling"] = round(c["samples_per_s"] / ceiling, 3) if ceiling else None


def print_table(report: dict[str, Any]) -> None:
    configs = report["configs"]
    print(f"\n{report['ranks']} rank(s), {report['cores']} cores, device {report['device']}; "
          f"{report['workers_per_rank']} DataLoader worker(s) per rank, batch {report['batch_size']}, "
          f"median of {report['repeats']} run(s) of {report['seconds']:g} s")
    if report.get("ceiling"):
        print(f"ceiling: {report['ceiling']['samples_per_s']:.0f} samples/s ({report['ceiling']['source']})")
    print(f"{'configuration':<28} {'samples/s':>10} {'vs affrun':>9} {'of ceiling':>10} {'device wait':>11} "
          f"{'migr./s':>8} {'GPU util':>8} {'worker CPUs':>11}   runs")
    for c in configs:
        ratio = f"{c['vs_affrun']:8.2f}x" if c["vs_affrun"] is not None else f"{'n/a':>9}"
        of = f"{c['vs_ceiling']:10.0%}" if c.get("vs_ceiling") is not None else f"{'n/a':>10}"
        runs = ", ".join("failed" if r is None else f"{r:.0f}" for r in c["runs"])
        util = "n/a" if c["gpu_util"] is None else f"{c['gpu_util']:.0f}%"
        print(f"{c['name']:<28} {c['samples_per_s']:10.0f} {ratio} {of} {c['device_wait_fraction']:10.0%} "
              f"{_num(c['migrations_per_s'], '8.1f'):>8} {util:>8} {c['worker_cpus'] or 'n/a':>11}   {runs}")
        if c["error"]:
            print(f"{'':<28} {c['status']}: {c['error']}")
    for s in report["skipped"]:
        print(f"{s['name']:<28} skipped: {s['reason']}")
    if report.get("intel_openmp"):
        print(f"kmp-disabled: {report['intel_openmp']}")


def draw_png(report: dict[str, Any], path: str) -> None:
    """Two panels side by side: samples per second, and the fraction of time the device waited for data."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("gpu_feed: --png needs matplotlib (pip install '.[benchmarks]')") from None
    configs = report["configs"]
    names = [c["name"] for c in configs]
    failed = [c["status"] == "failed" for c in configs]
    colours = ["#2b7bba" if n.startswith("affrun") else "#9a9a9a" for n in names]
    colours = ["#d62728" if f else col for f, col in zip(failed, colours)]
    extra = len([c for c in configs if c["error"]]) + len(report["skipped"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.45 * len(names) + 1.8 + 0.18 * extra), sharey=True)
    rows = list(range(len(names)))[::-1]  # the first configuration on top
    speeds = [c["samples_per_s"] for c in configs]
    # Whiskers: the slowest and fastest run of each configuration (the bar is the median).
    runs = [[r for r in c["runs"] if r is not None] or [c["samples_per_s"]] for c in configs]
    spread = [[s - min(r) for s, r in zip(speeds, runs)], [max(r) - s for s, r in zip(speeds, runs)]]
    left.barh(rows, speeds, color=colours, xerr=spread, error_kw={"ecolor": "#444444", "capsize": 3, "lw": 1})
    top = max(max(r) for r in runs) if any(speeds) else 1.0
    for y, c, r, f in zip(rows, configs, runs, failed):
        label = "failed" if f else f"{c['samples_per_s']:.0f}"
        left.text(max(r) + top * 0.02, y, label, va="center", fontsize=9)
    left.set_xlim(0, top * 1.2)
    left.set_yticks(rows, names)
    left.set_xlabel("samples per second, all ranks (median; whiskers: min-max)")
    waits = [100.0 * c["device_wait_fraction"] for c in configs]
    right.barh(rows, waits, color=colours)
    for y, w, f in zip(rows, waits, failed):
        right.text(w + 1, y, "failed" if f else f"{w:.0f}%", va="center", fontsize=9)
    right.set_xlim(0, 118)
    right.set_xlabel("device waiting for data, % of the time (lower is better)")
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
        ax.set_axisbelow(True)
    device = report["device"] if report.get("device_step_ms") is None else "no GPU: calibrated device wait"
    fig.suptitle(f"DataLoader-fed training: {report['ranks']} rank(s) on {report['cores']} cores, {device} "
                 f"({report['date']})", fontsize=11)
    notes = [f"{c['name']}: {c['error']}" for c in configs if c["error"]]
    notes += [f"{s['name']}: skipped, {s['reason']}" for s in report["skipped"]]
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=8, va="bottom", color="#555555")
    fig.tight_layout(rect=(0, 0.035 * len(notes) * 6 / max(len(names), 6), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
