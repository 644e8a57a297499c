"""What the picture shows, computed once from ``(Topology, Plan)``: who owns each core, where each GPU and
CPU-less NUMA node is drawn. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from launcher.plan.geometry import CLAIM_GPU_NODE
from launcher.plan.homes import gpu_home
from launcher.plan.planner import Plan
from launcher.show.layout import CoreInfo, Style, Text
from launcher.topology.kinds import CoreKind, CoreKinds
from launcher.topology.model import GPU, Core, NumaNode, Topology

SHARED_LABEL_MAX = 5  # "0+1", "0-3", "0+2+4"; longer sharer sets get an alias (S1, S2, ...)


@dataclass(frozen=True)
class GpuEntry:
    gpu: GPU
    visible: int | None  # visible index, None when CUDA_VISIBLE_DEVICES & co hide it
    ranks: tuple[int, ...]
    note: str  # how the GPU's place was decided, when it is not its own NUMA node


@dataclass(frozen=True)
class KindMark:
    """How one core kind is marked: its letter after each core's id, and where it ranks."""

    letter: str
    kind: CoreKind
    speed: Literal["fastest", "middle", "slowest"]


def kind_marks(kinds: CoreKinds) -> tuple[KindMark, ...]:
    """One mark per core kind, fastest first: the kind name's first letter, or A, B, C... when those would repeat;
    none for a single kind. The one map of kinds to letters (the picture, its legend, ``affrun topology``)."""
    if not kinds.hybrid:
        return ()
    firsts = [next((ch for ch in k.name if ch.isalnum()), "?") for k in kinds.kinds]
    if len(set(firsts)) != len(firsts):
        firsts = [chr(ord("A") + i) if i < 26 else "?" for i in range(len(firsts))]
    last = len(kinds.kinds) - 1
    return tuple(KindMark(f, k, "fastest" if i == 0 else "slowest" if i == last else "middle")
                 for i, (k, f) in enumerate(zip(kinds.kinds, firsts)))


class Model:
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
        self.comm = {p: r.local_rank for r in plan.ranks for p in r.comm_cpus}  # --comm-cores: NCCL's cores
        self.shared_alias: dict[tuple[int, ...], str] = {}
        self.cores = list(topo.cores)
        self.offline = sorted(topo.offline)
        self.kinds = topo.kinds()
        self.kind_marks = kind_marks(self.kinds)
        letter_of = {cpu: mark.letter for mark in self.kind_marks for cpu in mark.kind.cpus}
        # a core's kind is its first CPU's; a core of no kind gets a blank, so the cells stay aligned
        self.kind_letter = {c.pus[0]: letter_of.get(c.pus[0], " ") for c in self.cores} if self.kind_marks else {}
        self.core_marks = {c.pus[0]: self._mark(c) for c in self.cores}
        markers = [m for m, _, _ in self.core_marks.values()] + (["-"] if self.offline else [])
        self.marker_w = max((len(m) for m in markers), default=1)
        ids = [c.pus[0] for c in self.cores] + self.offline
        self.id_w = max((len(str(i)) for i in ids), default=1)
        self.cpu_nodes = self._cpu_nodes()
        self.gpus: list[GpuEntry] = []
        self.attached: dict[int | None, list[GpuEntry | NumaNode]] = {}  # drawn beside a node with CPUs
        self.loose_gpus: list[GpuEntry] = []
        self.loose_nodes: list[NumaNode] = []
        self._place()

    def _mark(self, core: Core) -> tuple[str, Style, CoreInfo]:
        ranks = tuple(sorted({r for p in core.pus for r in self.owners.get(p, ())}))
        first = core.pus[0]
        if not ranks:
            if not self.reserved.isdisjoint(core.pus):
                return "r", Style("reserved"), CoreInfo(first, core.pus, (), "reserved")
            if any(p in self.topo.allowed for p in core.pus):
                return ".", Style("free"), CoreInfo(first, core.pus, (), "free")
            return "x", Style("disallowed"), CoreInfo(first, core.pus, (), "disallowed")
        comm = {self.comm.get(p, -1) for p in core.pus if p in self.owners}
        if len(comm) == 1 and -1 not in comm:  # a comm core, shared or not, is its rank's alone
            r = comm.pop()
            return f"{r}C", Style("rank", (r,), True), CoreInfo(first, core.pus, (r,), "comm")
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
        body = f"{cpu:>{self.id_w}}{self.kind_letter.get(cpu, '')} {marker:<{self.marker_w}}"
        # Coloured cells are the colour block itself; plain ones need brackets to read as boxes.
        text = f" {body} " if color and style.kind in ("rank", "shared") else f"[{body}]"
        return Text(0, 0, text, style, core=info)

    def _cpu_nodes(self) -> list[int | None]:
        first: dict[int | None, int] = {}
        for c in self.cores:
            first.setdefault(c.numa_node, c.pus[0])
        return sorted(first, key=lambda n: first[n])

    def _nearest_cpu_node(self, node_id: int) -> int | None:
        node = self.topo.node(node_id)
        dist = node.distances if node else {}
        known = [n for n in self.cpu_nodes if n is not None and n in dist]
        if not known:
            return None
        return min(known, key=lambda n: (dist[n], self.cpu_nodes.index(n)))

    def _gpu_anchor(self, g: GPU) -> tuple[int | None, str]:
        """Where the planner homes ``g`` (:func:`launcher.plan.homes.gpu_home`), and why when it is not its node."""
        by_node: dict[int, list[Core]] = {}
        for c in self.cores:
            by_node.setdefault(c.numa_node if c.numa_node is not None else -1, []).append(c)
        node_order = [-1 if n is None else n for n in self.cpu_nodes]
        home = gpu_home(self.topo, g, "GPU", by_node, node_order)
        if home.node is None:
            return None, home.why
        return (None if home.node == -1 else home.node), ("" if home.claim == CLAIM_GPU_NODE else home.why)

    def _place(self) -> None:
        """Each GPU and each CPU-less (or offline) NUMA node: beside its node with CPUs, or loose."""
        vis = self.topo.visible
        visible_of = {g.index: i for i, g in enumerate(self.topo.gpus)} if vis is None else {p: i for i, p in enumerate(vis)}
        memory_of: set[int] = set()
        for g in self.topo.gpus:
            v = visible_of.get(g.index)
            anchor, note = self._gpu_anchor(g)
            entry = GpuEntry(g, v, tuple(r.local_rank for r in self.plan.ranks if v is not None and r.gpu == v), note)
            self.gpus.append(entry)
            if g.memory_node is not None:
                memory_of.add(g.memory_node)
            if anchor is None and note:
                self.loose_gpus.append(entry)
            else:
                self.attached.setdefault(anchor, []).append(entry)
        for node in self.topo.numa_nodes:
            if node.os_index in self.cpu_nodes or node.os_index in memory_of:
                continue  # drawn with its cores, or inside its GPU's row
            if node.cpus:  # CPUs that are all offline: still a node with CPUs, shown by its own box
                self.attached.setdefault(node.os_index, [])
                self.loose_nodes.append(node)
                continue
            near = self._nearest_cpu_node(node.os_index)
            if near is None:
                self.loose_nodes.append(node)
            else:
                self.attached.setdefault(near, []).append(node)
