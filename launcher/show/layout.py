"""The picture's vocabulary: frames and texts laid out in character cells (a :class:`Block`), each text with a
:class:`Style` that each renderer maps to its own colours; and the ranks' colours. Pure."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field

# xterm-256 colour cube levels; every rank colour is a cube colour, so the terminal and the SVG agree exactly.
_LEVELS = (0x00, 0x5F, 0x87, 0xAF, 0xD7, 0xFF)
_RANK_CUBE = (
    (1, 3, 5), (5, 3, 1), (2, 4, 2), (4, 2, 4), (5, 4, 1), (1, 4, 4),
    (5, 2, 2), (3, 3, 5), (4, 3, 2), (3, 4, 1), (2, 3, 3), (5, 3, 4),
)  # fmt: skip


def _cube(rank: int, loader: bool) -> tuple[int, int, int]:
    r, g, b = _RANK_CUBE[rank % len(_RANK_CUBE)]
    if loader:  # a lighter tint of the same hue
        r, g, b = min(r + 1, 5), min(g + 1, 5), min(b + 1, 5)
    return r, g, b


def rank_color(rank: int, loader: bool = False) -> str:
    """The ``#rrggbb`` colour of ``rank`` (a lighter tint for its DataLoader cores). Cycles after 12 ranks."""
    return "#" + "".join(f"{_LEVELS[c]:02x}" for c in _cube(rank, loader))


def ansi_index(rank: int, loader: bool) -> int:
    r, g, b = _cube(rank, loader)
    return 16 + 36 * r + 6 * g + b



@dataclass(frozen=True)
class Style:
    """What a piece of text means; each renderer maps it to its own colours."""

    kind: str  # plain dim bold warn rank shared free reserved disallowed offline
    ranks: tuple[int, ...] = ()
    loader: bool = False


PLAIN = Style("plain")
DIM = Style("dim")
BOLD = Style("bold")
WARN = Style("warn")


@dataclass(frozen=True)
class CoreInfo:
    """A core cell's meaning, carried into the SVG as data attributes."""

    cpu: int  # first PU: the core's label
    pus: tuple[int, ...]
    ranks: tuple[int, ...]
    role: str  # compute loader comm shared free reserved disallowed offline


@dataclass(frozen=True)
class Frame:
    x: int
    y: int
    w: int
    h: int
    title: str
    kind: str  # package numa cpuless gpu group


@dataclass(frozen=True)
class Text:
    x: int
    y: int
    text: str
    style: Style
    core: CoreInfo | None = None
    swatch: int | None = None  # legend swatch of this rank
    gpu: int | None = None  # physical index of the GPU this label belongs to


Op = Frame | Text


@dataclass
class Block:
    """A laid-out rectangle of ``w`` x ``h`` character cells: its own ops, relative to its top-left corner, then its
    parts, blocks drawn inside it at an offset (held, not copied: :meth:`placed` copies each op once)."""

    w: int
    h: int
    ops: list[Op] = field(default_factory=list)
    parts: list[tuple[int, int, Block]] = field(default_factory=list)

    def placed(self, dx: int = 0, dy: int = 0) -> list[Op]:
        """Every op of the block and of its parts, in drawing order, moved by ``(dx, dy)``."""
        out: list[Op] = []
        self._place(dx, dy, out)
        return out

    def _place(self, dx: int, dy: int, out: list[Op]) -> None:
        for op in self.ops:
            if isinstance(op, Frame):
                out.append(Frame(op.x + dx, op.y + dy, op.w, op.h, op.title, op.kind))
            else:
                out.append(Text(op.x + dx, op.y + dy, op.text, op.style, op.core, op.swatch, op.gpu))
        for x, y, part in self.parts:
            part._place(dx + x, dy + y, out)


class Grid(Block):
    """``cells`` left to right, ``per`` to a row ``gap`` apart: ``vstack`` of ``hjoin`` rows, sized without placing
    a cell."""

    def __init__(self, cells: Sequence[Block], per: int, gap: int = 1) -> None:
        starts = range(0, len(cells), per)
        widths, heights = [c.w for c in cells], [c.h for c in cells]
        w = max((sum(widths[i : i + per]) + gap * (min(per, len(cells) - i) - 1) for i in starts), default=0)
        super().__init__(w, sum(max(heights[i : i + per]) for i in starts))
        self.cells, self.per, self.gap = cells, per, gap

    def _place(self, dx: int, dy: int, out: list[Op]) -> None:
        y = dy
        for i in range(0, len(self.cells), self.per):
            row = self.cells[i : i + self.per]
            x = dx
            for cell in row:
                cell._place(x, y, out)
                x += cell.w + self.gap
            y += max(c.h for c in row)


def text_line(*parts: tuple[str, Style] | Text) -> Block:
    """One line from segments; a ``Text`` segment keeps its extra meaning (core, swatch, gpu)."""
    ops: list[Op] = []
    x = 0
    for part in parts:
        op = part if isinstance(part, Text) else Text(0, 0, part[0], part[1])
        ops.append(Text(x, 0, op.text, op.style, op.core, op.swatch, op.gpu))
        x += len(op.text)
    return Block(x, 1, ops)


def framed(title: str, inner: Block, kind: str, min_w: int = 0) -> Block:
    w = max(inner.w + 4, len(title) + 5, min_w)
    return Block(w, inner.h + 2, [Frame(0, 0, w, inner.h + 2, title, kind)], [(2, 1, inner)])


def hjoin(blocks: Sequence[Block], gap: int = 1) -> Block:
    parts: list[tuple[int, int, Block]] = []
    x = 0
    for i, b in enumerate(blocks):
        x += gap if i else 0
        parts.append((x, 0, b))
        x += b.w
    return Block(x, max((b.h for b in blocks), default=0), [], parts)


def vstack(blocks: Sequence[Block], gap: int = 0) -> Block:
    parts: list[tuple[int, int, Block]] = []
    y = 0
    for i, b in enumerate(blocks):
        y += gap if i else 0
        parts.append((0, y, b))
        y += b.h
    return Block(max((b.w for b in blocks), default=0), y, [], parts)


def flow(blocks: Sequence[Block], max_w: int, gap: int = 1) -> Block:
    """Left to right while they fit in ``max_w``, then the next row (a block wider than ``max_w`` gets a row)."""
    rows: list[list[Block]] = []
    width = 0
    for b in blocks:
        if rows and width + gap + b.w <= max_w:
            rows[-1].append(b)
            width += gap + b.w
        else:
            rows.append([b])
            width = b.w
    return vstack([hjoin(r, gap) for r in rows])


def wrap(text: str, width: int, style: Style, first: str = "", indent: int = 2) -> list[Block]:
    lines = textwrap.wrap(text, max(width - len(first), 20), subsequent_indent=" " * indent,
                          break_long_words=False, break_on_hyphens=False) or [""]
    out = [text_line((first, WARN if first.startswith("warning") else BOLD), (lines[0], style)) if first
           else text_line((lines[0], style))]
    out += [text_line((" " * len(first) + ln, style)) for ln in lines[1:]]
    return out

