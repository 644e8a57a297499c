"""Facts about the Slurm step a process runs in, each a pure function of its environment (standard library only,
no I/O). What Slurm sets, as measured: docs/design.md §8."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.base.cpulist import MAX_CPU_ID
from launcher.base.untrusted import ascii_hex, ascii_uint, clip

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "cpu_bind_masks",
    "expand_counts",
    "in_slurm_step",
    "parse_version",
    "slurm_global_visible",
    "slurm_gpu_ids",
    "srun_inherits_cpus_per_task",
    "step_cpus_for_planning",
    "tasks_on_node",
    "version_text",
]

# The most nodes a per-node count list may describe once expanded (docs/design.md §8).
MAX_NODES = 1 << 20


def expand_counts(value: str) -> list[int]:
    """Slurm's compressed per-node counts expanded: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``. :class:`ValueError` on
    anything else, and for lists of more than :data:`MAX_NODES` nodes."""
    out: list[int] = []
    for part in value.split(","):
        count, repeat = _count(part)
        if count is None or repeat is None:
            raise ValueError(f"not a Slurm per-node count list: {clip(value)!r}")
        if len(out) + repeat > MAX_NODES:
            raise ValueError(f"{clip(value)!r} describes more than {MAX_NODES} nodes")
        out.extend([count] * repeat)
    return out


def _count(part: str) -> tuple[int | None, int | None]:
    """``" 2(x3)"`` -> ``(2, 3)``, ``"2"`` -> ``(2, 1)``: 1 to 20 ASCII digits each (``None`` for anything else)."""
    count, paren, rest = part.strip().partition("(x")
    repeat = "1"
    if paren:
        if not rest.endswith(")"):
            return None, None
        repeat = rest[:-1]
    if len(count) > 20 or len(repeat) > 20:
        return None, None
    return ascii_uint(count), ascii_uint(repeat)


# _count_of_node's answer for a list that describes more than MAX_NODES nodes.
TOO_MANY = -1


def _count_of_node(value: str, node: int) -> int | bool | None:
    """The ``node``-th count of a per-node count list, without expanding it; ``None`` when the list has no entry
    for ``node``, ``False`` when it is not such a list (``1(x99999999999)``: more than :data:`MAX_NODES` nodes)."""
    found: int | None = None
    first = 0  # the first node the part describes
    for part in value.split(","):
        count, repeat = _count(part)
        if count is None or repeat is None:
            return False
        if found is None and first <= node < first + repeat:
            found = count
        first += repeat
        if first > MAX_NODES:  # no cluster has that many nodes: the list cannot be used (the caller falls back)
            return TOO_MANY
    return found


def in_slurm_step(environ: Mapping[str, str]) -> bool:
    """True inside a task started by ``srun`` (not the batch script itself)."""
    return bool(environ.get("SLURM_STEP_ID")) and bool(environ.get("SLURM_LOCALID"))


def tasks_on_node(environ: Mapping[str, str]) -> int | None:
    """Tasks of this step on this node, from the first variable that covers it (docs/design.md §8); ``None`` when
    none does. A variable that is set but malformed is a :class:`ValueError` naming it, never taken as missing."""
    node_text = environ.get("SLURM_NODEID")
    node = 0 if node_text is None else ascii_uint(node_text.strip())
    if node is None:
        raise ValueError(f"SLURM_NODEID={clip(node_text or '', 40)!r} is not a node index")
    too_many = ""  # a list of more nodes than any cluster has: the next variable is asked, else it is the error
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        value = environ.get(name)
        if value is None:
            continue
        found = _count_of_node(value, node)
        if found is False:
            raise ValueError(f"{name}={clip(value, 40)!r} is not a Slurm per-node task count list "
                             "(expected e.g. 4 or 2(x3),1)")
        if found == TOO_MANY:
            too_many = too_many or f"{name}={clip(value, 40)!r} describes more than {MAX_NODES} nodes"
            continue
        if found is not None:
            return found
    value = environ.get("SLURM_NTASKS_PER_NODE")
    if value is None:
        if too_many:
            raise ValueError(too_many)
        return None
    count = ascii_uint(value.strip())
    if count is None:
        raise ValueError(f"SLURM_NTASKS_PER_NODE={clip(value, 40)!r} is not a number of tasks")
    return count


def slurm_gpu_ids(environ: Mapping[str, str]) -> tuple[tuple[int, ...], str] | None:
    """The node-global ids of the GPUs Slurm gave this step and the variable they came from (``SLURM_STEP_GPUS``,
    or ``SLURM_JOB_GPUS`` in the batch step); ``None`` when Slurm gave no list of plain numbers (MIG, sharding)."""
    names = ("SLURM_STEP_GPUS",) if environ.get("SLURM_STEP_ID") else ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
    for name in names:
        value = environ.get(name)
        if value is None:
            continue
        ids = [ascii_uint(v.strip()) for v in value.split(",") if v.strip()]
        if not ids or None in ids:
            return None
        return tuple(i for i in ids if i is not None), name
    return None


def slurm_global_visible(value: str, environ: Mapping[str, str], pool_size: int) -> str | None:
    """A ``CUDA_VISIBLE_DEVICES``-style index list as node-global GPU ids, read through Slurm's ids when it counts
    within them (docs/design.md §8); ``None``: keep ``value`` (already global, UUIDs, Slurm ids beyond the
    ``pool_size`` GPUs here)."""
    slurm = slurm_gpu_ids(environ)
    if slurm is None:
        return None
    slurm_ids = slurm[0]
    numbers = [ascii_uint(v.strip()) for v in value.split(",") if v.strip()]
    if not numbers or None in numbers or any(i >= pool_size for i in slurm_ids):
        return None
    positions = [p for p in numbers if p is not None]
    if positions == list(slurm_ids) or any(p >= len(slurm_ids) for p in positions):
        return None
    return ",".join(str(slurm_ids[p]) for p in positions)


def slurm_bound(environ: Mapping[str, str]) -> bool:
    """srun bound this task (``--cpu-bind`` other than none): its mask is its own, narrower than its parent's."""
    return environ.get("SLURM_CPU_BIND_TYPE", "").split(",")[0].strip() not in ("", "none", "none:")


def cpu_bind_masks(environ: Mapping[str, str]) -> list[frozenset[int]] | None:
    """The per-task CPU masks ``task/affinity`` gave the tasks of this node (``SLURM_CPU_BIND_LIST``); ``None``
    when Slurm did not bind them or the binding is not a mask/map list."""
    kind = environ.get("SLURM_CPU_BIND_TYPE", "")
    value = environ.get("SLURM_CPU_BIND_LIST", "")
    if not value or not kind.startswith(("mask_cpu", "map_cpu")):
        return None
    masks: list[frozenset[int]] = []
    for item in value.split(","):
        item = item.strip()
        if not kind.startswith("mask_cpu"):  # map_cpu: one CPU id per task
            cpu = ascii_uint(item)
            if cpu is None or cpu > MAX_CPU_ID:
                return None
            masks.append(frozenset({cpu}))
            continue
        number = ascii_hex(item, max_digits=(MAX_CPU_ID + 1) // 4)
        if number is None or number.bit_length() > MAX_CPU_ID + 1:
            return None
        masks.append(frozenset(bit for bit in range(number.bit_length()) if number >> bit & 1))
    return masks or None


def step_cpus_for_planning(
    environ: Mapping[str, str], task_mask: frozenset[int], cpuset: frozenset[int] | None
) -> tuple[frozenset[int], str | None]:
    """The CPU set every task of this node plans over (the step's ``cpuset``, else the union of
    ``SLURM_CPU_BIND_LIST``, where it holds ``task_mask``; else ``task_mask``: docs/design.md §8), and a note when
    it differs from ``task_mask``."""
    if not in_slurm_step(environ):
        return task_mask, None
    if cpuset is not None and task_mask < cpuset:
        return cpuset, f"Slurm bound this task to CPUs {_fmt(task_mask)}; planning over the step's cpuset {_fmt(cpuset)}"
    masks = cpu_bind_masks(environ)
    if masks:
        union = frozenset().union(*masks)
        if task_mask < union:
            return union, (f"Slurm bound this task to CPUs {_fmt(task_mask)}; planning over the step's CPUs "
                           f"{_fmt(union)} (SLURM_CPU_BIND_LIST)")
    return task_mask, None


def _fmt(cpus: frozenset[int]) -> str:
    from launcher.base.cpulist import format_cpulist

    return format_cpulist(cpus)


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``"slurm 22.05.8"`` (the output of ``srun --version``) -> ``(22, 5, 8)``; ``None`` if there is none."""
    import re

    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def version_text(version: tuple[int, int, int]) -> str:
    """``(22, 5, 8)`` -> ``"22.05.8"``, as Slurm writes its versions."""
    return f"{version[0]}.{version[1]:02d}.{version[2]}"


def srun_inherits_cpus_per_task(version: tuple[int, int, int]) -> bool:
    """False for Slurm 22.05.0 up to 23.02.4, whose ``srun`` ignores the job's ``--cpus-per-task``
    (docs/design.md §8)."""
    return not ((22, 5, 0) <= version < (23, 2, 5))
