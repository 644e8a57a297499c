"""The machine drawn as one :class:`~launcher.show.layout.Block`: every package, NUMA node and core a box, each
core coloured by its owner, GPUs beside their NUMA node, then the legend and the warnings. Pure."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence

from launcher.base.cpulist import format_cpulist
from launcher.base.untrusted import shown
from launcher.plan.planner import Plan
from launcher.show.layout import (
    BOLD,
    DIM,
    PLAIN,
    Block,
    Grid,
    Style,
    Text,
    flow,
    framed,
    hjoin,
    text_line,
    vstack,
    wrap,
)
from launcher.show.model import GpuEntry, Model
from launcher.topology.model import Core, NumaNode, Topology


def _memory(node: NumaNode | None) -> str:
    if node is None or not node.memory_kb:
        return ""
    gib = node.memory_kb / (1024 * 1024)
    return f" · {gib:.0f} GiB" if gib >= 10 else f" · {gib:.1f} GiB"


def _rank_text(ranks: Sequence[int], color: bool, model: Model) -> Text:
    if not ranks:
        return Text(0, 0, "no rank", DIM)
    label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {model.shared_label(tuple(ranks))}"
    text = f" {label} " if color else f"[{label}]"
    return Text(0, 0, text, Style("rank" if len(ranks) == 1 else "shared", tuple(ranks)))


def _gpu_box(model: Model, entry: GpuEntry, color: bool) -> Block:
    """The GPU's box (all GPU boxes share one width so they line up), with its CPU-less memory node beside it."""
    width = max(_gpu_alone(model, e, color).w for e in model.gpus)
    box = _gpu_alone(model, entry, color, width)
    g = entry.gpu
    if g.memory_node is None:
        return box
    mem = model.topo.node(g.memory_node)
    owner = f"GPU {entry.visible}" if entry.visible is not None else f"GPU PCI #{g.index}"
    return hjoin([box, framed(f"NUMA {g.memory_node} · no CPUs", text_line((f"{owner} memory{_memory(mem)}", DIM)), "cpuless")])


def _gpu_alone(model: Model, entry: GpuEntry, color: bool, min_w: int = 0) -> Block:
    g = entry.gpu
    if entry.visible is None:
        title = f"GPU (PCI #{g.index}, not visible)"
    elif entry.visible != g.index:
        title = f"GPU {entry.visible} · {g.vendor} · PCI #{g.index}"
    else:
        title = f"GPU {entry.visible} · {g.vendor}"
    rank = _rank_text(entry.ranks, color, model)
    lines = [text_line(Text(0, 0, g.pci, PLAIN, gpu=g.index), (" ", PLAIN), Text(0, 0, rank.text, rank.style, gpu=g.index))]
    nics = [r.nic for r in model.plan.ranks if r.local_rank in entry.ranks and r.nic is not None]
    if nics:  # the NIC beside its GPU: each distinct one its ranks were given, in rank order
        shown = list(dict.fromkeys(f"{n.device} ({n.distance})" for n in nics))
        lines.append(text_line((f"nic {', '.join(shown)}", DIM)))
    if entry.note:
        lines.append(text_line((entry.note, DIM)))
    return framed(title, vstack(lines), "gpu", min_w)


def _cpuless_box(node: NumaNode) -> Block:
    what = "memory only" if not node.cpus else f"CPUs {format_cpulist(node.cpus)} offline"
    return framed(f"NUMA {node.os_index} · no CPUs" if not node.cpus else f"NUMA {node.os_index}",
                text_line((what + _memory(node), DIM)), "cpuless")


def _attach_blocks(model: Model, node: int | None, color: bool) -> list[Block]:
    out = []
    for item in model.attached.get(node, []):
        if isinstance(item, GpuEntry):
            out.append(_gpu_box(model, item, color))
        elif item.os_index not in model.cpu_nodes:
            out.append(_cpuless_box(item))
    return out


def _cell_grid(cells: Sequence[Block], per_row: int) -> Block:
    per = max(min(per_row, len(cells)), 1)
    # Prefer full rows: the largest count that divides the cores evenly, if it costs at most a third of the row.
    even = [p for p in range(per, 0, -1) if len(cells) % p == 0 and 3 * p >= 2 * per]
    return Grid(cells, even[0] if even else per)


def _node_title(model: Model, node: int | None, ncores: int, part: bool = False) -> str:
    if node is None:
        return f"NUMA ? · {ncores} core{'s' * (ncores != 1)}"
    suffix = " (part)" if part else ""
    return f"NUMA {node}{suffix} · {ncores} core{'s' * (ncores != 1)}{'' if part else _memory(model.topo.node(node))}"


def _package_title(model: Model, pkg: int, part: bool = False) -> str:
    os_index = model.topo.packages[pkg].os_index if pkg < len(model.topo.packages) else -1
    extra = f" (id {os_index})" if os_index >= 0 and os_index != pkg else ""
    return f"Package {pkg}{extra}{' (part)' if part else ''}"


class _Parts:
    """What every layout of one picture shares: the cores of each (package, NUMA node) and their cells."""

    def __init__(self, model: Model, color: bool) -> None:
        self.model, self.color = model, color
        self.groups: dict[tuple[int, int | None], list[Core]] = {}
        for c in model.cores:
            self.groups.setdefault((c.package, c.numa_node), []).append(c)
        self.cells = {key: [text_line(model.cell(c, color)) for c in cores] for key, cores in self.groups.items()}
        self.pkgs_of: dict[int | None, list[int]] = {}
        self.nodes_of: dict[int, list[int | None]] = {}
        for pkg, node in self.groups:
            self.pkgs_of.setdefault(node, []).append(pkg)
            self.nodes_of.setdefault(pkg, []).append(node)


class _Layout:
    """Lays the machine out for one choice of cores per row and of GPUs beside or below their node."""

    def __init__(self, parts: _Parts, per_row: int, beside: bool) -> None:
        self.m, self.color, self.parts, self.per_row, self.beside = parts.model, parts.color, parts, per_row, beside

    def node_unit(self, node: int | None, title: str, inner: Block | Callable[[int], Block], avail: int,
                  attach: bool) -> Block:
        """The node's box with its GPUs and CPU-less nodes; ``inner`` may need the width it gets (a flow)."""
        extra = _attach_blocks(self.m, node, self.color) if attach else []
        if not extra:
            return framed(title, self._inner(inner, avail - 4), "numa")
        if self.beside:  # too wide is reported as too wide: the caller then tries GPUs below
            side = vstack(extra)
            return hjoin([framed(title, self._inner(inner, avail - side.w - 5), "numa"), side])
        box = framed(title, self._inner(inner, avail - 4), "numa")
        return vstack([box, flow(extra, avail)])

    @staticmethod
    def _inner(inner: Block | Callable[[int], Block], avail: int) -> Block:
        return inner if isinstance(inner, Block) else inner(avail)

    def machine(self, width: int) -> Block:
        m = self.m
        groups, cells, pkgs_of, nodes_of = self.parts.groups, self.parts.cells, self.parts.pkgs_of, self.parts.nodes_of
        pkg_order = sorted(nodes_of)
        node_order = m.cpu_nodes
        blocks: list[Block] = []
        if any(len(p) > 1 for p in pkgs_of.values()) and all(len(n) == 1 for n in nodes_of.values()):
            # packages inside nodes (POWER, some AMD)
            for node in node_order:
                pkgs = sorted(pkgs_of[node])

                def inner(avail: int, node: int | None = node, pkgs: list[int] = pkgs) -> Block:
                    boxes = [framed(_package_title(m, p), _cell_grid(cells[(p, node)], self.per_row), "package")
                             for p in pkgs]
                    return flow(boxes, avail)

                ncores = sum(len(groups[(p, node)]) for p in pkgs)
                blocks.append(self.node_unit(node, _node_title(m, node, ncores), inner, width, True))
        else:  # nodes inside packages (the usual case, SNC/NPS), or crossing them: each package its part of each
            done: set[int | None] = set()
            for pkg in pkg_order:
                units = []
                for node in sorted(nodes_of[pkg], key=node_order.index):
                    cores = groups[(pkg, node)]
                    part = len(pkgs_of[node]) > 1
                    units.append(self.node_unit(node, _node_title(m, node, len(cores), part),
                                                _cell_grid(cells[(pkg, node)], self.per_row), width - 4,
                                                node not in done))
                    done.add(node)
                blocks.append(framed(_package_title(m, pkg), flow(units, width - 4), "package"))
        extra = self.extras(width)
        return flow(blocks + extra, width)

    def extras(self, width: int) -> list[Block]:
        m = self.m
        out: list[Block] = []
        if m.offline:
            if len(m.offline) <= 64:
                cells = [text_line(m.offline_cell(p, self.color)) for p in m.offline]
                inner: Block = Grid(cells, max(1, min(self.per_row, len(cells))))
            else:
                inner = text_line((f"CPUs {format_cpulist(m.offline)}", DIM))
            out.append(framed(f"offline CPUs · {len(m.offline)}", inner, "group"))
        loose: list[Block] = [_gpu_box(m, e, self.color) for e in m.loose_gpus]
        loose += [_cpuless_box(n) for n in m.loose_nodes]
        if loose:
            out.append(framed("not tied to a NUMA node with CPUs", flow(loose, width - 4), "group"))
        return out


def _plural(k: int, word: str) -> str:
    return f"{k} {word}{'s' * (k != 1)}"


def _header(model: Model, width: int) -> list[Block]:
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
    return [*wrap(head, width, BOLD), *wrap(machine, width, DIM), *wrap(f"source: {shown(topo.origin)}", width, DIM)]


_KEY = {"loader": ("0L", "DataLoader core of rank 0"), "free": (".", "free"), "offline": ("-", "offline"),
        "comm": ("0C", "core of rank 0 for NCCL's threads (--comm-cores)"), "reserved": ("r", "reserved (--reserve)"),
        "disallowed": ("x", "not allowed (cgroup, affinity, --cpus)")}  # the legend's marks of a role


def _legend(model: Model, width: int, color: bool) -> list[Block]:
    plan = model.plan
    # the first box of the picture, read aloud: "[0 0] is the core whose first CPU is 0: a compute core of rank 0"
    first_box = ""
    if model.core_marks:
        box_cpu = min(model.core_marks)
        box_mark, _, box_info = model.core_marks[box_cpu]
        box_ranks = ", ".join(map(str, box_info.ranks))
        what = {"compute": f"a compute core of rank {box_ranks}", "loader": f"a DataLoader core of rank {box_ranks}",
                "comm": f"a core of rank {box_ranks} kept for NCCL's threads",
                "shared": f"shared by ranks {box_ranks}", "free": "free", "reserved": "reserved (--reserve)",
                "disallowed": "not allowed"}.get(box_info.role, box_info.role)
        box_kind = model.kind_letter.get(box_cpu, "").strip()
        first_box = f": [{box_cpu}{box_kind} {box_mark}] is the core whose first CPU is {box_cpu}, {what}"
    kinds = "" if not model.kind_letter else " (the letter after the id is the core's kind)"
    out: list[Block] = [*wrap(f"Legend  each core is [first CPU id, owner]{kinds}{first_box}", width, DIM)]
    roles = {info.role for _, _, info in model.core_marks.values()} | ({"offline"} if model.offline else set())
    key = [("0", "compute core of rank 0")] if roles & {"compute", "loader", "comm"} else []
    key += [_KEY[role] for role in ("loader", "comm") if role in roles]
    shared = [info.ranks for _, _, info in model.core_marks.values() if info.role == "shared"]
    if shared:
        example = min(shared)
        key.append((model.shared_label(example), f"shared by ranks {', '.join(map(str, example))}"))
    key += [_KEY[role] for role in ("free", "reserved", "disallowed", "offline") if role in roles]
    for mark in model.kind_marks:
        key.append((mark.letter, f"{mark.kind.name}{'' if mark.speed == 'middle' else f' ({mark.speed})'}"))
    out.append(key_row(key, width))
    headers = ("rank", "gpu", "pci", "nic", "omp", "numa", "cpus")
    rows: list[tuple[Text, str, str, str, str, str, str]] = []
    for r in plan.ranks:
        swatch = rank_swatch(r.local_rank, color)
        cpus = format_cpulist(r.cpus)
        if r.loader_cpus:
            cpus += f" (DataLoader {format_cpulist(r.loader_cpus)})"
        if r.comm_cpus:
            cpus += f" (comm {format_cpulist(r.comm_cpus)})"
        if r.spill_cpus:
            cpus += f" ({format_cpulist(r.spill_cpus)} from node(s) {','.join(map(str, r.spill_nodes)) or '?'})"
        sharers = {o for p in r.cpus for o in model.owners.get(p, ())} - {r.local_rank}
        if sharers:
            cpus += f" (shared with {'rank' if len(sharers) == 1 else 'ranks'} {format_cpulist(sharers)})"
        rows.append((swatch, "-" if r.gpu is None else str(r.gpu), r.gpu_pci or "-", r.nic_device or "-",
                     str(r.threads), ",".join(map(str, r.numa_nodes)) or "?", cpus))
    widths = [max(len(headers[0]), *(len(x[0].text) for x in rows))]
    widths += [max(len(headers[i]), *(len(str(x[i])) for x in rows)) for i in range(1, 6)]
    out.append(text_line(("  ".join(h.ljust(w) for h, w in zip(headers, widths)) + "  " + headers[6], DIM)))
    lead = sum(widths) + 2 * len(widths)
    for sw, *cols in rows:
        cpus_lines = textwrap.wrap(str(cols[-1]), max(width - lead, 16), break_on_hyphens=False) or [""]
        head = "".join(("  " + str(c).ljust(w)) for c, w in zip(cols[:-1], widths[1:]))
        out.append(text_line(sw, (" " * (widths[0] - len(sw.text)), PLAIN), (head + "  " + cpus_lines[0], PLAIN)))
        out += [text_line((" " * lead + ln, PLAIN)) for ln in cpus_lines[1:]]
    if any(e.visible != e.gpu.index for e in model.gpus):
        out += wrap("GPU n is the visible index (torch.cuda device n, after CUDA_VISIBLE_DEVICES & co); "
                     "PCI #k is the GPU's place in PCI bus order (nvidia-smi, NVML).", width, DIM)
    for ranks, alias in model.shared_alias.items():
        out.append(text_line((f"  {alias} ", BOLD), (f"= cores shared by ranks {format_cpulist(ranks)}", DIM)))
    return out


def key_row(key: Sequence[tuple[str, str]], width: int) -> Block:
    """The legend's marks and what each means, as many to a line as fit."""
    row = [text_line((mark, BOLD), (f" {what}", DIM)) for mark, what in key]
    return hjoin([Block(2, 1), flow(row, width - 2, gap=3)], gap=0)


def rank_swatch(rank: int, color: bool) -> Text:
    """The legend's swatch of ``rank``'s colour."""
    return Text(0, 0, f" {rank:>2} " if color else f"[{rank:>2}]", Style("rank", (rank,)), swatch=rank)


def _warnings(model: Model, width: int) -> list[Block]:
    seen: list[str] = []
    for w in (*model.topo.warnings, *model.plan.warnings):
        if w not in seen:
            seen.append(w)
    out: list[Block] = []
    for w in seen:
        out += wrap(shown(w), width, PLAIN, first="warning: ", indent=0)
    return out


def draw(topo: Topology, plan: Plan, width: int, color: bool) -> Block:
    model = Model(topo, plan)
    parts = [*_header(model, width), body(model, width, color), Block(0, 1), *_legend(model, width, color)]
    warns = _warnings(model, width)
    if warns:
        parts += [Block(0, 1), *warns]
    return vstack(parts)


def body(model: Model, width: int, color: bool) -> Block:
    """The widest layout that fits ``width``, GPUs beside their node or below it, whichever is shorter."""
    parts = _Parts(model, color)
    most = max((len(cores) for cores in parts.groups.values()), default=1)
    fits: list[Block] = []
    for beside in (True, False):
        lo, hi = (min(most, 4) if beside else 1), most
        fit: Block | None = None
        while lo <= hi:  # the most cores per row that fits (the width grows with it)
            mid = (lo + hi) // 2
            block = _Layout(parts, mid, beside).machine(width)
            if block.w <= width:
                fit, lo = block, mid + 1
            else:
                hi = mid - 1
        if fit is not None:
            fits.append(fit)
    if not fits:  # nothing fits (a very narrow width): one core per row, GPUs below
        return _Layout(parts, 1, False).machine(width)
    return min(fits, key=lambda b: b.h)  # stable: beside wins a tie


