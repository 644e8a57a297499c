"""What a Python process is under ``affrun run`` (:func:`decide`, pure): a rank to bind, a worker or helper of a
bound rank, a launcher to leave alone, or affrun's own process, and the variables that carry it.

The roles, in order: docs/launchers.md; their reasons: docs/design.md §9.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from launcher.env.variables import BOUND_VARIABLE, PLAN_ID_VARIABLE

RUN_VARIABLE = "AFFRUN_RUN"
ROLES = ("rank0", "launcher")
# AFFRUN_RUN=probe: affrun run asks whether an interpreter loads the hook; the hook only answers (binds nothing).
PROBE = "probe"
# How children start `affrun exec`: `-c` puts the cwd at sys.path[0], dropped so that a user's `launcher/` is not
# imported (docs/design.md §9).
BOOT = "import sys; del sys.path[0]; from launcher.main import main; main()"
# The rank variables of the task affrun run started in, with their identity (task_identity), as a JSON object.
TASK_VARIABLE = "AFFRUN_RUN_TASK"
# The pid of the first unbound launcher process, written by its own hook for its children.
LAUNCHER_VARIABLE = "AFFRUN_LAUNCHER_PID"
# affrun's launchers: below affrun run each is a job of its own, and affrun run's variables are taken from it.
OWN_JOBS = ("exec", "torchrun", "sbatch")
# Set only by accelerate's simple launcher, which starts its one process with no rank variable.
ACCELERATE_SIMPLE = "ACCELERATE_USE_CPU"

Action = Literal["rank", "worker", "inherit", "launcher", "skip"]


@dataclass(frozen=True)
class Decision:
    action: Action
    rank: int | None  # the local rank bound (rank), or the bound rank a worker belongs to (worker, inherit)
    reason: str


def multiprocessing_child(argv: Sequence[str]) -> bool:
    """A process started by ``multiprocessing``'s spawn or forkserver method (or its resource tracker)."""
    if "--multiprocessing-fork" in argv:
        return True
    try:
        code = argv[list(argv).index("-c") + 1]
    except (ValueError, IndexError):
        return False
    return code.startswith("from multiprocessing.")


def affrun_process(argv: Sequence[str]) -> bool:
    """``affrun ...`` itself (console script) or ``affrun exec`` as ``affrun torchrun`` starts it."""
    return (BOOT in argv or (len(argv) > 1 and os.path.basename(argv[1]) == "affrun")
            or list(argv[1:3]) == ["-m", "launcher"])


def affrun_command(argv: Sequence[str]) -> str:
    """The command of an :func:`affrun_process` (``exec``, ``torchrun``, ``doctor``...; ``""``: none or unknown)."""
    words = list(argv)
    if BOOT in words:
        rest = words[words.index(BOOT) + 1 :]
    elif words[1:3] == ["-m", "launcher"]:
        rest = words[3:]
    elif len(words) > 1 and os.path.basename(words[1]) == "affrun":
        rest = words[2:]
    else:
        return ""
    return rest[0] if rest else ""


def with_plan_size(environ: Mapping[str, str], nproc: int) -> dict[str, str]:
    """``environ`` with the plan's rank count as the local size where a launcher set a rank but no size
    (Lightning sets ``LOCAL_RANK`` without ``LOCAL_WORLD_SIZE``)."""
    from launcher.context.local_rank import SOURCES

    out = dict(environ)
    for rank_var, size_var in SOURCES:
        if rank_var in out and size_var not in out and rank_var != "SLURM_LOCALID":
            out[size_var] = str(nproc)
    return out


def recorded_task(environ: Mapping[str, str]) -> dict[str, str]:
    """``AFFRUN_RUN_TASK``: the rank variables of the task ``affrun run`` started in (empty when unset)."""
    from launcher.base.errors import LaunchError
    from launcher.base.untrusted import BadJSON, load_json, short

    text = environ.get(TASK_VARIABLE)
    if not text:
        return {}
    try:
        data = load_json(text)
    except BadJSON as exc:
        raise LaunchError(f"{TASK_VARIABLE} is not what affrun run writes: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise LaunchError(f"{TASK_VARIABLE}={short(text)} is not an object of strings (written by affrun run)")
    return {str(k): str(v) for k, v in data.items()}


def below_launcher(environ: Mapping[str, str], argv: Sequence[str], nproc: int, pid: int | None) -> str:
    """Why the process is the one rank a launcher started without a rank variable, or ``""`` when it is not."""
    from launcher.context.launchers import program_is_launcher, python_program

    above = environ.get(LAUNCHER_VARIABLE)
    if not above or (pid is not None and above == str(pid)):
        return ""  # the launcher itself (or its re-exec)
    if python_program(argv)[0] not in ("script", "module") or program_is_launcher(argv):
        return ""  # a launcher's helper: DeepSpeed's launch.py, `python -c ...`, multiprocessing's bootstrap
    if nproc == 1:
        return f"started by launcher pid {above} without a rank variable; the plan has one rank"
    if ACCELERATE_SIMPLE in environ:
        return (f"started by launcher pid {above} without a rank variable, with {ACCELERATE_SIMPLE} "
                "(accelerate's simple launcher: one process)")
    return ""


@dataclass(frozen=True)
class BoundCheck:
    """What tells whether a process is already bound to a rank of the plan it reads: the plan's identity
    (``AFFRUN_PLAN_ID``), each rank's CPUs, and the process's real CPU mask."""

    plan_id: str
    rank_cpus: tuple[frozenset[int], ...]
    mask: frozenset[int]

    @property
    def nproc(self) -> int:
        return len(self.rank_cpus)


def bound_rank(environ: Mapping[str, str], check: BoundCheck) -> tuple[int | None, str]:
    """The rank this process is verifiably bound to (``None``: none), and why an inherited marker does not count:
    ``AFFRUN_LOCAL_RANK`` counts only with this plan's ``AFFRUN_PLAN_ID`` and a mask within that rank's CPUs.
    Raises :class:`LaunchError` for a marker of this plan, or of no plan, naming a rank outside it."""
    from launcher.base.errors import LaunchError
    from launcher.base.untrusted import short

    text = environ.get(BOUND_VARIABLE)
    if text is None:
        return None, ""
    from launcher.base.untrusted import ascii_uint

    bound = ascii_uint(text)
    if bound is None:
        raise LaunchError(f"{BOUND_VARIABLE}={short(text)} is not an integer")
    plan_id = environ.get(PLAN_ID_VARIABLE)
    if plan_id is not None and plan_id != check.plan_id:
        return None, f"{BOUND_VARIABLE}={bound} of another plan ({PLAN_ID_VARIABLE}={short(plan_id, 20)}) ignored"
    if bound >= check.nproc:
        raise LaunchError(f"{BOUND_VARIABLE}={bound} is not a rank of affrun run's plan ({check.nproc} ranks): "
                          f"unset it, or give affrun run --nproc-per-node to match")
    if plan_id is None:
        return None, f"{BOUND_VARIABLE}={bound} without {PLAN_ID_VARIABLE} (not bound by affrun) ignored"
    if not check.mask or not check.mask <= check.rank_cpus[bound]:
        return None, f"{BOUND_VARIABLE}={bound} ignored: the process does not run on that rank's CPUs"
    return bound, ""


def decide(environ: Mapping[str, str], argv: Sequence[str], check: BoundCheck, *, pid: int | None = None) -> Decision:
    """What the process started with ``environ`` and ``argv`` (``sys.orig_argv``) is under ``affrun run``, whose
    plan and own mask ``check`` gives; ``pid`` is its own (``None``: unknown). Raises
    :class:`launcher.errors.LaunchError` for a malformed ``AFFRUN_RUN``, rank variable or bound rank."""
    from launcher.base.errors import LaunchError
    from launcher.base.untrusted import short
    from launcher.context.local_rank import LocalRankError, detect_local_rank, same_task

    role = environ.get(RUN_VARIABLE, "")
    if role not in ROLES:
        raise LaunchError(f"{RUN_VARIABLE}={short(role)} is not one of {', '.join(ROLES)} (set by affrun run)")
    if affrun_process(argv):
        return Decision("skip", None, "affrun's own process")
    nproc = check.nproc
    ranked = environ
    outer: tuple[str, ...] = ()
    if role == "launcher":  # the task affrun run runs in (a Slurm batch script, an srun task) is not a rank
        outer = same_task(environ, recorded_task(environ))
        ranked = {k: v for k, v in environ.items() if k not in outer}
    try:
        detected = detect_local_rank(with_plan_size(ranked, nproc))
    except LocalRankError as exc:
        raise LaunchError(str(exc)) from None
    bound, stale = bound_rank(environ, check)
    stale = f"; {stale}" if stale else ""
    if detected is not None and detected.rank != bound:
        why = f"{detected.source}={detected.rank}"
        return Decision("rank", detected.rank,
                        (why if bound is None else f"{why}, started by bound rank {bound}") + stale)
    if bound is not None:
        if multiprocessing_child(argv):
            return Decision("worker", bound, f"multiprocessing child of bound rank {bound}")
        return Decision("inherit", bound, f"already bound (rank {bound})")
    if role == "rank0":
        return Decision("rank", 0, "first process without a rank variable (AFFRUN_RUN=rank0)" + stale)
    why = below_launcher(environ, argv, nproc, pid)
    if why:
        return Decision("rank", 0, why + stale)
    ignored = f"; {', '.join(outer)} of affrun run's own task ignored" if outer else ""
    return Decision("launcher", None, f"launcher process (AFFRUN_RUN=launcher){ignored}{stale}")
