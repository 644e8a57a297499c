"""``affrun show --pid``'s picture: the machine's cores as ``affrun show`` draws them, each coloured by the rank
whose threads ran there, marked with the role that ran there most, a ``!`` where a thread strayed from its home.
What ran where comes in as plain data (:data:`Use`). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from launcher.base.cpulist import format_cpulist
from launcher.base.untrusted import shown
from launcher.plan.planner import Plan
from launcher.show.drawing import body, key_row, rank_swatch
from launcher.show.layout import BOLD, DIM, PLAIN, Block, CoreInfo, Style, text_line, vstack, wrap
from launcher.show.model import Model
from launcher.show.svg import SVG_WIDTH, TITLE, document
from launcher.show.terminal import TERMINAL_WIDTH, render_text
from launcher.topology.model import Core, Topology

Use = Mapping[int, Mapping[tuple[int, str, bool], int]]  # CPU -> (rank key, role, strayed) -> samples
# The mark of each thread role after the rank's number, and what it means in the legend.
ROLE_MARKS = {"main": ("m", "main thread"), "omp": ("o", "OpenMP team"), "interop": ("i", "torch's inter-op pool"),
              "pin_memory": ("p", "pin-memory thread"), "nccl_proxy": ("n", "NCCL's threads"),
              "worker": ("w", "DataLoader worker"), "torch": ("t", "another torch thread"),
              "unknown": ("?", "a thread not told apart")}
STRAY_MARK = "!"


@dataclass(frozen=True)
class LiveRank:
    """One rank of the live job, as the legend lists it."""

    key: int  # its colour: the local rank where the ranks' are distinct, else its place in pid order
    label: str  # rank 0 (pid 4242)
    cpus: str  # the CPUs it owns
    threads: int  # its threads and its children's
    strayed: int  # of them, those that ran outside their homes
    planned: bool  # whether it carries a thread plan
    exited: bool = False  # it exited during the sample, or before it (a zombie): it runs nowhere now


@dataclass(frozen=True)
class LiveJob:
    pid: int
    processes: int
    samples: int
    seconds: float
    ranks: tuple[LiveRank, ...]
    use: Use
    ended: bool = False  # the audited process exited (a zombie counts), which ended the sample


class LiveModel(Model):
    """The plan picture's model, its cores marked by what ran there instead of by a plan."""

    def __init__(self, topo: Topology, use: Use) -> None:
        self.use = use
        super().__init__(topo, Plan("exclusive", False, "rank", "none", ()))

    def _mark(self, core: Core) -> tuple[str, Style, CoreInfo]:
        counts: dict[tuple[int, str, bool], int] = {}
        for cpu in core.pus:
            for key, n in self.use.get(cpu, {}).items():
                counts[key] = counts.get(key, 0) + n
        if not counts:
            return super()._mark(core)  # no thread of the job ran here: free, or not allowed
        ranks = tuple(sorted({r for r, _, _ in counts}))
        by_role: dict[str, int] = {}
        for (_, role, _), n in counts.items():
            by_role[role] = by_role.get(role, 0) + n
        order = list(ROLE_MARKS)  # a tie goes to the role listed first: the main thread's
        role = max(by_role, key=lambda r: (by_role[r], -order.index(r) if r in order else -len(order)))
        stray = any(strayed for _, _, strayed in counts)
        letter = ROLE_MARKS.get(role, ("?", ""))[0] + (STRAY_MARK if stray else "")
        info = CoreInfo(core.pus[0], core.pus, ranks, "stray" if stray else role)
        if len(ranks) == 1:
            return f"{ranks[0]}{letter}", Style("rank", ranks, role == "worker"), info
        return f"{self.shared_label(ranks)}{letter}", Style("shared", ranks), info


def _legend(model: LiveModel, job: LiveJob, width: int, color: bool) -> list[Block]:
    out = wrap("Legend  each core is [first CPU id, the rank whose threads ran there most, the role that ran there "
               "most]; samples of all its CPUs count", width, DIM)
    roles = {role for cell in job.use.values() for _, role, _ in cell}
    key = [(mark, what) for role, (mark, what) in ROLE_MARKS.items() if role in roles]
    if any(strayed for cell in job.use.values() for _, _, strayed in cell):
        key.append((STRAY_MARK, "a thread strayed here from its home"))
    marks = {info.role for _, _, info in model.core_marks.values()}
    if "free" in marks:
        key.append((".", "no thread of the job ran here"))
    if "disallowed" in marks:
        key.append(("x", "not allowed"))
    out.append(key_row(key, width))
    for r in job.ranks:
        swatch = rank_swatch(r.key, color)
        plan = f"{r.strayed} strayed" if r.planned else "no thread plan"
        label = shown(r.label)  # a process's name, as the kernel has it: escaped in the picture and the SVG
        gone = " (exited)" if r.exited else ""
        out.append(text_line(swatch, (f"  {label}{gone}: CPUs {r.cpus or '?'}, {r.threads} thread(s), {plan}",
                                      PLAIN)))
    return out


def draw_live(topo: Topology, job: LiveJob, width: int, color: bool) -> Block:
    """The live picture laid out ``width`` cells wide."""
    model = LiveModel(topo, job.use)
    strayed = sum(r.strayed for r in job.ranks)
    head = (f"affrun show --pid {job.pid} · {len(job.ranks)} rank(s), {job.processes} process(es) · "
            f"{job.samples} samples over {job.seconds:.2f} s" + ("; the job exited, which ended the sample"
                                                                 if job.ended else ""))
    machine = (f"{len(topo.cores)} cores / {sum(len(c.pus) for c in topo.cores)} CPUs online · allowed "
               f"{format_cpulist(topo.allowed) or 'none'} · where each thread ran (/proc/PID/task/TID/stat)")
    parts = [*wrap(head, width, BOLD), *wrap(machine, width, DIM), body(model, width, color), Block(0, 1),
             *_legend(model, job, width, color)]
    if strayed:
        parts += wrap(f"{strayed} thread(s) ran outside their homes: affrun doctor --pid {job.pid} names them and "
                      "the fix", width, PLAIN, first="warning: ", indent=0)
    if any(not r.planned for r in job.ranks):
        parts += wrap("a rank without a thread plan (no AFFRUN_* variables, or an AFFRUN_CPUS that cannot be its "
                      "binding: affrun doctor --pid says which) shows where its threads ran, with no homes and no "
                      "strays", width, DIM)
    return vstack(parts)


def live_picture(topo: Topology, job: LiveJob, color: bool = False, width: int = TERMINAL_WIDTH) -> str:
    return render_text(draw_live(topo, job, max(width, 40), color), color)


def live_document(topo: Topology, job: LiveJob, html: bool) -> str:
    """The live picture as an SVG document, or an HTML page (``html``): what ``affrun show --pid --svg`` writes."""
    return document(draw_live(topo, job, SVG_WIDTH, True), f"{TITLE} --pid {job.pid}", html)
