"""``affrun tune --svg``: the trials as a bar chart (median batches/s, a whisker from the slowest to the fastest
repeat), drawn with ``affrun show --svg``'s primitives (:mod:`launcher.show.svg`) and its rank colours, one colour
per loader-core count. Pure: ``affrun tune`` writes the file."""

from __future__ import annotations

from launcher.show.layout import rank_color
from launcher.show.svg import svg_document, svg_rect, svg_text
from launcher.tune.result import Best, TrialResult, verdict

_LABEL_W, _BAR_W, _ROW_H, _MARGIN = 330, 420, 26, 16


def chart(results: list[TrialResult], chosen: Best | None, title: str) -> str:
    """The SVG document of the trials."""
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
