"""``--gpu-order closest``: mpibind's order, and Slurm's ``--gpu-bind=closest``. Pure; one of the GPU orders of
:mod:`launcher.plan.homes`. The rule: docs/how-it-decides.md, step 2; mpibind's answers: docs/planner.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.base.split import balanced_sizes
from launcher.plan.geometry import (
    CLAIM_GPU_NODE,
    CLAIM_NEAR,
    GpuHome,
    Homes,
    Layout,
    balanced_chunks,
    nname,
    proportional,
)
from launcher.plan.request import Request

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


def closest_order(req: Request, gpus: Sequence[GpuHome], layout: Layout) -> tuple[Homes, list[str]]:
    """mpibind's order: ranks in CPU order, spread over the GPU domains or sharing their GPUs; in the whole-core
    modes each node's rank count is fitted to its cores before ranks are numbered and GPUs chosen."""
    pos, pkg, cap = layout.pos, layout.pkg, layout.cap
    out = Homes({}, {}, {}, {})
    warnings: list[str] = []
    located = sorted((g for g, h in enumerate(gpus) if h.node is not None), key=lambda g: (pos[gpus[g].node or 0], g))
    unlocated = [g for g, h in enumerate(gpus) if h.node is None]
    home = {g: gpus[g].node or 0 for g in located}
    rank = 0
    if req.nproc <= len(gpus):
        picked = _spread_pick(located, min(req.nproc, len(located)), [lambda g: pkg[home[g]], lambda g: home[g]])
        lives = {g: home[g] for g in picked}
        if cap is not None:
            picked = _repick(layout, picked, located, home)
            lives = _fit_picks(layout, picked, home)
        for g in sorted(picked, key=lambda g: (pos[lives[g]], pos[home[g]], g)):
            out.gpu_of[rank], out.home_of[rank], out.claim[rank] = g, lives[g], gpus[g].claim
            out.reasons[rank] = [f"closest order: {gpus[g].why}"]
            if lives[g] != home[g]:
                warnings.append(f"rank {rank}: node {nname(home[g])} has {cap[home[g]] if cap else 0} core(s) for "
                                f"more ranks; placed on node {nname(lives[g])}, away from its GPU {g}")
            rank += 1
        for g in unlocated[: req.nproc - rank]:
            out.gpu_of[rank], out.reasons[rank] = g, [gpus[g].why]
            rank += 1
        return out, warnings
    for g in unlocated:  # a GPU with no locality serves one rank, which is spread like a CPU-only rank
        out.gpu_of[rank], out.reasons[rank] = g, [gpus[g].why]
        rank += 1
    if not located:
        for extra in range(rank, req.nproc):
            out.reasons[extra] = ["no GPU for this rank"]
        return out, warnings
    node_order = layout.node_order
    gpus_at: dict[int, list[int]] = {}
    for g in located:
        gpus_at.setdefault(home[g], []).append(g)
    domain = _domains(layout, gpus_at)
    count = proportional(req.nproc - rank, {n: len(gpus_at.get(n, ())) for n in node_order}, node_order)
    lent: dict[int, list[int]] = {n: [] for n in node_order}  # node -> the GPU node each of its last ranks serves
    if cap is not None:
        count, moves = _capped(layout, count, domain)
        # A GPU node with fewer cores than GPUs keeps, of the ranks it gave away, as many as it has GPUs without
        # a rank: no GPU idles while others are shared (those ranks live away from their GPU, with a warning).
        short = {d: max(0, len(gpus_at[d]) - count[d]) for d in gpus_at}
        for d, to, moved in moves:
            keep = min(moved, short.get(d, 0))
            lent[to] += [d] * keep
            short[d] = short.get(d, 0) - keep
    own: dict[int, list[int]] = {d: [] for d in gpus_at}  # domain -> its ranks on the GPU node itself
    far: dict[int, list[int]] = {d: [] for d in gpus_at}  # ... and on GPU-less nodes of the domain, or lent
    for n in node_order:
        # CPU order, GPU by GPU: ranks lent to a GPU node before this one, the node's own, those lent to one after
        before = sorted((d for d in lent[n] if pos[d] < pos[n]), key=lambda d: pos[d])
        after = sorted((d for d in lent[n] if pos[d] > pos[n]), key=lambda d: pos[d])
        serves: list[int | None] = [*before, *[None] * (count[n] - len(before) - len(after)), *after]
        for lender in serves:
            out.home_of[rank] = n
            out.claim[rank] = CLAIM_GPU_NODE if n in gpus_at else CLAIM_NEAR
            (far[lender] if lender is not None else own[n] if n in gpus_at else far[domain[n]]).append(rank)
            rank += 1
    for d, at in gpus_at.items():
        for g, sharers in zip(at, _share_gpus(len(at), own[d], far[d])):
            for r in sharers:
                out.gpu_of[r] = g
                n = out.home_of[r] or 0
                where = "" if n == d else f"; node {nname(n)} is in its domain"
                out.reasons[r] = [f"closest order: {gpus[g].why}, shared by {len(sharers)} rank(s){where}"]
                if n != d and domain.get(n) != d:
                    out.reasons[r] = [f"closest order: {gpus[g].why}, shared by {len(sharers)} rank(s)"]
                    warnings.append(f"rank {r}: node {nname(d)} has {cap[d] if cap else 0} core(s) for its "
                                    f"{len(at)} GPUs; placed on node {nname(n)}, away from its GPU {g}")
    return out, warnings


def _whole_cores(layout: Layout) -> dict[int, int]:
    """The layout's capacities: these helpers serve only the whole-core modes, where it has them."""
    assert layout.cap is not None, "a whole-core helper called outside exclusive and l3"
    return layout.cap


def _domains(layout: Layout, gpus_at: dict[int, list[int]]) -> dict[int, int]:
    """Node -> the GPU node whose GPUs its ranks use: itself, or for a node without GPU the nearest GPU node
    (distance, then package, then the fewest cores per GPU so far, then CPU order)."""
    by_node, pkg, pos = layout.by_node, layout.pkg, layout.pos
    domain = {d: d for d in gpus_at}
    load = {d: len(by_node[d]) / len(gpus_at[d]) for d in gpus_at}
    for n in layout.node_order:
        if n not in gpus_at:
            d = min(gpus_at, key=lambda d: (layout.distance(n, d), pkg[d] != pkg[n], load[d], pos[d]))
            domain[n] = d
            load[d] += len(by_node[n]) / len(gpus_at[d])
    return domain


def _capped(
    layout: Layout, count: dict[int, int], domain: dict[int, int]
) -> tuple[dict[int, int], list[tuple[int, int, int]]]:
    """``count`` (ranks per node) with no node above its ``cap`` (cores): a node's excess goes to the nearest nodes
    with room (distance, then the nodes of its own GPU domain, then package, then CPU order). Also returns the
    moves, as (from, to, ranks)."""
    pkg, pos, node_order, cap = layout.pkg, layout.pos, layout.node_order, _whole_cores(layout)
    out = dict(count)
    moves: list[tuple[int, int, int]] = []
    for d in node_order:
        while out[d] > cap[d]:
            room = [n for n in node_order if out[n] < cap[n]]
            if not room:  # more ranks than cores: refused before planning; nothing to fit
                return out, moves
            to = min(room, key=lambda n: (layout.distance(d, n), domain.get(n) != domain.get(d), pkg[n] != pkg[d],
                                          pos[n]))
            moved = min(out[d] - cap[d], cap[to] - out[to])
            out[d] -= moved
            out[to] += moved
            moves.append((d, to, moved))
    return out, moves


def _share_gpus(k: int, own: list[int], far: list[int]) -> list[list[int]]:
    """The ranks of one domain on each of its ``k`` GPUs: the GPU node's own ranks in balanced contiguous blocks,
    then the ranks of its GPU-less nodes topping each GPU up, in order, so that the totals differ by at most one."""
    blocks = balanced_chunks(own, k)
    totals = balanced_sizes(len(own) + len(far), k)
    rest = iter(far)
    # own's blocks are never above totals (both are balanced, larger ones first), so each GPU takes its remainder
    return [block + [next(rest) for _ in range(total - len(block))] for block, total in zip(blocks, totals)]


def _repick(layout: Layout, picked: list[int], located: list[int], home: dict[int, int]) -> list[int]:
    """Fewer ranks than GPUs: a node picked for more GPUs than it has cores trades its last picks for unpicked
    GPUs on nodes with room, the nearest first (distance, package, CPU order)."""
    pkg, pos, cap = layout.pkg, layout.pos, _whole_cores(layout)
    chosen = list(picked)
    count: dict[int, int] = {}
    for g in chosen:
        count[home[g]] = count.get(home[g], 0) + 1
    for d in sorted(count, key=lambda n: pos[n]):
        while count[d] > cap[d]:
            spare = [g for g in located if g not in chosen and count.get(home[g], 0) < cap[home[g]]]
            if not spare:
                break
            g = min(spare, key=lambda g: (layout.distance(d, home[g]), pkg[home[g]] != pkg[d], pos[home[g]], g))
            chosen.remove(max((c for c in chosen if home[c] == d), key=lambda c: located.index(c)))
            chosen.append(g)
            count[d] -= 1
            count[home[g]] = count.get(home[g], 0) + 1
    return sorted(chosen, key=located.index)


def _fit_picks(layout: Layout, picked: list[int], home: dict[int, int]) -> dict[int, int]:
    """Picked GPU -> the node its rank lives on: its own, unless the node has more picked GPUs than cores (all
    GPUs in use, or no other GPU had room); then the last ranks of the node live on the nearest nodes with room."""
    pkg, pos, cap = layout.pkg, layout.pos, _whole_cores(layout)
    count = {n: 0 for n in cap}
    for g in picked:
        count[home[g]] += 1
    fitted = _capped(layout, count, {})[0]
    lives = {g: home[g] for g in picked}
    spare = {n: fitted[n] - count[n] for n in cap if fitted[n] > count[n]}
    for d in cap:
        for g in [g for g in picked if home[g] == d][fitted[d]:]:
            if not spare:  # no node has room (more ranks than cores is refused before planning)
                return lives
            to = min(spare, key=lambda n: (layout.distance(d, n), pkg[n] != pkg[d], pos[n]))
            lives[g] = to
            spare[to] -= 1
            if not spare[to]:
                del spare[to]
    return lives


def _spread_pick(gpus: list[int], k: int, levels: list[Callable[[int], int]]) -> list[int]:
    """``k`` of ``gpus`` (in CPU order), spread over the groups of each level in turn (packages, then nodes), in
    proportion to how many GPUs each group holds; inside a group, the first GPUs."""
    if not levels or k >= len(gpus):
        return gpus[:k]
    groups: dict[int, list[int]] = {}
    for g in gpus:
        groups.setdefault(levels[0](g), []).append(g)
    keys = list(groups)
    share = proportional(k, {key: len(groups[key]) for key in keys}, keys)
    return [g for key in keys for g in _spread_pick(groups[key], share[key], levels[1:])]
