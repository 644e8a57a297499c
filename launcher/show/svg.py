"""The picture as SVG (``affrun show --svg``): the boxes as rectangles, one rect per core in its rank's colour, as
a document or inside a self-contained HTML page; and the primitives ``affrun tune --svg`` draws with."""

from __future__ import annotations

from collections.abc import Sequence

from launcher.base.cpulist import format_cpulist
from launcher.plan.planner import Plan
from launcher.show.drawing import draw
from launcher.show.layout import Block, Frame, Text, rank_color
from launcher.topology.model import Topology

TITLE = "affrun show"  # how every picture of affrun show titles itself: a file it wrote before is known by it

SVG_WIDTH = 120  # the SVG has room for a wider layout
_CW, _CH, _MARGIN = 8, 20, 16
_FONT = "ui-monospace, 'DejaVu Sans Mono', Menlo, Consolas, monospace"  # an attribute value in "": no ", &, < or >
_FRAME_STYLE = {  # fill, stroke, dash
    "package": ("#f4f5f7", "#4a5568", ""),
    "numa": ("#ffffff", "#718096", ""),
    "cpuless": ("#f7f7f2", "#a0a08a", "5 3"),
    "gpu": ("#eef8f1", "#2f855a", ""),
    "group": ("#fafafa", "#a0aec0", "2 3"),
}
_CELL_STYLE = {  # fill, stroke, text colour, dash
    "free": ("#ffffff", "#a0aec0", "#4a5568", ""),
    "reserved": ("#fdf3e7", "#c08a4a", "#8a5a1a", "4 2"),
    "disallowed": ("#e2e2e2", "#c4c4c4", "#8a8a8a", ""),
    "offline": ("#f0f0f0", "#c4c4c4", "#a0a0a0", "3 2"),
}
_TEXT_FILL = {"dim": "#5a6472", "bold": "#1a202c", "warn": "#c05621", "plain": "#1a202c"}


def escape(text: str) -> str:
    """``&``, ``<`` and ``>`` as XML entities, as ``xml.sax.saxutils.escape`` writes them."""
    return text.replace("&", "&amp;").replace(">", "&gt;").replace("<", "&lt;")


def svg_text(x: float, y: float, text: str, fill: str, extra: str = "") -> str:
    """A text element (``text`` escaped)."""
    return f'<text x="{x:g}" y="{y:g}" fill="{fill}"{extra}>{escape(text)}</text>'


def svg_rect(x: float, y: float, w: float, h: float, fill: str, stroke: str, title: str = "",
             stroke_width: float = 0.8) -> str:
    """A rounded rectangle, with a tooltip when ``title`` is given."""
    tip = f"<title>{escape(title)}</title>" if title else ""
    return (f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="3" fill="{fill}" stroke="{stroke}"'
            f' stroke-width="{stroke_width:g}">{tip}</rect>')


def svg_document(w_px: float, h_px: float, title: str, body: Sequence[str], defs: Sequence[str] = ()) -> str:
    """The document around ``body``: the font, the title, the definitions and a white background."""
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w_px:g}" height="{h_px:g}" '
            f'viewBox="0 0 {w_px:g} {h_px:g}" font-family="{_FONT}" font-size="13" xml:space="preserve">')
    background = f'<rect x="0" y="0" width="{w_px:g}" height="{h_px:g}" fill="#ffffff"/>'
    return "\n".join([head, f"<title>{escape(title)}</title>", f"<defs>{''.join(defs)}</defs>", background, *body,
                      "</svg>"]) + "\n"


def block_svg(block: Block, title: str) -> str:
    """A laid-out picture as an SVG document; a core a thread strayed to (role ``stray``) gets a thick outline."""
    w_px, h_px = block.w * _CW + 2 * _MARGIN, block.h * _CH + 2 * _MARGIN
    patterns: dict[str, tuple[int, ...]] = {}
    body: list[str] = []
    ops = block.placed()
    frames = [op for op in ops if isinstance(op, Frame)]
    texts = [op for op in ops if isinstance(op, Text)]
    for f in frames:
        fill, stroke, dash = _FRAME_STYLE.get(f.kind, _FRAME_STYLE["numa"])
        x, y = _MARGIN + (f.x + 0.5) * _CW, _MARGIN + (f.y + 0.5) * _CH
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        width_attr = "2" if f.kind == "package" else "1.2"
        body.append(f'<rect class="box {f.kind}" x="{x:g}" y="{y:g}" width="{(f.w - 1) * _CW:g}" '
                    f'height="{(f.h - 1) * _CH:g}" rx="6" fill="{fill}" stroke="{stroke}" '
                    f'stroke-width="{width_attr}"{dash_attr}/>')
        tx = _MARGIN + (f.x + 2) * _CW
        body.append(f'<rect class="tab" x="{tx:g}" y="{_MARGIN + f.y * _CH + 3:g}" width="{(len(f.title) + 2) * _CW:g}" '
                    f'height="{_CH - 6}" rx="3" fill="{fill}" stroke="{stroke}" stroke-width="1"{dash_attr}/>')
        weight = ' font-weight="bold"' if f.kind in ("package", "numa") else ""
        body.append(svg_text(tx + _CW, _MARGIN + f.y * _CH + 14, f.title, "#1a202c", weight))
    for t in texts:
        x, y = _MARGIN + t.x * _CW, _MARGIN + t.y * _CH
        st = t.style
        if st.kind in ("rank", "shared", "free", "reserved", "disallowed", "offline"):
            if st.kind == "rank":
                fill, stroke, ink, dash = rank_color(st.ranks[0], st.loader), "#2d3748", "#000000", "3 2" if st.loader else ""
            elif st.kind == "shared":
                pid = "shared-" + "-".join(map(str, st.ranks))
                patterns[pid] = st.ranks
                fill, stroke, ink, dash = f"url(#{pid})", "#2d3748", "#000000", ""
            else:
                fill, stroke, ink, dash = _CELL_STYLE[st.kind]
            attrs = ""
            if t.core is not None:
                c = t.core
                attrs = (f' class="core {c.role}" data-cpu="{c.cpu}" data-pus="{format_cpulist(c.pus)}"'
                         f' data-ranks="{",".join(map(str, c.ranks))}"')
            elif t.swatch is not None:
                attrs = f' class="swatch" data-rank="{t.swatch}"'
            elif t.gpu is not None:
                attrs = f' class="gpu-rank" data-gpu="{t.gpu}" data-ranks="{",".join(map(str, st.ranks))}"'
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
            stray = t.core is not None and t.core.role == "stray"
            stroke, line = ("#c05621", "2.4") if stray else (stroke, "0.8")
            body.append(f'<rect{attrs} x="{x + 1:g}" y="{y + 2:g}" width="{len(t.text) * _CW - 2:g}" '
                        f'height="{_CH - 4}" rx="3" fill="{fill}" stroke="{stroke}" stroke-width="{line}"{dash_attr}>'
                        f"<title>{escape(_tooltip(t))}</title></rect>")
            label = t.text.strip(" []")
            # On stripes the label gets a white halo so it stays readable.
            halo = ' stroke="#ffffff" stroke-width="3" paint-order="stroke"' if st.kind == "shared" else ""
            if t.core is not None and " " in label:  # CPU id, then the owner marker in bold
                cpu, _, mark = label.partition(" ")
                body.append(f'<text x="{x + len(t.text) * _CW / 2:g}" y="{y + 14:g}" fill="{ink}" text-anchor="middle"'
                            f'{halo}>{escape(cpu)} <tspan font-weight="bold">{escape(mark.strip())}</tspan></text>')
            else:
                body.append(svg_text(x + len(t.text) * _CW / 2, y + 14, label, ink, ' text-anchor="middle"' + halo))
        elif t.text.strip():
            lead = len(t.text) - len(t.text.lstrip(" "))
            weight = ' font-weight="bold"' if st.kind in ("bold", "warn") else ""
            body.append(svg_text(x + lead * _CW, y + 14, t.text.strip(" "), _TEXT_FILL.get(st.kind, "#1a202c"), weight))
    defs = []
    for pid, ranks in patterns.items():
        stripe = 6
        size = stripe * len(ranks)
        rects = "".join(f'<rect x="{i * stripe}" y="0" width="{stripe}" height="{size}" fill="{rank_color(r)}"/>'
                        for i, r in enumerate(ranks))
        defs.append(f'<pattern id="{pid}" patternUnits="userSpaceOnUse" width="{size}" height="{size}" '
                    f'patternTransform="rotate(45)">{rects}</pattern>')
    return svg_document(w_px, h_px, title, body, defs)


def _tooltip(t: Text) -> str:
    if t.core is not None:
        c = t.core
        who = f"ranks {', '.join(map(str, c.ranks))}" if c.ranks else c.role
        return f"core of CPUs {format_cpulist(c.pus)}: {who} ({c.role})"
    if t.swatch is not None:
        return f"rank {t.swatch}"
    return t.text.strip(" []")


def document(block: Block, title: str, html: bool) -> str:
    """A laid-out picture as an SVG document, or inside a self-contained HTML page (``html``: no scripts, no
    external resources): what ``affrun show --svg FILE`` writes."""
    text = block_svg(block, title)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{escape(title)}</title>\n"
        "<style>body{margin:16px;background:#fff;font-family:sans-serif}svg{max-width:100%;height:auto}</style>\n"
        "</head>\n<body>\n" + text + "</body>\n</html>\n"
    ) if html else text


def svg(topo: Topology, plan: Plan, html: bool = False, width: int = SVG_WIDTH) -> str:
    """The plan's picture as an SVG document, or an HTML page (``html``)."""
    return document(draw(topo, plan, width, color=True), f"{TITLE}: {len(plan.ranks)} ranks, mode {plan.mode}", html)
