"""The picture of a plan for people (``affrun show``).

Every package, NUMA node and core is a box; each core is coloured by the rank that owns it, GPUs sit beside
their NUMA node, then come a legend and the warnings. One layout, in character cells, feeds two renderers:
the terminal (box-drawing characters, optional ANSI 256 colours) and SVG (the same boxes as rectangles, the
same colours). Everything here is a pure function of ``(Topology, Plan)``; only :func:`write_map` writes a file.
Standard library only.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

from launcher.cpulist import format_cpulist
from launcher.plan import Plan
from launcher.topology.model import GPU, Core, NumaNode, Topology

__all__ = ["html_page", "picture", "rank_color", "svg", "write_map"]

TERMINAL_WIDTH = 80  # the picture must read on an 80-column terminal
SVG_WIDTH = 120  # the SVG has room for a wider layout
SHARED_LABEL_MAX = 5  # "0+1", "0-3", "0+2+4"; longer sharer sets get an alias (S1, S2, ...)

# ------------------------------------------------------------------------------------------------ colours
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


def _ansi_index(rank: int, loader: bool) -> int:
    r, g, b = _cube(rank, loader)
    return 16 + 36 * r + 6 * g + b


# ------------------------------------------------------------------------------------------------ layout model
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
    role: str  # compute loader shared free reserved disallowed offline


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
    """A laid-out rectangle of ``w`` x ``h`` character cells; ops are relative to its top-left corner."""

    w: int
    h: int
    ops: list[Op] = field(default_factory=list)

    def placed(self, dx: int, dy: int) -> list[Op]:
        out: list[Op] = []
        for op in self.ops:
            if isinstance(op, Frame):
                out.append(Frame(op.x + dx, op.y + dy, op.w, op.h, op.title, op.kind))
            else:
                out.append(Text(op.x + dx, op.y + dy, op.text, op.style, op.core, op.swatch, op.gpu))
        return out


def _line(*parts: tuple[str, Style] | Text) -> Block:
    """One line from segments; a ``Text`` segment keeps its extra meaning (core, swatch, gpu)."""
    ops: list[Op] = []
    x = 0
    for part in parts:
        op = part if isinstance(part, Text) else Text(0, 0, part[0], part[1])
        ops.append(Text(x, 0, op.text, op.style, op.core, op.swatch, op.gpu))
        x += len(op.text)
    return Block(x, 1, ops)


def _box(title: str, inner: Block, kind: str, min_w: int = 0) -> Block:
    w = max(inner.w + 4, len(title) + 5, min_w)
    return Block(w, inner.h + 2, [Frame(0, 0, w, inner.h + 2, title, kind), *inner.placed(2, 1)])


def _hjoin(blocks: Sequence[Block], gap: int = 1) -> Block:
    ops: list[Op] = []
    x = 0
    for i, b in enumerate(blocks):
        x += gap if i else 0
        ops += b.placed(x, 0)
        x += b.w
    return Block(x, max((b.h for b in blocks), default=0), ops)


def _vstack(blocks: Sequence[Block], gap: int = 0) -> Block:
    ops: list[Op] = []
    y = 0
    for i, b in enumerate(blocks):
        y += gap if i else 0
        ops += b.placed(0, y)
        y += b.h
    return Block(max((b.w for b in blocks), default=0), y, ops)


def _flow(blocks: Sequence[Block], max_w: int, gap: int = 1) -> Block:
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
    return _vstack([_hjoin(r, gap) for r in rows])


def _wrap(text: str, width: int, style: Style, first: str = "", indent: int = 2) -> list[Block]:
    lines = textwrap.wrap(text, max(width - len(first), 20), subsequent_indent=" " * indent,
                          break_long_words=False, break_on_hyphens=False) or [""]
    out = [_line((first, WARN if first.startswith("warning") else BOLD), (lines[0], style)) if first
           else _line((lines[0], style))]
    out += [_line((" " * len(first) + ln, style)) for ln in lines[1:]]
    return out


# ------------------------------------------------------------------------------------------------ the model
@dataclass(frozen=True)
class _GpuEntry:
    gpu: GPU
    visible: int | None  # visible index, None when CUDA_VISIBLE_DEVICES & co hide it
    ranks: tuple[int, ...]
    note: str  # how the GPU's place was decided, when it is not its own NUMA node


class _Model:
    """Who owns what, computed once from (Topology, Plan)."""

    def __init__(self, topo: Topology, plan: Plan) -> None:
        self.topo = topo
        self.plan = plan
        self.reserved = frozenset(plan.reserved)
        self.owners: dict[int, set[int]] = {}
        self.loader: dict[int, set[int]] = {}
        for r in plan.ranks:
            for p in r.cpus:
                self.owners.setdefault(p, set()).add(r.local_rank)
            for p in r.loader_cpus:
                self.loader.setdefault(p, set()).add(r.local_rank)
        self.shared_alias: dict[tuple[int, ...], str] = {}
        self.cores = list(topo.cores)
        self.offline = sorted(topo.offline)
        self.core_marks = {c.pus[0]: self._mark(c) for c in self.cores}
        markers = [m for m, _, _ in self.core_marks.values()] + (["-"] if self.offline else [])
        self.marker_w = max((len(m) for m in markers), default=1)
        ids = [c.pus[0] for c in self.cores] + self.offline
        self.id_w = max((len(str(i)) for i in ids), default=1)
        self.cpu_nodes = self._cpu_nodes()
        self.gpus = self._gpus()
        self.attached, self.memory_of, self.loose_gpus, self.loose_nodes = self._attachments()

    # --- cores
    def _mark(self, core: Core) -> tuple[str, Style, CoreInfo]:
        ranks = tuple(sorted({r for p in core.pus for r in self.owners.get(p, ())}))
        first = core.pus[0]
        if not ranks:
            if not self.reserved.isdisjoint(core.pus):
                return "r", Style("reserved"), CoreInfo(first, core.pus, (), "reserved")
            if any(p in self.topo.allowed for p in core.pus):
                return ".", Style("free"), CoreInfo(first, core.pus, (), "free")
            return "x", Style("disallowed"), CoreInfo(first, core.pus, (), "disallowed")
        if len(ranks) == 1:
            r = ranks[0]
            mine = [p for p in core.pus if r in self.owners.get(p, ())]
            loader = all(r in self.loader.get(p, ()) for p in mine)
            role = "loader" if loader else "compute"
            return f"{r}L" if loader else str(r), Style("rank", ranks, loader), CoreInfo(first, core.pus, ranks, role)
        return self.shared_label(ranks), Style("shared", ranks), CoreInfo(first, core.pus, ranks, "shared")

    def shared_label(self, ranks: tuple[int, ...]) -> str:
        runs: list[str] = []
        i = 0
        while i < len(ranks):
            j = i
            while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
                j += 1
            runs.append(str(ranks[i]) if i == j else f"{ranks[i]}{'+' if j == i + 1 else '-'}{ranks[j]}")
            i = j + 1
        label = "+".join(runs)
        if len(label) <= SHARED_LABEL_MAX:
            return label
        if ranks not in self.shared_alias:
            self.shared_alias[ranks] = f"S{len(self.shared_alias) + 1}"
        return self.shared_alias[ranks]

    def cell(self, core: Core, color: bool) -> Text:
        marker, style, info = self.core_marks[core.pus[0]]
        return self._cell(info.cpu, marker, style, info, color)

    def offline_cell(self, cpu: int, color: bool) -> Text:
        return self._cell(cpu, "-", Style("offline"), CoreInfo(cpu, (cpu,), (), "offline"), color)

    def _cell(self, cpu: int, marker: str, style: Style, info: CoreInfo, color: bool) -> Text:
        body = f"{cpu:>{self.id_w}} {marker:<{self.marker_w}}"
        # Coloured cells are the colour block itself; plain ones need brackets to read as boxes.
        text = f" {body} " if color and style.kind in ("rank", "shared") else f"[{body}]"
        return Text(0, 0, text, style, core=info)

    # --- nodes and GPUs
    def _cpu_nodes(self) -> list[int | None]:
        first: dict[int | None, int] = {}
        for c in self.cores:
            first.setdefault(c.numa_node, c.pus[0])
        return sorted(first, key=lambda n: first[n])

    def _gpus(self) -> list[_GpuEntry]:
        vis = self.topo.visible
        visible_of = {g.index: i for i, g in enumerate(self.topo.gpus)} if vis is None else {p: i for i, p in enumerate(vis)}
        out = []
        for g in self.topo.gpus:
            v = visible_of.get(g.index)
            ranks = tuple(r.local_rank for r in self.plan.ranks if v is not None and r.gpu == v)
            out.append(_GpuEntry(g, v, ranks, ""))
        return out

    def _nearest_cpu_node(self, node_id: int) -> int | None:
        node = self.topo.node(node_id)
        dist = node.distances if node else {}
        known = [n for n in self.cpu_nodes if n is not None and n in dist]
        if not known:
            return None
        return min(known, key=lambda n: (dist[n], self.cpu_nodes.index(n)))

    def _gpu_anchor(self, g: GPU) -> tuple[int | None, str]:
        if g.numa_node is not None and g.numa_node in self.cpu_nodes:
            return g.numa_node, ""
        if g.numa_node is not None:
            near = self._nearest_cpu_node(g.numa_node)
            return near, f"on NUMA {g.numa_node}, which has no online CPUs"
        if g.cpus and not g.cpus >= self.topo.online:
            overlap = {n: sum(1 for c in self.cores if c.numa_node == n for p in c.pus if p in g.cpus)
                       for n in self.cpu_nodes}
            best = max(self.cpu_nodes, key=lambda n: (overlap[n], -self.cpu_nodes.index(n)))
            if overlap[best] > 0:
                return best, f"no NUMA id; local CPUs {format_cpulist(g.cpus)}"
        return None, "unknown NUMA locality"

    def _attachments(
        self,
    ) -> tuple[dict[int | None, list[_GpuEntry | NumaNode]], dict[int, _GpuEntry], list[_GpuEntry], list[NumaNode]]:
        attached: dict[int | None, list[_GpuEntry | NumaNode]] = {}
        loose_gpus: list[_GpuEntry] = []
        memory_of: dict[int, _GpuEntry] = {}
        for i, entry in enumerate(self.gpus):
            anchor, note = self._gpu_anchor(entry.gpu)
            entry = _GpuEntry(entry.gpu, entry.visible, entry.ranks, note)
            self.gpus[i] = entry
            if entry.gpu.memory_node is not None:
                memory_of[entry.gpu.memory_node] = entry
            if anchor is None and note:
                loose_gpus.append(entry)
            else:
                attached.setdefault(anchor, []).append(entry)
        loose_nodes: list[NumaNode] = []
        for node in self.topo.numa_nodes:
            if node.os_index in self.cpu_nodes or node.os_index in memory_of:
                continue  # drawn with its cores, or inside its GPU's row
            if node.cpus:  # CPUs that are all offline: still a node with CPUs, shown by its own box
                attached.setdefault(node.os_index, [])
                loose_nodes.append(node)
                continue
            near = self._nearest_cpu_node(node.os_index)
            if near is None:
                loose_nodes.append(node)
            else:
                attached.setdefault(near, []).append(node)
        return attached, memory_of, loose_gpus, loose_nodes


# ------------------------------------------------------------------------------------------------ drawing
def _memory(node: NumaNode | None) -> str:
    if node is None or not node.memory_kb:
        return ""
    gib = node.memory_kb / (1024 * 1024)
    return f" · {gib:.0f} GiB" if gib >= 10 else f" · {gib:.1f} GiB"


def _rank_text(ranks: Sequence[int], color: bool, model: _Model) -> Text:
    if not ranks:
        return Text(0, 0, "no rank", DIM)
    label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {model.shared_label(tuple(ranks))}"
    text = f" {label} " if color else f"[{label}]"
    return Text(0, 0, text, Style("rank" if len(ranks) == 1 else "shared", tuple(ranks)))


def _gpu_box(model: _Model, entry: _GpuEntry, color: bool) -> Block:
    """The GPU's box (all GPU boxes share one width so they line up), with its CPU-less memory node beside it."""
    width = max(_gpu_alone(model, e, color).w for e in model.gpus)
    box = _gpu_alone(model, entry, color, width)
    g = entry.gpu
    if g.memory_node is None:
        return box
    mem = model.topo.node(g.memory_node)
    owner = f"GPU {entry.visible}" if entry.visible is not None else f"GPU PCI #{g.index}"
    return _hjoin([box, _box(f"NUMA {g.memory_node} · no CPUs", _line((f"{owner} memory{_memory(mem)}", DIM)), "cpuless")])


def _gpu_alone(model: _Model, entry: _GpuEntry, color: bool, min_w: int = 0) -> Block:
    g = entry.gpu
    if entry.visible is None:
        title = f"GPU (PCI #{g.index}, not visible)"
    elif entry.visible != g.index:
        title = f"GPU {entry.visible} · {g.vendor} · PCI #{g.index}"
    else:
        title = f"GPU {entry.visible} · {g.vendor}"
    rank = _rank_text(entry.ranks, color, model)
    lines = [_line(Text(0, 0, g.pci, PLAIN, gpu=g.index), (" ", PLAIN), Text(0, 0, rank.text, rank.style, gpu=g.index))]
    if entry.note:
        lines.append(_line((entry.note, DIM)))
    return _box(title, _vstack(lines), "gpu", min_w)


def _cpuless_box(node: NumaNode) -> Block:
    what = "memory only" if not node.cpus else f"CPUs {format_cpulist(node.cpus)} offline"
    return _box(f"NUMA {node.os_index} · no CPUs" if not node.cpus else f"NUMA {node.os_index}",
                _line((what + _memory(node), DIM)), "cpuless")


def _attach_blocks(model: _Model, node: int | None, color: bool) -> list[Block]:
    out = []
    for item in model.attached.get(node, []):
        if isinstance(item, _GpuEntry):
            out.append(_gpu_box(model, item, color))
        elif item.os_index not in model.cpu_nodes:
            out.append(_cpuless_box(item))
    return out


def _cell_grid(model: _Model, cores: Sequence[Core], per_row: int, color: bool) -> Block:
    per = max(min(per_row, len(cores)), 1)
    # Prefer full rows: the largest count that divides the cores evenly, if it costs at most a third of the row.
    even = [p for p in range(per, 0, -1) if len(cores) % p == 0 and 3 * p >= 2 * per]
    per = even[0] if even else per
    lines = []
    for i in range(0, len(cores), per):
        cells = [model.cell(c, color) for c in cores[i : i + per]]
        lines.append(_hjoin([_line(c) for c in cells]))
    return _vstack(lines)


def _node_title(model: _Model, node: int | None, ncores: int, part: bool = False) -> str:
    if node is None:
        return f"NUMA ? · {ncores} core{'s' * (ncores != 1)}"
    suffix = " (part)" if part else ""
    return f"NUMA {node}{suffix} · {ncores} core{'s' * (ncores != 1)}{'' if part else _memory(model.topo.node(node))}"


def _package_title(model: _Model, pkg: int, part: bool = False) -> str:
    os_index = model.topo.packages[pkg].os_index if pkg < len(model.topo.packages) else -1
    extra = f" (id {os_index})" if os_index >= 0 and os_index != pkg else ""
    return f"Package {pkg}{extra}{' (part)' if part else ''}"


class _Layout:
    """Lays the machine out for one choice of cores per row and of GPUs beside or below their node."""

    def __init__(self, model: _Model, color: bool, per_row: int, beside: bool) -> None:
        self.m = model
        self.color = color
        self.per_row = per_row
        self.beside = beside

    def node_unit(self, node: int | None, title: str, inner: Block | Callable[[int], Block], avail: int,
                  attach: bool) -> Block:
        """The node's box with its GPUs and CPU-less nodes; ``inner`` may need the width it gets (a flow)."""
        extra = _attach_blocks(self.m, node, self.color) if attach else []
        if not extra:
            return _box(title, self._inner(inner, avail - 4), "numa")
        if self.beside:  # too wide is reported as too wide: the caller then tries GPUs below
            side = _vstack(extra)
            return _hjoin([_box(title, self._inner(inner, avail - side.w - 5), "numa"), side])
        box = _box(title, self._inner(inner, avail - 4), "numa")
        return _vstack([box, _flow(extra, avail)])

    @staticmethod
    def _inner(inner: Block | Callable[[int], Block], avail: int) -> Block:
        return inner if isinstance(inner, Block) else inner(avail)

    def machine(self, width: int) -> Block:
        m = self.m
        groups: dict[tuple[int, int | None], list[Core]] = {}
        for c in m.cores:
            groups.setdefault((c.package, c.numa_node), []).append(c)
        pkgs_of: dict[int | None, list[int]] = {}
        nodes_of: dict[int, list[int | None]] = {}
        for pkg, node in groups:
            pkgs_of.setdefault(node, []).append(pkg)
            nodes_of.setdefault(pkg, []).append(node)
        pkg_order = sorted(nodes_of)
        node_order = m.cpu_nodes
        blocks: list[Block] = []
        if all(len(p) == 1 for p in pkgs_of.values()):  # nodes inside packages (the usual case, and SNC/NPS)
            for pkg in pkg_order:
                units = []
                for node in sorted(nodes_of[pkg], key=node_order.index):
                    cores = groups[(pkg, node)]
                    units.append(self.node_unit(node, _node_title(m, node, len(cores)),
                                                _cell_grid(m, cores, self.per_row, self.color), width - 4, True))
                blocks.append(_box(_package_title(m, pkg), _flow(units, width - 4), "package"))
        elif all(len(n) == 1 for n in nodes_of.values()):  # packages inside nodes (POWER, some AMD)
            for node in node_order:
                pkgs = sorted(pkgs_of[node])

                def inner(avail: int, node: int | None = node, pkgs: list[int] = pkgs) -> Block:
                    boxes = [_box(_package_title(m, p), _cell_grid(m, groups[(p, node)], self.per_row, self.color),
                                  "package") for p in pkgs]
                    return _flow(boxes, avail)

                ncores = sum(len(groups[(p, node)]) for p in pkgs)
                blocks.append(self.node_unit(node, _node_title(m, node, ncores), inner, width, True))
        else:  # nodes and packages cross: each package shows its part of each node
            done: set[int | None] = set()
            for pkg in pkg_order:
                units = []
                for node in sorted(nodes_of[pkg], key=node_order.index):
                    cores = groups[(pkg, node)]
                    part = len(pkgs_of[node]) > 1
                    units.append(self.node_unit(node, _node_title(m, node, len(cores), part),
                                                _cell_grid(m, cores, self.per_row, self.color), width - 4,
                                                node not in done))
                    done.add(node)
                blocks.append(_box(_package_title(m, pkg), _flow(units, width - 4), "package"))
        extra = self.extras(width)
        return _flow(blocks + extra, width)

    def extras(self, width: int) -> list[Block]:
        m = self.m
        out: list[Block] = []
        if m.offline:
            if len(m.offline) <= 64:
                cells = [m.offline_cell(p, self.color) for p in m.offline]
                per = max(1, min(self.per_row, len(cells)))
                rows = [_hjoin([_line(c) for c in cells[i : i + per]]) for i in range(0, len(cells), per)]
                inner = _vstack(rows)
            else:
                inner = _line((f"CPUs {format_cpulist(m.offline)}", DIM))
            out.append(_box(f"offline CPUs · {len(m.offline)}", inner, "group"))
        loose: list[Block] = [_gpu_box(m, e, self.color) for e in m.loose_gpus]
        loose += [_cpuless_box(n) for n in m.loose_nodes]
        if loose:
            out.append(_box("not tied to a NUMA node with CPUs", _flow(loose, width - 4), "group"))
        return out


def _plural(k: int, word: str) -> str:
    return f"{k} {word}{'s' * (k != 1)}"


def _header(model: _Model, width: int) -> list[Block]:
    topo, plan = model.topo, model.plan
    n = len(plan.ranks)
    order = {"rank": "rank i → GPU i", "closest": "each rank → the GPU nearest its cores"}
    ngpus = len(topo.visible_gpus())
    head = f"affrun show · {n} local rank{'s' * (n != 1)} · mode {plan.mode}"
    if ngpus and any(r.gpu is not None for r in plan.ranks):
        head += f" · --gpu-order {plan.gpu_order}: {order.get(plan.gpu_order, plan.gpu_order)}"
    ncpu_nodes = sum(1 for node in topo.numa_nodes if node.cpus)
    npus = sum(len(c.pus) for c in topo.cores)
    machine = " · ".join([
        _plural(len(topo.packages), "package"),
        _plural(len(topo.numa_nodes), "NUMA node")
        + (f" ({ncpu_nodes} with CPUs)" if ncpu_nodes != len(topo.numa_nodes) else ""),
        f"{_plural(len(topo.cores), 'core')} / {npus} CPUs online",
        f"allowed {format_cpulist(topo.allowed) or 'none'}",
        _plural(ngpus, "GPU") if ngpus else "no GPU",
    ])
    return [*_wrap(head, width, BOLD), *_wrap(machine, width, DIM), *_wrap(f"source: {topo.source}", width, DIM)]


def _legend(model: _Model, width: int, color: bool) -> list[Block]:
    plan = model.plan
    out: list[Block] = [_line(("Legend", BOLD), ("  each core is [first CPU id, owner]", DIM))]
    roles = {info.role for _, _, info in model.core_marks.values()} | ({"offline"} if model.offline else set())
    key: list[tuple[str, str]] = []
    if roles & {"compute", "loader"}:
        key.append(("0", "compute core of rank 0"))
    if "loader" in roles:
        key.append(("0L", "DataLoader core of rank 0"))
    shared = [info.ranks for _, _, info in model.core_marks.values() if info.role == "shared"]
    if shared:
        example = min(shared)
        key.append((model.shared_label(example), f"shared by ranks {', '.join(map(str, example))}"))
    if "free" in roles:
        key.append((".", "free"))
    if "reserved" in roles:
        key.append(("r", "reserved (--reserve)"))
    if "disallowed" in roles:
        key.append(("x", "not allowed (cgroup, affinity, --cpus)"))
    if "offline" in roles:
        key.append(("-", "offline"))
    row = [_line((mark, BOLD), (f" {what}", DIM)) for mark, what in key]
    out.append(_hjoin([Block(2, 1), _flow(row, width - 2, gap=3)], gap=0))
    headers = ("rank", "gpu", "pci", "omp", "numa", "cpus")
    rows: list[tuple[Text, str, str, str, str, str]] = []
    for r in plan.ranks:
        label = f"{r.local_rank:>2}"
        swatch = Text(0, 0, f" {label} " if color else f"[{label}]", Style("rank", (r.local_rank,)), swatch=r.local_rank)
        cpus = format_cpulist(r.cpus)
        if r.loader_cpus:
            cpus += f" (DataLoader {format_cpulist(r.loader_cpus)})"
        if r.spill_cpus:
            cpus += f" ({format_cpulist(r.spill_cpus)} from node(s) {','.join(map(str, r.spill_nodes)) or '?'})"
        sharers = [o.local_rank for o in plan.ranks if o is not r and set(o.cpus) & set(r.cpus)]
        if sharers:
            cpus += f" (shared with {'rank' if len(sharers) == 1 else 'ranks'} {format_cpulist(sharers)})"
        rows.append((swatch, "-" if r.gpu is None else str(r.gpu), r.gpu_pci or "-", str(r.threads),
                     ",".join(map(str, r.numa_nodes)) or "?", cpus))
    widths = [max(len(headers[0]), *(len(x[0].text) for x in rows))]
    widths += [max(len(headers[i]), *(len(str(x[i])) for x in rows)) for i in range(1, 5)]
    out.append(_line(("  ".join(h.ljust(w) for h, w in zip(headers, widths)) + "  " + headers[5], DIM)))
    lead = sum(widths) + 2 * len(widths)
    for sw, *cols in rows:
        cpus_lines = textwrap.wrap(str(cols[-1]), max(width - lead, 16), break_on_hyphens=False) or [""]
        head = "".join(("  " + str(c).ljust(w)) for c, w in zip(cols[:-1], widths[1:]))
        out.append(_line(sw, (" " * (widths[0] - len(sw.text)), PLAIN), (head + "  " + cpus_lines[0], PLAIN)))
        out += [_line((" " * lead + ln, PLAIN)) for ln in cpus_lines[1:]]
    if any(e.visible != e.gpu.index for e in model.gpus):
        out += _wrap("GPU n is the visible index (torch.cuda device n, after CUDA_VISIBLE_DEVICES & co); "
                     "PCI #k is the GPU's place in PCI bus order (nvidia-smi, NVML).", width, DIM)
    for ranks, alias in model.shared_alias.items():
        out.append(_line((f"  {alias} ", BOLD), (f"= cores shared by ranks {format_cpulist(ranks)}", DIM)))
    return out


def _warnings(model: _Model, width: int) -> list[Block]:
    seen: list[str] = []
    for w in (*model.topo.warnings, *model.plan.warnings):
        if w not in seen:
            seen.append(w)
    out: list[Block] = []
    for w in seen:
        out += _wrap(w, width, PLAIN, first="warning: ", indent=0)
    return out


def _layout(topo: Topology, plan: Plan, width: int, color: bool) -> Block:
    model = _Model(topo, plan)
    body = _body(model, width, color)
    parts = [*_header(model, width), body, Block(0, 1), *_legend(model, width, color)]
    warns = _warnings(model, width)
    if warns:
        parts += [Block(0, 1), *warns]
    return _vstack(parts)


def _body(model: _Model, width: int, color: bool) -> Block:
    """The widest layout that fits ``width``, GPUs beside their node or below it, whichever is shorter."""
    groups: dict[tuple[int, int | None], int] = {}
    for c in model.cores:
        groups[(c.package, c.numa_node)] = groups.get((c.package, c.numa_node), 0) + 1
    most = max(groups.values(), default=1)
    fits: list[Block] = []
    for beside in (True, False):
        lo, hi = (min(most, 4) if beside else 1), most
        fit: Block | None = None
        while lo <= hi:  # the most cores per row that fits (the width grows with it)
            mid = (lo + hi) // 2
            block = _Layout(model, color, mid, beside).machine(width)
            if block.w <= width:
                fit, lo = block, mid + 1
            else:
                hi = mid - 1
        if fit is not None:
            fits.append(fit)
    if not fits:  # nothing fits (a very narrow width): one core per row, GPUs below
        return _Layout(model, color, 1, False).machine(width)
    return min(fits, key=lambda b: b.h)  # stable: beside wins a tie


# ------------------------------------------------------------------------------------------------ terminal
_BORDERS: dict[str, tuple[str, str, str, str, str, str]] = {  # corners and sides: ┌ ─ ┐ │ └ ┘
    kind: (chars[0], chars[1], chars[2], chars[3], chars[4], chars[5])
    for kind, chars in {
        "package": "┏━┓┃┗┛",
        "numa": "┌─┐│└┘",
        "cpuless": "┌╌┐╎└┘",
        "gpu": "╭─╮│╰╯",
        "group": "┌┈┐┊└┘",
    }.items()
}


def _sgr(style: Style | None, frame: str | None = None) -> str:
    if frame is not None:
        return {"package": "1", "gpu": "38;5;29", "cpuless": "38;5;244", "group": "38;5;244"}.get(frame, "")
    if style is None:
        return ""
    if style.kind == "rank":
        return f"48;5;{_ansi_index(style.ranks[0], style.loader)};38;5;16"
    if style.kind in ("disallowed", "offline", "dim"):
        return "38;5;244"
    if style.kind == "reserved":
        return "38;5;130"
    if style.kind == "bold":
        return "1"
    if style.kind == "warn":
        return "1;38;5;208"
    return ""


def _render_text(block: Block, color: bool) -> str:
    chars = [[" "] * block.w for _ in range(block.h)]
    codes = [[""] * block.w for _ in range(block.h)]

    def put(x: int, y: int, ch: str, code: str) -> None:
        if 0 <= y < block.h and 0 <= x < block.w:
            chars[y][x] = ch
            codes[y][x] = code

    for op in block.ops:
        if isinstance(op, Frame):
            tl, hz, tr, vt, bl, br = _BORDERS.get(op.kind, _BORDERS["numa"])
            code = _sgr(None, op.kind)
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
    return _render_text(_layout(topo, plan, max(width, 40), color), color)


# ------------------------------------------------------------------------------------------------ SVG
_CW, _CH, _MARGIN = 8, 20, 16
_FONT = "ui-monospace, 'DejaVu Sans Mono', Menlo, Consolas, monospace"
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


def _pattern_id(ranks: Sequence[int]) -> str:
    return "shared-" + "-".join(map(str, ranks))


def _svg_text(x: float, y: float, text: str, fill: str, extra: str = "") -> str:
    return f'<text x="{x:g}" y="{y:g}" fill="{fill}"{extra}>{escape(text)}</text>'


def svg(topo: Topology, plan: Plan, width: int = SVG_WIDTH) -> str:
    """The same picture as an SVG document: boxes, one rect per core in its rank's colour, legend, warnings."""
    block = _layout(topo, plan, width, color=True)
    w_px, h_px = block.w * _CW + 2 * _MARGIN, block.h * _CH + 2 * _MARGIN
    patterns: dict[str, tuple[int, ...]] = {}
    body: list[str] = []
    frames = [op for op in block.ops if isinstance(op, Frame)]
    texts = [op for op in block.ops if isinstance(op, Text)]
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
        body.append(_svg_text(tx + _CW, _MARGIN + f.y * _CH + 14, f.title, "#1a202c", weight))
    for t in texts:
        x, y = _MARGIN + t.x * _CW, _MARGIN + t.y * _CH
        st = t.style
        if st.kind in ("rank", "shared", "free", "reserved", "disallowed", "offline"):
            if st.kind == "rank":
                fill, stroke, ink, dash = rank_color(st.ranks[0], st.loader), "#2d3748", "#000000", "3 2" if st.loader else ""
            elif st.kind == "shared":
                pid = _pattern_id(st.ranks)
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
            body.append(f'<rect{attrs} x="{x + 1:g}" y="{y + 2:g}" width="{len(t.text) * _CW - 2:g}" '
                        f'height="{_CH - 4}" rx="3" fill="{fill}" stroke="{stroke}" stroke-width="0.8"{dash_attr}>'
                        f"<title>{escape(_tooltip(t))}</title></rect>")
            label = t.text.strip(" []")
            # On stripes the label gets a white halo so it stays readable.
            halo = ' stroke="#ffffff" stroke-width="3" paint-order="stroke"' if st.kind == "shared" else ""
            if t.core is not None and " " in label:  # CPU id, then the owner marker in bold
                cpu, _, mark = label.partition(" ")
                body.append(f'<text x="{x + len(t.text) * _CW / 2:g}" y="{y + 14:g}" fill="{ink}" text-anchor="middle"'
                            f'{halo}>{escape(cpu)} <tspan font-weight="bold">{escape(mark.strip())}</tspan></text>')
            else:
                body.append(_svg_text(x + len(t.text) * _CW / 2, y + 14, label, ink, ' text-anchor="middle"' + halo))
        elif t.text.strip():
            lead = len(t.text) - len(t.text.lstrip(" "))
            weight = ' font-weight="bold"' if st.kind in ("bold", "warn") else ""
            body.append(_svg_text(x + lead * _CW, y + 14, t.text.strip(" "), _TEXT_FILL.get(st.kind, "#1a202c"), weight))
    defs = []
    for pid, ranks in patterns.items():
        stripe = 6
        size = stripe * len(ranks)
        rects = "".join(f'<rect x="{i * stripe}" y="0" width="{stripe}" height="{size}" fill="{rank_color(r)}"/>'
                        for i, r in enumerate(ranks))
        defs.append(f'<pattern id="{pid}" patternUnits="userSpaceOnUse" width="{size}" height="{size}" '
                    f'patternTransform="rotate(45)">{rects}</pattern>')
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w_px}" height="{h_px}" '
            f'viewBox="0 0 {w_px} {h_px}" font-family={quoteattr(_FONT)} font-size="13" xml:space="preserve">')
    title = f"<title>affrun show: {len(plan.ranks)} ranks, mode {escape(plan.mode)}</title>"
    background = f'<rect x="0" y="0" width="{w_px}" height="{h_px}" fill="#ffffff"/>'
    return "\n".join([head, title, f"<defs>{''.join(defs)}</defs>", background, *body, "</svg>"]) + "\n"


def _tooltip(t: Text) -> str:
    if t.core is not None:
        c = t.core
        who = f"ranks {', '.join(map(str, c.ranks))}" if c.ranks else c.role
        return f"core of CPUs {format_cpulist(c.pus)}: {who} ({c.role})"
    if t.swatch is not None:
        return f"rank {t.swatch}"
    return t.text.strip(" []")


def html_page(topo: Topology, plan: Plan) -> str:
    """A self-contained HTML page around the SVG (no scripts, no external resources)."""
    title = escape(f"affrun show: {len(plan.ranks)} ranks, mode {plan.mode}")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{title}</title>\n"
        "<style>body{margin:16px;background:#fff;font-family:sans-serif}svg{max-width:100%;height:auto}</style>\n"
        "</head>\n<body>\n" + svg(topo, plan) + "</body>\n</html>\n"
    )


def write_map(topo: Topology, plan: Plan, path: str) -> None:
    """Write the map to ``path``: an HTML page when it ends in ``.html``/``.htm``, else SVG. Raises OSError."""
    text = html_page(topo, plan) if path.lower().endswith((".html", ".htm")) else svg(topo, plan)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
