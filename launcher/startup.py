"""The startup hook: under ``affrun run``, every Python process binds itself before any user import.

The package installs ``affrun-startup.pth`` into site-packages (see ``build_backend/``). Python's ``site``
module executes its one line at every interpreter start; without ``AFFRUN_RUN`` in the environment the line
is a dictionary lookup and imports nothing. ``affrun run`` sets ``AFFRUN_RUN`` (the role of the first process,
``rank0`` or ``launcher``), ``AFFRUN_PLAN`` (the plan, as for ``affrun torchrun``) and, when it runs inside a
scheduler's task, ``AFFRUN_RUN_TASK`` (the rank variables of that task); then this module decides what the
starting process is (:func:`decide`, pure) and applies it (:func:`main`):

- ``rank``: a launcher's rank (``LOCAL_RANK``, ``SLURM_LOCALID``, ``OMPI_...``: the variables ``affrun exec``
  reads) not bound yet, or a rank started by a bound rank with another rank number (Lightning's ranks 1..N-1,
  started by rank 0). It gets the plan's mask, memory policy and OpenMP/BLAS variables in ``os.environ``.
  With ``AFFRUN_RUN=launcher``, rank variables of the task ``affrun run`` itself runs in (``SLURM_LOCALID`` of
  the batch script or of an srun task, unchanged: ``AFFRUN_RUN_TASK``) are not a rank: they describe the task
  that runs the launcher, not the ranks it starts.
- the first process with no rank variable, when ``AFFRUN_RUN=rank0``: it is rank 0 (Lightning's script, a
  single-process job). ``LOCAL_RANK`` is not set: Lightning reads a set ``LOCAL_RANK`` as "launched externally".
- a script or module with no rank variable started below an unbound launcher (``AFFRUN_LAUNCHER_PID``, set by
  the launcher's own hook), itself no known launcher and no ``multiprocessing`` helper, when the plan has one
  rank or accelerate's simple launcher started it (``ACCELERATE_USE_CPU``, which only that launcher sets): it
  is rank 0. accelerate runs one process without any rank variable for 1 process, ``--cpu``, or no multi-GPU
  configuration.
- ``launcher``: no rank variable and ``AFFRUN_RUN=launcher`` otherwise (torchrun's agent, ``accelerate launch``,
  ``deepspeed`` and the ``launch.py`` it starts): left as it is, so that it never confines the ranks it starts.
- ``worker``: a ``multiprocessing`` child (spawn or forkserver bootstrap) of a bound rank, such as a DataLoader
  worker. It is not rebound as a rank: it moves to the rank's loader CPUs when the plan has some, and drops the
  per-thread placement variables (``OMP_PLACES``, ``OMP_PROC_BIND``) so that its OpenMP runtime cannot pin it to
  the first place of the rank (the DataLoader collapse) nor keep a place list of another rank (a
  ``torch.multiprocessing.spawn`` child that calls :func:`launcher.bind_rank` next).
- ``inherit``: any other process below a bound rank (a helper ``subprocess``, a re-exec of the rank itself):
  already bound, left alone.
- ``skip``: affrun's own processes (``affrun exec`` binds itself; ``affrun doctor`` audits).

``AFFRUN_RUN=probe`` is no role: ``affrun run`` asking whether this interpreter loads the hook
(:mod:`launcher.launch.run_target`). The hook sets :data:`answered_probe` and does nothing else.

A malformed plan or rank variable ends the process with one ``affrun: error:`` line and exit status 2.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from launcher.bind.handoff import ParentPlan
    from launcher.bind.mempolicy import MemResult
    from launcher.env.policy import RankEnvironment
    from launcher.plan.planner import RankPlan

RUN_VARIABLE = "AFFRUN_RUN"
ROLES = ("rank0", "launcher")
# AFFRUN_RUN=probe: affrun run asks an interpreter whether it loads this hook (launcher.launch.run_target). The hook
# answers by setting ``answered_probe`` and does nothing else: it binds nothing and prints nothing.
PROBE = "probe"
answered_probe = False
BOUND_VARIABLE = "AFFRUN_LOCAL_RANK"  # written by every binding (launcher.env.policy.affrun_variables)
# The rank variables of the task affrun run started in, and their identity (launcher.context.local_rank.task_identity), as
# a JSON object: written by affrun run, only when there are some.
TASK_VARIABLE = "AFFRUN_RUN_TASK"
# The pid of the first unbound launcher process, written into its os.environ by its own hook: its children know
# that a launcher is above them.
LAUNCHER_VARIABLE = "AFFRUN_LAUNCHER_PID"
# Set only by accelerate's simple launcher (accelerate/utils/launch.py, prepare_simple_launcher_cmd_env), which
# starts the one training process with no rank variable.
ACCELERATE_SIMPLE = "ACCELERATE_USE_CPU"
# Variables a multiprocessing child of a bound rank must not inherit: they place OpenMP threads per place.
# launcher.env.policy.PLACE_VARIABLES, spelled here: a DataLoader worker's start must not import env and the planner.
PLACEMENT_VARIABLES = ("OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY")

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
    from launcher.bind.handoff import BOOT

    return (BOOT in argv or (len(argv) > 1 and os.path.basename(argv[1]) == "affrun")
            or list(argv[1:3]) == ["-m", "launcher"])


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
    from launcher.base.untrusted import BadJSON, load_json, short
    from launcher.errors import LaunchError

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
    (``ParentPlan.identity``, which every binding writes into ``AFFRUN_PLAN_ID``), each rank's CPUs, and the
    process's real CPU mask."""

    plan_id: str
    rank_cpus: tuple[frozenset[int], ...]
    mask: frozenset[int]

    @property
    def nproc(self) -> int:
        return len(self.rank_cpus)


def bound_rank(environ: Mapping[str, str], check: BoundCheck) -> tuple[int | None, str]:
    """The rank this process is verifiably bound to (``None``: none), and why an inherited marker does not count.

    ``AFFRUN_LOCAL_RANK`` alone proves nothing: any variable can be inherited from another binding (an outer
    ``affrun exec``, a copied environment). It counts when ``AFFRUN_PLAN_ID`` is this plan's identity and the real
    mask lies within that rank's CPUs (a DataLoader worker on the loader CPUs included). A marker of this plan, or
    of no plan, naming a rank outside it is an error."""
    from launcher.base.untrusted import short
    from launcher.bind.handoff import PLAN_ID_VARIABLE
    from launcher.errors import LaunchError

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
    plan and own mask ``check`` gives (:func:`bound_rank`). ``pid`` is the process's own (``None``: unknown).

    Raises :class:`launcher.errors.LaunchError` for a malformed ``AFFRUN_RUN``, rank variable or bound rank.
    """
    from launcher.base.untrusted import short
    from launcher.context.local_rank import LocalRankError, detect_local_rank, same_task
    from launcher.errors import LaunchError

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


def rank_user_env(environ: Mapping[str, str], user_env: Mapping[str, str]) -> dict[str, str]:
    """The environment whose values the env policy judges: ``environ`` with the variables affrun manages taken
    out (a launcher or a bound parent set them, not the user) and the user's own values, snapshot by the
    launcher, put back."""
    from launcher.env.policy import USER_VARIABLES

    out = {k: v for k, v in environ.items() if k not in USER_VARIABLES}
    out.update(user_env)
    return out


def apply_environment(environ: MutableMapping[str, str], set_: Mapping[str, str], unset: Sequence[str]) -> None:
    for name in unset:
        environ.pop(name, None)
    environ.update(set_)


def parent_plan(environ: Mapping[str, str]) -> ParentPlan:
    from launcher.bind.handoff import PLAN_VARIABLE, ParentPlan
    from launcher.errors import LaunchError

    text = environ.get(PLAN_VARIABLE)
    if not text:
        raise LaunchError(f"{RUN_VARIABLE} is set but {PLAN_VARIABLE} is not (both come from affrun run)")
    return ParentPlan.from_env(text)


def bind_running(parent: ParentPlan, rank: RankPlan, environ: Mapping[str, str]) -> tuple[RankEnvironment, MemResult]:
    """What binding a process that is already running takes, for the hook and for ``bind_rank``: the rank's
    variables (judged against the user's own values), its mask and its memory policy, whose result
    ``AFFRUN_MEM`` records. The caller applies the variables (``renv``) where it wants them."""
    from launcher.bind.apply import bind_process
    from launcher.bind.handoff import PLAN_ID_VARIABLE
    from launcher.env.policy import rank_environment
    from launcher.env.rank_line import MEM_VARIABLE, mem_text

    renv = rank_environment(rank, local_world_size=len(parent.plan.ranks),
                            user_env=rank_user_env(environ, parent.user_env), bind=parent.bind,
                            smt=parent.plan.smt, policy=parent.env_policy)
    # numactl cannot wrap a process that is already running: the system call is the in-process backend.
    backend = "syscall" if parent.mem_backend in ("auto", "numactl") else parent.mem_backend
    mem = bind_process(rank.cpus, parent.mem_policy, rank.mem_nodes, backend)
    renv.set[MEM_VARIABLE] = mem_text(mem.policy, mem.nodes)
    renv.set[PLAN_ID_VARIABLE] = parent.identity()  # the proof bound_rank() asks of the process's children
    return renv, mem


def bind_as_rank(parent: ParentPlan, rank_index: int, environ: MutableMapping[str, str], *, why: str) -> list[str]:
    """Bind this process as local rank ``rank_index`` of ``parent``'s plan; return its notes."""
    from launcher.bind.handoff import rank_line
    from launcher.env.rank_line import mem_text
    from launcher.errors import LaunchError

    if not 0 <= rank_index < len(parent.plan.ranks):
        raise LaunchError(f"local rank {rank_index} ({why}) is not in the plan of affrun run "
                          f"({len(parent.plan.ranks)} ranks): give affrun run --nproc-per-node to match the launcher")
    rank = parent.plan.ranks[rank_index]
    renv, mem = bind_running(parent, rank, environ)
    apply_environment(environ, renv.set, renv.unset)
    notes = [*mem.warnings, *renv.notes]
    if parent.mem_backend == "numactl" and mem.policy != "none":
        notes.append("--mem-backend numactl: applied with set_mempolicy instead (the process is already running)")
    if parent.verbose:
        host = os.uname().nodename
        print(rank_line(rank, len(parent.plan.ranks), mem_text(mem.policy, mem.nodes), host)
              + f" pid {os.getpid()} ({why})", file=sys.stderr)
        for note in notes:
            print(f"affrun: note: rank {rank_index}: {note}", file=sys.stderr)
    return notes


def bind_as_worker(bound: int, environ: MutableMapping[str, str]) -> None:
    """A multiprocessing child of bound rank ``bound``: its loader CPUs when the plan has some, no placement."""
    from launcher.base.cpulist import parse_cpulist
    from launcher.base.untrusted import short

    try:
        loader = parse_cpulist(environ.get("AFFRUN_LOADER_CPUS", ""))
    except ValueError:
        from launcher.errors import LaunchError

        raise LaunchError(f"AFFRUN_LOADER_CPUS={short(environ.get('AFFRUN_LOADER_CPUS'))} is not a cpu list") from None
    if loader:
        from launcher.bind.apply import bind_process

        bind_process(sorted(loader), "none", (), "syscall")
    apply_environment(environ, {}, PLACEMENT_VARIABLES)


_done = False


def bound_check(parent: ParentPlan) -> BoundCheck:
    """This process's :class:`BoundCheck` against ``parent``: its plan's identity and its real mask."""
    return BoundCheck(parent.identity(), tuple(frozenset(r.cpus) for r in parent.plan.ranks),
                      frozenset(os.sched_getaffinity(0)))


def hook() -> None:
    """Decide what this process is and apply it; :class:`launcher.errors.AffrunError` for anything wrong."""
    if affrun_process(sys.orig_argv):
        return
    parent = parent_plan(os.environ)
    decision = decide(os.environ, sys.orig_argv, bound_check(parent), pid=os.getpid())
    if decision.action == "launcher":
        os.environ.setdefault(LAUNCHER_VARIABLE, str(os.getpid()))  # its children: a launcher is above
    elif decision.action == "rank" and decision.rank is not None:
        bind_as_rank(parent, decision.rank, os.environ, why=decision.reason)
    elif decision.action == "worker" and decision.rank is not None:
        bind_as_worker(decision.rank, os.environ)


def fail(line: str, status: int) -> None:
    """End the process with ``line`` on file descriptor 2 (when it is open: ``2>&-`` closes it) and ``status``;
    never on stdout, never through ``SystemExit`` (``site`` would print it as a failed .pth line and go on to
    run the user's code unbound)."""
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
    except (OSError, ValueError):
        pass
    try:
        os.write(2, (line + "\n").encode("utf-8", "replace"))
    except OSError:
        pass
    os._exit(status)


def main() -> None:
    """Run by ``affrun-startup.pth`` (through ``_affrun_startup``) when ``AFFRUN_RUN`` is set, once per process
    (``site`` may read the site-packages directory twice, through a ``lib64`` link). With stderr closed
    (``sys.stderr`` is None) what the hook prints goes nowhere, not to stdout, as ``print`` would send it."""
    global _done, answered_probe
    if _done:
        return
    _done = True
    if os.environ.get(RUN_VARIABLE) == PROBE:
        answered_probe = True
        return
    from launcher.errors import AffrunError, LaunchError, error_line

    closed = sys.stderr is None
    if closed:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # closed below
    try:
        hook()
    except AffrunError as exc:
        from launcher.options.table import spell_error

        fail(error_line(spell_error(exc)), exc.exit_code)
    except Exception as exc:  # a fault of the hook itself: still one line, and no user code unbound
        fail(error_line(LaunchError(f"the startup hook failed: {type(exc).__name__}: {exc}")), 2)
    finally:
        if closed:
            sys.stderr.close()
            sys.stderr = None
