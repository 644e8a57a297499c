"""Where each rank lives: its visible GPU and its home NUMA node. Pure; a part of :mod:`launcher.plan`.

GPU orders:

* ``rank`` (torch's convention): rank *i* uses visible GPU *i* and lives on that GPU's node.
* ``closest`` (mpibind, Slurm's ``--gpu-bind=closest``): ranks follow CPU order. With no more ranks than GPUs,
  the ranks are spread over the GPU domains (packages first, then nodes, in proportion to their GPUs) and each
  takes one GPU. With more ranks than GPUs, the ranks go to the GPU nodes in proportion to their GPUs, and the
  ranks of a node share its GPUs in balanced, contiguous blocks.

  In the whole-core modes a node never gets more ranks than cores, and that is settled *before* ranks are
  numbered and GPUs chosen: a node's share above its cores goes to the nearest nodes with room (distance, then
  the nodes of its own GPU domain, then package, then CPU order). A node without GPU belongs to the domain of the
  nearest GPU node (distance, package, fewest cores per GPU so far); its ranks top that node's GPUs up so that
  their sharers differ by at most one. With fewer ranks than GPUs, a node picked for more GPUs than it has cores
  trades its last picks for free GPUs on the nearest nodes with room; only when every GPU is in use does a rank
  live away from its GPU, with a warning. So the overflow fix-up below never moves a closest-order rank.
"""

from __future__ import annotations

from launcher.cpulist import format_cpulist
from launcher.errors import PlanError
from launcher.records import dataclass, field
from launcher.topology.model import GPU, Core, Topology

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: launcher/records.py says why
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import TypeVar

    from launcher.plan import Request

    T = TypeVar("T")

# How firmly a rank is tied to its home node; when a node has more ranks than cores, the weakest move first.
CLAIM_SPREAD, CLAIM_NEAR, CLAIM_GPU_NODE = 0, 1, 2


FAR = 1 << 20  # the distance of a node the table does not name


@dataclass
class Homes:
    """Each rank's visible GPU, home node and claim on it (ranks without a home are spread later), and reasons."""

    gpu_of: dict[int, int] = field(default_factory=dict)
    home_of: dict[int, int] = field(default_factory=dict)
    claim: dict[int, int] = field(default_factory=dict)
    reasons: dict[int, list[str]] = field(default_factory=dict)


def nname(node: int) -> str:
    return "?" if node == -1 else str(node)


def package_of(cores: Sequence[Core]) -> int:
    """The package holding most of ``cores`` (the lowest on a tie)."""
    counts: dict[int, int] = {}
    for c in cores:
        counts[c.package] = counts.get(c.package, 0) + 1
    return max(counts, key=lambda p: (counts[p], -p))


def distance(topo: Topology, a: int, b: int) -> int:
    node = topo.node(a)
    return node.distances.get(b, FAR) if node else FAR


def nearest(topo: Topology, origin: int, candidates: Sequence[int]) -> int:
    """The candidate nearest to ``origin`` by the distance table; the first candidate on a tie."""
    return min(candidates, key=lambda n: (distance(topo, origin, n), candidates.index(n)))


def proportional(k: int, weights: dict[int, int], order: Sequence[int]) -> dict[int, int]:
    """Share ``k`` among ``order`` in proportion to ``weights``: floors, then the largest remainders (ties to the
    earlier key). No key gets more than ``ceil(k * w / total)``."""
    total = sum(weights[n] for n in order)
    if total == 0:
        return {n: 0 for n in order}
    share = {n: k * weights[n] // total for n in order}
    by_remainder = sorted(order, key=lambda n: (-(k * weights[n] % total), order.index(n)))
    for n in by_remainder[: k - sum(share.values())]:
        share[n] += 1
    return share


def balanced_chunks(items: Sequence[T], k: int) -> list[list[T]]:
    """Cut ``items`` into ``k`` contiguous chunks whose sizes differ by at most one (larger ones first)."""
    base, extra = divmod(len(items), k)
    out: list[list[T]] = []
    start = 0
    for i in range(k):
        size = base + (1 if i < extra else 0)
        out.append(list(items[start : start + size]))
        start += size
    return out


def assign_homes(
    topo: Topology, req: Request, by_node: dict[int, list[Core]], node_order: list[int], warnings: list[str]
) -> Homes:
    """Every rank's GPU and home node, by ``req.gpu_order`` or ``req.gpus``; ranks without one are spread over
    the nodes, and (whole-core modes) nodes with more ranks than cores give the excess to the nearest node."""
    visible = topo.visible_gpus() if req.use_gpus else ()
    if req.gpus is not None:
        for g in req.gpus:
            if g < 0 or g >= len(visible):
                raise PlanError(f"GPU {g} does not exist: {len(visible)} GPU(s) are visible")
    located = [gpu_home(topo, gpu, f"GPU {i} ({gpu.pci})", by_node, node_order) for i, gpu in enumerate(visible)]
    homes = [h for h, _, _, _ in located]
    claims = [c for _, c, _, _ in located]
    labels = [why for _, _, why, _ in located]
    out = Homes()
    if req.gpu_order == "closest" and req.gpus is None and visible:
        _closest(topo, req, homes, claims, labels, by_node, node_order, out, warnings)
    else:
        _by_rank(req, len(visible), homes, claims, labels, out)
    # Warn only about the GPUs the ranks use, once each.
    used = set(out.gpu_of.values())
    warnings.extend(w for g, (_, _, _, w) in enumerate(located) if w and g in used)
    _spread_homeless(req.nproc, out.home_of, by_node, node_order)
    if req.mode in ("exclusive", "l3"):
        _fix_overflow(topo, out.home_of, out.claim, by_node, warnings)
    return out


def gpu_home(
    topo: Topology, gpu: GPU, label: str, by_node: dict[int, list[Core]], node_order: list[int]
) -> tuple[int | None, int, str, str | None]:
    """The GPU's home node, how firm that is (``CLAIM_*``), why, and a warning when the locality is indirect.

    ``by_node`` holds the usable cores of each node (-1: cores of no known node), ``node_order`` its keys in CPU
    order. Public: ``affrun show`` draws each GPU where this puts it."""
    if gpu.numa_node is not None and gpu.numa_node in by_node:
        return gpu.numa_node, CLAIM_GPU_NODE, f"{label} is on NUMA node {gpu.numa_node}", None
    if gpu.numa_node is not None:
        near = nearest(topo, gpu.numa_node, [n for n in node_order if n != -1] or node_order)
        node = topo.node(gpu.numa_node)
        if node is None:
            why = "is not in the topology"
        elif not node.cpus:
            why = "has no CPUs"
        else:
            why = "has no usable CPUs (not allowed or reserved)"
        warning = f"{label} is on NUMA node {gpu.numa_node}, which {why}; using the nearest node with CPUs, {nname(near)}"
        return near, CLAIM_NEAR, f"{label}: node {gpu.numa_node} {why}, nearest node with CPUs is {nname(near)}", warning
    if gpu.cpus and not gpu.cpus >= topo.online:
        overlap = {n: sum(1 for c in by_node[n] for p in c.pus if p in gpu.cpus) for n in node_order}
        best = max(node_order, key=lambda n: (overlap[n], -node_order.index(n)))
        if overlap[best] > 0:
            return best, CLAIM_NEAR, f"{label} has local CPUs {format_cpulist(gpu.cpus)} (node {nname(best)})", None
    warning = f"{label} has unknown NUMA locality; its rank is spread like a CPU-only rank"
    return None, CLAIM_SPREAD, f"{label} has unknown locality", warning


def _by_rank(req: Request, nvisible: int, homes: list[int | None], claims: list[int], labels: list[str], out: Homes) -> None:
    """Rank order, or explicit ``--gpus``: rank i -> visible GPU i (or ``req.gpus[i]``) -> that GPU's node."""
    for rank in range(req.nproc):
        chosen = req.gpus[rank] if req.gpus is not None else (rank if rank < nvisible else None)
        if chosen is None:
            out.reasons[rank] = ["no GPU for this rank" if nvisible else "no GPU: CPU-only rank"]
            continue
        out.gpu_of[rank] = chosen
        out.reasons[rank] = [labels[chosen]]
        home = homes[chosen]
        if home is not None:
            out.home_of[rank], out.claim[rank] = home, claims[chosen]


def _closest(
    topo: Topology,
    req: Request,
    homes: list[int | None],
    claims: list[int],
    labels: list[str],
    by_node: dict[int, list[Core]],
    node_order: list[int],
    out: Homes,
    warnings: list[str],
) -> None:
    """mpibind's order: ranks in CPU order, spread over the GPU domains or sharing their GPUs (module docstring).

    In the whole-core modes each node's rank count is fitted to its cores *before* ranks are numbered and GPUs
    chosen, so that ranks stay in CPU order and no rank is moved away from its GPU afterwards."""
    pos = {n: i for i, n in enumerate(node_order)}
    pkg = {n: package_of(by_node[n]) for n in node_order}
    cap = {n: len(by_node[n]) for n in node_order} if req.mode in ("exclusive", "l3") else None
    located = sorted((g for g, h in enumerate(homes) if h is not None), key=lambda g: (pos[homes[g] or 0], g))
    unlocated = [g for g, h in enumerate(homes) if h is None]
    home = {g: homes[g] or 0 for g in located}
    rank = 0
    if req.nproc <= len(homes):
        picked = _spread_pick(located, min(req.nproc, len(located)), [lambda g: pkg[home[g]], lambda g: home[g]])
        lives = {g: home[g] for g in picked}
        if cap is not None:
            picked = _repick(topo, picked, located, home, cap, pkg, pos)
            lives = _fit_picks(topo, picked, home, cap, pkg, pos)
        for g in sorted(picked, key=lambda g: (pos[lives[g]], pos[home[g]], g)):
            out.gpu_of[rank], out.home_of[rank], out.claim[rank] = g, lives[g], claims[g]
            out.reasons[rank] = [f"closest order: {labels[g]}"]
            if lives[g] != home[g]:
                warnings.append(f"rank {rank}: node {nname(home[g])} has {cap[home[g]] if cap else 0} core(s) for "
                                f"more ranks; placed on node {nname(lives[g])}, away from its GPU {g}")
            rank += 1
        for g in unlocated[: req.nproc - rank]:
            out.gpu_of[rank], out.reasons[rank] = g, [labels[g]]
            rank += 1
        return
    for g in unlocated:  # a GPU with no locality serves one rank, which is spread like a CPU-only rank
        out.gpu_of[rank], out.reasons[rank] = g, [labels[g]]
        rank += 1
    if not located:
        for extra in range(rank, req.nproc):
            out.reasons[extra] = ["no GPU for this rank"]
        return
    gpus_at: dict[int, list[int]] = {}
    for g in located:
        gpus_at.setdefault(home[g], []).append(g)
    domain = _domains(topo, gpus_at, by_node, node_order, pkg, pos)
    count = proportional(req.nproc - rank, {n: len(gpus_at.get(n, ())) for n in node_order}, node_order)
    if cap is not None:
        count = _capped(topo, count, cap, domain, pkg, pos, node_order)
    own: dict[int, list[int]] = {d: [] for d in gpus_at}  # domain -> its ranks on the GPU node itself
    far: dict[int, list[int]] = {d: [] for d in gpus_at}  # ... and on GPU-less nodes of the domain
    for n in node_order:
        for _ in range(count[n]):
            out.home_of[rank] = n
            out.claim[rank] = CLAIM_GPU_NODE if n in gpus_at else CLAIM_NEAR
            (own[n] if n in gpus_at else far[domain[n]]).append(rank)
            rank += 1
    for d, gpus in gpus_at.items():
        for g, sharers in zip(gpus, _share_gpus(len(gpus), own[d], far[d])):
            for r in sharers:
                out.gpu_of[r] = g
                where = "" if out.home_of[r] == d else f"; node {nname(out.home_of[r])} is in its domain"
                out.reasons[r] = [f"closest order: {labels[g]}, shared by {len(sharers)} rank(s){where}"]


def _domains(
    topo: Topology,
    gpus_at: dict[int, list[int]],
    by_node: dict[int, list[Core]],
    node_order: list[int],
    pkg: dict[int, int],
    pos: dict[int, int],
) -> dict[int, int]:
    """Node -> the GPU node whose GPUs its ranks use: itself, or for a node without GPU the nearest GPU node
    (distance, then package, then the fewest cores per GPU so far, then CPU order)."""
    domain = {d: d for d in gpus_at}
    load = {d: len(by_node[d]) / len(gpus_at[d]) for d in gpus_at}
    for n in node_order:
        if n not in gpus_at:
            d = min(gpus_at, key=lambda d: (distance(topo, n, d), pkg[d] != pkg[n], load[d], pos[d]))
            domain[n] = d
            load[d] += len(by_node[n]) / len(gpus_at[d])
    return domain


def _capped(
    topo: Topology,
    count: dict[int, int],
    cap: dict[int, int],
    domain: dict[int, int],
    pkg: dict[int, int],
    pos: dict[int, int],
    node_order: list[int],
) -> dict[int, int]:
    """``count`` (ranks per node) with no node above its ``cap`` (cores): a node's excess goes to the nearest nodes
    with room (distance, then the nodes of its own GPU domain, then package, then CPU order)."""
    out = dict(count)
    for d in node_order:
        while out[d] > cap[d]:
            room = [n for n in node_order if out[n] < cap[n]]
            if not room:  # more ranks than cores: refused before planning; nothing to fit
                return out
            to = min(room, key=lambda n: (distance(topo, d, n), domain.get(n) != domain.get(d), pkg[n] != pkg[d], pos[n]))
            moved = min(out[d] - cap[d], cap[to] - out[to])
            out[d] -= moved
            out[to] += moved
    return out


def _share_gpus(k: int, own: list[int], far: list[int]) -> list[list[int]]:
    """The ranks of one domain on each of its ``k`` GPUs: the GPU node's own ranks in balanced contiguous blocks,
    then the ranks of its GPU-less nodes topping each GPU up, in order, so that the totals differ by at most one."""
    blocks = balanced_chunks(own, k)
    totals = [len(b) for b in balanced_chunks(range(len(own) + len(far)), k)]
    rest = iter(far)
    # own's blocks are never above totals (both are balanced, larger ones first), so each GPU takes its remainder
    return [block + [next(rest) for _ in range(total - len(block))] for block, total in zip(blocks, totals)]


def _repick(
    topo: Topology,
    picked: list[int],
    located: list[int],
    home: dict[int, int],
    cap: dict[int, int],
    pkg: dict[int, int],
    pos: dict[int, int],
) -> list[int]:
    """Fewer ranks than GPUs: a node picked for more GPUs than it has cores trades its last picks for unpicked
    GPUs on nodes with room, the nearest first (distance, package, CPU order)."""
    chosen = list(picked)
    count: dict[int, int] = {}
    for g in chosen:
        count[home[g]] = count.get(home[g], 0) + 1
    for d in sorted(count, key=lambda n: pos[n]):
        while count[d] > cap[d]:
            spare = [g for g in located if g not in chosen and count.get(home[g], 0) < cap[home[g]]]
            if not spare:
                break
            g = min(spare, key=lambda g: (distance(topo, d, home[g]), pkg[home[g]] != pkg[d], pos[home[g]], g))
            chosen.remove(max((c for c in chosen if home[c] == d), key=lambda c: located.index(c)))
            chosen.append(g)
            count[d] -= 1
            count[home[g]] = count.get(home[g], 0) + 1
    return sorted(chosen, key=located.index)


def _fit_picks(
    topo: Topology, picked: list[int], home: dict[int, int], cap: dict[int, int], pkg: dict[int, int],
    pos: dict[int, int],
) -> dict[int, int]:
    """Picked GPU -> the node its rank lives on: its own, unless the node has more picked GPUs than cores (all
    GPUs in use, or no other GPU had room); then the last ranks of the node live on the nearest nodes with room."""
    count = {n: 0 for n in cap}
    for g in picked:
        count[home[g]] += 1
    fitted = _capped(topo, count, cap, {}, pkg, pos, list(cap))
    lives = {g: home[g] for g in picked}
    spare = {n: fitted[n] - count[n] for n in cap if fitted[n] > count[n]}
    for d in cap:
        for g in [g for g in picked if home[g] == d][fitted[d]:]:
            if not spare:  # no node has room (more ranks than cores is refused before planning)
                return lives
            to = min(spare, key=lambda n: (distance(topo, d, n), pkg[n] != pkg[d], pos[n]))
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


def _spread_homeless(nproc: int, home_of: dict[int, int], by_node: dict[int, list[Core]], node_order: list[int]) -> None:
    """Give ranks without a home node one, in blocks, in proportion to each node's free cores."""
    homeless = [r for r in range(nproc) if r not in home_of]
    if not homeless:
        return
    used = {n: 0 for n in node_order}
    for n in home_of.values():
        used[n] += 1
    free = {n: max(len(by_node[n]) - used[n], 0) for n in node_order}
    if sum(free.values()) == 0:
        free = {n: len(by_node[n]) for n in node_order}
    quota = proportional(len(homeless), free, node_order)
    it = iter(homeless)
    for n in node_order:
        for _ in range(quota[n]):
            home_of[next(it)] = n


def _fix_overflow(
    topo: Topology, home_of: dict[int, int], claim: dict[int, int], by_node: dict[int, list[Core]], warnings: list[str]
) -> None:
    """Move ranks off nodes that have more ranks than cores, to the nearest node with spare cores.

    The ranks with the weakest claim on the node move first (spread ranks, then ranks placed by distance or
    ``local_cpus``, then ranks whose GPU is on the node), the highest rank first among equals.
    """
    count: dict[int, int] = {n: 0 for n in by_node}
    for n in home_of.values():
        count[n] += 1
    for rank in sorted(home_of, key=lambda r: (claim.get(r, CLAIM_SPREAD), -r)):
        node = home_of[rank]
        if count[node] <= len(by_node[node]):
            continue
        spare = [n for n in by_node if count[n] < len(by_node[n])]
        target = nearest(topo, node, spare)
        count[node] -= 1
        count[target] += 1
        home_of[rank] = target
        warnings.append(
            f"rank {rank}: node {nname(node)} has {len(by_node[node])} core(s) for more ranks; placed on node {nname(target)}"
        )
