"""A tune's result: each trial's repeats and statistics, the best plan (docs/tune.md, "Reading the table"), as a
table, as JSON and as an SVG bar chart drawn with ``affrun show --svg``'s primitives. Pure."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Literal

from launcher.feed.verdict import UNKNOWN, Signals, Verdict, judge
from launcher.show.layout import rank_color
from launcher.show.svg import svg_document, svg_rect, svg_text
from launcher.tune.candidates import Candidate
from launcher.tune.measure import Source

MARGIN = 0.05  # a single repeat beats the default only by more than this
_LABEL_W, _BAR_W, _ROW_H, _MARGIN = 330, 420, 26, 16  # the chart's


@dataclass
class TrialResult:
    candidate: Candidate
    rates: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    workers: tuple[int, ...] = ()
    workers_source: Source | Literal[""] = ""  # "": not measured
    failures: list[str] = field(default_factory=list)
    pruned: str = ""  # why it was not run again ("" while it is)
    cpu_waits: list[float | None] = field(default_factory=list)  # per repeat; None: not measured
    gpu_busies: list[float | None] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        return bool(self.rates)

    def median(self) -> float:
        return statistics.median(self.rates)

    def wait(self) -> float:
        """The median data wait of the repeats (0..1)."""
        return statistics.median(self.waits) if self.waits else 0.0

    def cpu_wait(self) -> float | None:
        """The median CPU wait of the repeats; ``None`` unless every repeat measured it."""
        return _median(self.cpu_waits)

    def gpu_busy(self) -> float | None:
        return _median(self.gpu_busies)

    def verdict(self) -> Verdict | None:
        """The verdict of the median figures (``None`` for a trial not measured)."""
        if not self.measured:
            return None
        return judge(Signals(gpu_busy=self.gpu_busy(), data_wait=self.wait(), cpu_wait=self.cpu_wait()))


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known and len(known) == len(values) else None


def verdict_cell(v: Verdict | None) -> str:
    """A verdict in the table: its kind; without a GPU signal, ``~`` and what the CPU side suggests."""
    if v is None:
        return "-"
    return f"~{v.likely}" if v.kind == UNKNOWN and v.likely else v.kind


@dataclass(frozen=True)
class Best:
    trial: TrialResult
    default_stands: bool
    gain: float  # the best's median over the default's


def beats(trial: TrialResult, default: TrialResult) -> bool:
    """``trial`` is faster than ``default`` beyond the spread of both (by more than :data:`MARGIN` for one repeat)."""
    if not trial.measured or not default.measured:
        return False
    if min(trial.rates) <= max(default.rates):
        return False
    return trial.median() > default.median() * (1 + MARGIN) or (len(trial.rates) > 1 and len(default.rates) > 1)


def best(results: list[TrialResult]) -> Best | None:
    default = next((r for r in results if r.candidate.is_default and r.measured), None)
    measured = [r for r in results if r.measured]
    if default is None or not measured:
        return None
    top = max(measured, key=lambda r: (r.median(), r.candidate.is_default))
    if top is default or not beats(top, default):
        return Best(default, True, 1.0)
    return Best(top, False, top.median() / default.median())


def _ratio(r: TrialResult, default: TrialResult | None) -> float | None:
    if default is None or not r.measured or not default.measured or default.median() <= 0:
        return None
    return r.median() / default.median()


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def table(results: list[TrialResult], workers_how: str) -> str:
    """The table: options, batches/s (median, min, max), data wait, CPU wait, ratio to the default, verdict,
    workers."""
    default = next((r for r in results if r.candidate.is_default), None)
    head = (f"{'trial':<40} {'batches/s':>10} {'min':>9} {'max':>9} {'wait':>6} {'cpu':>5} {'vs default':>10}  "
            f"{'verdict':<17} workers")
    lines = [head]
    for r in results:
        if r.measured:
            ratio = _ratio(r, default)
            workers = ",".join(map(str, r.workers)) or "-"
            extra = f" ({r.workers_source})" if r.workers_source else ""
            lines.append(f"{r.candidate.label():<40} {r.median():>10.1f} {min(r.rates):>9.1f} {max(r.rates):>9.1f} "
                         f"{_percent(r.wait()):>6} {_percent(r.cpu_wait()):>5} "
                         f"{'' if ratio is None else f'{ratio:.2f}x':>10}  {verdict_cell(r.verdict()):<17} "
                         f"{workers}{extra}")
        else:
            why = r.failures[-1] if r.failures else r.pruned or "not run"
            lines.append(f"{r.candidate.label():<40} {'-':>10} {'-':>9} {'-':>9} {'-':>6} {'-':>5} {'-':>10}  "
                         f"{'-':<17} {why}")
    lines.append(f"workers: {workers_how}")
    if any(verdict_cell(r.verdict()).startswith("~") for r in results):
        lines.append("verdict: ~ is what the waits alone suggest: no GPU signal (NVML: pip install affrun[nvml])")
    return "\n".join(lines)


def verdict(chosen: Best | None) -> str:
    if chosen is None:
        return "no trial of the default plan was measured: no advice"
    if chosen.default_stands:
        return "the default stands: no trial beat it beyond the spread"
    return f"best: {' '.join(chosen.trial.candidate.options())} ({chosen.gain:.2f}x the default)"


def to_json(results: list[TrialResult], chosen: Best | None, workers_how: str, stopped: str) -> dict[str, Any]:
    default = next((r for r in results if r.candidate.is_default), None)
    trials = []
    for r in results:
        verdict = r.verdict()
        trials.append({
            "options": r.candidate.options(),
            "default": r.candidate.is_default,
            "batches_per_s": (r.rates[0] if len(r.rates) == 1 else list(r.rates)) if r.rates else None,
            "median": r.median() if r.measured else None,
            "min": min(r.rates) if r.rates else None,
            "max": max(r.rates) if r.rates else None,
            "data_wait_fraction": r.wait() if r.measured else None,
            "cpu_wait_fraction": r.cpu_wait() if r.measured else None,
            "gpu_busy_fraction": r.gpu_busy() if r.measured else None,
            "verdict": None if verdict is None else verdict.to_json(),
            "vs_default": _ratio(r, default),
            "num_workers": list(r.workers),
            "workers_source": r.workers_source or None,
            "failures": list(r.failures),
            "pruned": r.pruned or None,
        })
    best_json = None if chosen is None else {
        "options": chosen.trial.candidate.options(), "default_stands": chosen.default_stands,
        "vs_default": chosen.gain}
    return {"trials": trials, "best": best_json, "workers": workers_how, "stopped": stopped or None}


def chart(results: list[TrialResult], chosen: Best | None, title: str) -> str:
    """The trials as an SVG bar chart: median batches/s, a whisker from the slowest to the fastest repeat."""
    shown = [r for r in results if r.measured]
    top = max((max(r.rates) for r in shown), default=1.0) or 1.0
    scale = _BAR_W / top
    body = [svg_text(_MARGIN, _MARGIN + 14, title, "#1a202c", ' font-weight="bold"')]
    y = _MARGIN + _ROW_H
    default = next((r for r in shown if r.candidate.is_default), None)
    for r in results:
        label = r.candidate.label()
        body.append(svg_text(_MARGIN, y + 16, label, "#1a202c"))
        x0 = _MARGIN + _LABEL_W
        if r.measured:
            cores = r.candidate.loader_cores
            fill = "#cbd5e0" if cores is None else rank_color(cores, r.candidate.workers == 0)
            mark = chosen is not None and chosen.trial is r
            median = r.median()
            body.append(svg_rect(x0, y + 4, max(1.0, median * scale), _ROW_H - 8, fill, "#1a202c" if mark else "#2d3748",
                                 f"{label}: {median:.1f} batches/s (min {min(r.rates):.1f}, max {max(r.rates):.1f}), "
                                 f"data wait {100 * r.wait():.0f}%", 2.5 if mark else 0.8))
            lo, hi = x0 + min(r.rates) * scale, x0 + max(r.rates) * scale
            mid = y + _ROW_H / 2
            body.append(f'<line x1="{lo:g}" y1="{mid:g}" x2="{hi:g}" y2="{mid:g}" stroke="#1a202c" stroke-width="1.5"/>')
            ratio = f"  {median / default.median():.2f}x" if default is not None and default.median() > 0 else ""
            body.append(svg_text(max(hi, x0 + median * scale) + 8, y + 16,
                                 f"{median:.1f}/s  wait {100 * r.wait():.0f}%{ratio}", "#5a6472"))
        else:
            why = r.failures[-1] if r.failures else r.pruned or "not run"
            body.append(svg_text(x0, y + 16, why[:70], "#c05621"))
        y += _ROW_H
    body.append(svg_text(_MARGIN, y + 18, verdict(chosen), "#1a202c", ' font-weight="bold"'))
    width = _MARGIN * 2 + _LABEL_W + _BAR_W + 200
    return svg_document(width, y + _ROW_H + _MARGIN, title, body)
