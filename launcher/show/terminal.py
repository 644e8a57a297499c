"""The picture for a terminal: box-drawing characters, optional ANSI 256 colours (``affrun show``)."""

from __future__ import annotations

from launcher.plan.planner import Plan
from launcher.show.drawing import draw
from launcher.show.layout import Block, Frame, Style, ansi_index
from launcher.topology.model import Topology

TERMINAL_WIDTH = 80  # the picture must read on an 80-column terminal

# corners and sides, ┌ ─ ┐ │ └ ┘, of each kind of frame
_BORDERS = {"package": "┏━┓┃┗┛", "numa": "┌─┐│└┘", "cpuless": "┌╌┐╎└┘", "gpu": "╭─╮│╰╯", "group": "┌┈┐┊└┘"}


_FRAME_SGR = {"package": "1", "gpu": "38;5;29", "cpuless": "38;5;244", "group": "38;5;244"}
_SGR = {"disallowed": "38;5;244", "offline": "38;5;244", "dim": "38;5;244", "reserved": "38;5;130", "bold": "1",
        "warn": "1;38;5;208"}  # the ANSI colour of each style's kind (a rank's: its cube colour)


def _sgr(style: Style) -> str:
    if style.kind == "rank":
        return f"48;5;{ansi_index(style.ranks[0], style.loader)};38;5;16"
    return _SGR.get(style.kind, "")


def render_text(block: Block, color: bool) -> str:
    """``block`` as terminal text; ANSI 256 colours when ``color`` (the plan's picture and the live one)."""
    chars = [[" "] * block.w for _ in range(block.h)]
    codes = [[""] * block.w for _ in range(block.h)]

    def put(x: int, y: int, ch: str, code: str) -> None:
        if 0 <= y < block.h and 0 <= x < block.w:
            chars[y][x] = ch
            codes[y][x] = code

    for op in block.placed():
        if isinstance(op, Frame):
            tl, hz, tr, vt, bl, br = tuple(_BORDERS.get(op.kind, _BORDERS["numa"]))
            code = _FRAME_SGR.get(op.kind, "")
            right, bottom = op.x + op.w - 1, op.y + op.h - 1
            for x in range(op.x + 1, right):
                put(x, op.y, hz, code)
                put(x, bottom, hz, code)
            for y in range(op.y + 1, bottom):
                put(op.x, y, vt, code)
                put(right, y, vt, code)
            put(op.x, op.y, tl, code)
            put(right, op.y, tr, code)
            put(op.x, bottom, bl, code)
            put(right, bottom, br, code)
            for i, ch in enumerate(f" {op.title} "):
                put(op.x + 2 + i, op.y, ch, "1" if op.kind in ("package", "numa") else code)
        else:
            n = len(op.text)
            for i, ch in enumerate(op.text):
                style = op.style
                if style.kind == "shared" and color:  # stripes, one per sharing rank
                    k = len(style.ranks)
                    style = Style("rank", (style.ranks[min(i * k // n, k - 1)],))
                put(op.x + i, op.y, ch, _sgr(style))
    lines = []
    for row, crow in zip(chars, codes):
        if not color:
            lines.append("".join(row).rstrip())
            continue
        out, current = [], ""
        for ch, code in zip(row, crow):
            if code != current:
                out.append("\x1b[0m" if current else "")
                out.append(f"\x1b[{code}m" if code else "")
                current = code
            out.append(ch)
        if current:
            out.append("\x1b[0m")
        lines.append("".join(out).rstrip(" "))
    return "\n".join(lines)


def picture(topo: Topology, plan: Plan, color: bool = False, width: int = TERMINAL_WIDTH) -> str:
    """The plan drawn for a terminal ``width`` columns wide; ANSI 256 colours when ``color``."""
    return render_text(draw(topo, plan, max(width, 40), color), color)

