"""submitit front end: every task of a submitit job starts through ``affrun exec`` before Python starts.

Public surface:

* :class:`AffinityExecutor` - ``submitit.AutoExecutor`` plus affrun's planning options (same arguments, same
  ``update_parameters`` / ``submit`` / ``map_array`` / ``submit_array`` / ``batch``);
* :func:`current_binding` - inside a task, the plan entry it runs under (a :class:`TaskBinding`), or ``None``.

The executor prefixes submitit's per-task interpreter (``slurm_python`` / ``local_python``) with ``affrun exec
[OPTIONS] --`` run by this interpreter (:func:`launcher.bind.handoff.exec_prefix`) and, on Slurm, adds
``--cpu-bind=none`` and ``SRUN_CPUS_PER_TASK``; why: docs/submitit.md, docs/design.md §3, §8 and §10.
``submitit`` is imported only when an executor is built, so ``import launcher.submitit`` is cheap and
:func:`current_binding` works in any process ``affrun exec`` started (``affrun torchrun`` workers too). Nothing on
the ``affrun exec`` path imports this module.
"""

from __future__ import annotations

import os
import shlex
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from launcher.base.untrusted import short
from launcher.bind.handoff import exec_prefix
from launcher.bind.readback import TaskBinding, current_binding
from launcher.errors import ConfigError
from launcher.options.record import KEYWORDS, Options

if TYPE_CHECKING:
    import submitit

__all__ = [
    "AFFRUN_OPTIONS",
    "AffinityExecutor",
    "AffinityOptions",
    "TaskBinding",
    "current_binding",
    "merge_srun_args",
    "task_python",
]

R = TypeVar("R")

# The executor that the AutoExecutor ends up using, as submitit names it.
SLURM, LOCAL, DEBUG = "slurm", "local", "debug"

# srun --cpu-bind values that do not bind (only these may be combined with affrun's own binding).
_NON_BINDING = frozenset({"none", "no", "verbose", "v", "quiet", "q"})

# Exported in the batch script before srun: Slurm 22.05.0 to 23.02.4 srun does not inherit SLURM_CPUS_PER_TASK,
# so a step would get one CPU per task whatever cpus_per_task said. Harmless on other versions.
SRUN_CPUS_SETUP = 'if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"; fi'


# ---------------------------------------------------------------------------------------------------- options
# affrun's options for every task, named as ``affrun exec``'s flags (``--loader-cores`` -> ``loader_cores``): the one
# record of them (launcher.options.record.Options), with ``from_kwargs``. CPU and GPU lists may be given as strings
# (``"0,8"``) or as iterables of ints; ``cpu_map`` as ``"0-3;4-7"`` or as a sequence of per-rank lists.
AffinityOptions = Options
AFFRUN_OPTIONS: tuple[str, ...] = KEYWORDS


# ---------------------------------------------------------------------------------------- command construction
def _exec_prefix(options: AffinityOptions) -> list[str]:
    return [*exec_prefix(), *options.to_argv()]


def _wrapped_python(user_python: str | None) -> str:
    """The interpreter command the task finally runs: the user's own hook (a shell string) or this interpreter."""
    if user_python is None or not user_python.strip():
        return shlex.quote(sys.executable)
    try:
        words = shlex.split(user_python)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise ConfigError(f"the python hook {user_python!r} is not a valid shell command: {exc}") from None
    runs_affrun = any(
        (os.path.basename(w) == "affrun" and "exec" in words[i + 1 :])
        or words[i : i + 3] in (["-m", "launcher", "exec"], exec_prefix()[1:])
        for i, w in enumerate(words)
    )
    if runs_affrun:
        raise ConfigError(f"the python hook {user_python!r} already runs affrun exec; AffinityExecutor adds it "
                          "itself: pass your own interpreter command only (e.g. a container wrapper)")
    return user_python


def task_python(options: AffinityOptions, user_python: str | None, cluster: str) -> str:
    """The ``python`` hook string for submitit's ``cluster`` executor.

    Slurm: ``srun`` runs the string (parsed by the batch script's bash); ``affrun exec`` finds the local rank in
    ``SLURM_LOCALID`` / ``SLURM_STEP_TASKS_PER_NODE``. Local: submitit's controller ``shlex.split``s the string
    and starts it without a shell, and its tasks only carry ``SUBMITIT_LOCAL_LOCALID`` / ``SUBMITIT_LOCAL_NTASKS``,
    so a ``/bin/sh -c`` stub passes them to ``affrun exec`` as ``--local-rank`` / ``--nproc-per-node``.
    """
    inner = _wrapped_python(user_python)
    prefix = shlex.join(_exec_prefix(options))
    if cluster == LOCAL:
        script = (f'exec {prefix} --local-rank "$SUBMITIT_LOCAL_LOCALID" --nproc-per-node "$SUBMITIT_LOCAL_NTASKS" '
                  f'-- {inner} "$@"')
        return shlex.join(["/bin/sh", "-c", script, "affrun-task"])
    return f"{prefix} -- {inner}"


def string_list(keyword: str, value: object, what: str) -> list[str]:
    """submitit's ``slurm_srun_args`` / ``slurm_setup`` as a list of strings, read once (a generator too).

    One string is one item (``slurm_setup="module load cuda"`` is one line, ``slurm_srun_args="--mpi=pmix"`` one
    argument), never one item per character; an srun string with white space in it is refused, as it is unclear
    whether it is one argument or several. Items must be strings; a setup line (copied into the batch script as
    shell code) and an srun argument hold no control character (:func:`launcher.base.untrusted.unwritable`). Anything else is one ConfigError naming
    ``keyword``."""
    from launcher.base.untrusted import unwritable

    if value is None:
        return []
    if isinstance(value, str):
        if keyword == "slurm_srun_args" and value.split() != [value]:
            raise ConfigError(f"{keyword}={short(value)}: one string is one srun argument: give a list of "
                              f"{what} (e.g. {value.split()!r})")
        items: list[object] = [value]
    elif isinstance(value, (bytes, bytearray, memoryview, dict)) or not hasattr(value, "__iter__"):
        raise ConfigError(f"{keyword}={short(value)}: expected a list of {what} (strings)")
    else:
        items = list(value)
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"{keyword}: item {short(item)}: expected a string (a list of {what})")
        bad = unwritable(item)
        if bad is not None:
            raise ConfigError(f"{keyword}: item {short(item)} holds {bad}: one item is one "
                              f"{'line' if keyword == 'slurm_setup' else 'argument'}")
    return [item for item in items if isinstance(item, str)]


def merge_srun_args(user_args: Iterable[str] | None) -> list[str]:
    """The user's ``srun`` arguments with ``--cpu-bind=none`` merged in.

    A user ``--cpu-bind`` that only says ``verbose``/``quiet``/``none`` is kept and given ``none``; one that binds
    (``cores``, ``map_cpu:...``, ``mask_cpu:...``, ...) would fight affrun's binding and raises ``ConfigError``.
    """
    args = string_list("slurm_srun_args", user_args, "srun arguments")
    out: list[str] = []
    found = False
    i = 0
    while i < len(args):
        arg = args[i]
        option, eq, value = arg.partition("=")
        if option in ("--cpu-bind", "--cpu_bind"):
            if not eq:
                if i + 1 >= len(args):
                    raise ConfigError(f"slurm_srun_args: {option} has no value")
                value = args[i + 1]
                i += 1
            parts = [p for p in value.split(",") if p]
            binding = [p for p in parts if p.lower() not in _NON_BINDING]
            if binding:
                raise ConfigError(
                    f"slurm_srun_args has {option}={value}, but AffinityExecutor binds every task itself and needs "
                    f"--cpu-bind=none: drop it (use affrun's options, e.g. mode= or cpu_map=, to shape the binding)")
            keep = [p for p in parts if p.lower() not in ("none", "no")]
            out.append("--cpu-bind=" + ",".join([*keep, "none"]))
            found = True
        else:
            out.append(arg)
        i += 1
    if not found:
        out.append("--cpu-bind=none")
    return out


def merge_setup(user_setup: Iterable[str] | None) -> list[str]:
    """The user's batch-script setup lines, then affrun's (``SRUN_CPUS_PER_TASK``)."""
    lines = string_list("slurm_setup", user_setup, "shell lines")
    return lines if SRUN_CPUS_SETUP in lines else [*lines, SRUN_CPUS_SETUP]


# ------------------------------------------------------------------------------------------------------ executor
class AffinityExecutor:
    """``submitit.AutoExecutor`` whose tasks are bound by ``affrun exec`` before Python starts.

    ``AffinityExecutor(folder, cluster=None, **kwargs)``: ``kwargs`` are ``AutoExecutor``'s own
    (``slurm_python``, ``local_python``, ``slurm_max_num_timeout``...) plus affrun's options (:data:`AFFRUN_OPTIONS`:
    ``mode``, ``smt``, ``reserve``, ``loader_cores``, ``comm_cores``, ``main_thread``, ``gpu_order``, ``cpu_map``, ``gpus``,
    ``no_gpu``, ``spill``, ``fsroot``, ``topology``, ``cpus``, ``omp_bind``, ``env_policy``, ``mem_policy``, ``mem_backend``,
    ``nic_env``, ``rank_hooks``, ``verbose``). affrun's
    options may also be changed later through :meth:`update_parameters`.

    The user's ``slurm_python``/``local_python`` is kept and runs *after* ``affrun exec`` (a container wrapper
    inherits the mask and the variables). ``slurm_srun_args`` and ``slurm_setup`` are merged with affrun's
    (``--cpu-bind=none``, ``SRUN_CPUS_PER_TASK``), never overwritten; a binding ``--cpu-bind`` is an error.

    ``cluster="local"`` binds the tasks of the local executor the same way. ``cluster="debug"`` runs each job
    inside this Python process, which affrun cannot rebind before it starts: the executor warns and tasks run
    unbound (``current_binding()`` then describes this process, ``None`` unless it was itself started by affrun).
    """

    def __init__(self, folder: str | Path, cluster: str | None = None, **kwargs: Any) -> None:
        import submitit

        affrun = {k: kwargs.pop(k) for k in list(kwargs) if k in AFFRUN_OPTIONS}
        self._options = AffinityOptions.from_kwargs(**affrun)
        self._user_python = {name: kwargs.pop(f"{name}_python", None) for name in (SLURM, LOCAL)}
        for name, value in self._user_python.items():
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{name}_python={value!r}: expected a shell command string")
        self._user_srun_args: list[str] | None = None
        self._user_setup: list[str] | None = None
        hooks = {f"{name}_python": task_python(self._options, self._user_python[name], name) for name in (SLURM, LOCAL)}
        self._executor = submitit.AutoExecutor(folder=folder, cluster=cluster, **kwargs, **hooks)
        self.cluster: str = self._executor.cluster
        if self.cluster == DEBUG:
            warnings.warn("AffinityExecutor(cluster='debug') runs each job inside this Python process, which affrun "
                          "cannot bind before it starts: tasks run unbound (use cluster='local' to bind them)",
                          RuntimeWarning, stacklevel=2)
        elif self.cluster not in (SLURM, LOCAL):
            warnings.warn(f"AffinityExecutor does not know how to bind tasks of submitit's {self.cluster!r} "
                          "executor: tasks run unbound", RuntimeWarning, stacklevel=2)
        if self.cluster == SLURM:
            self._executor.update_parameters(slurm_srun_args=merge_srun_args(None), slurm_setup=merge_setup(None))

    # -- submitit's surface ------------------------------------------------------------------------------------
    @property
    def executor(self) -> submitit.AutoExecutor:
        """The wrapped ``submitit.AutoExecutor`` (its ``python`` hooks already wrap ``affrun exec``)."""
        return self._executor

    @property
    def options(self) -> AffinityOptions:
        return self._options

    @property
    def folder(self) -> Path:
        return Path(self._executor.folder)

    @property
    def parameters(self) -> dict[str, Any]:
        return dict(self._executor.parameters)

    def update_parameters(self, **kwargs: Any) -> None:
        """``AutoExecutor.update_parameters``, plus affrun's options; srun arguments and setup lines are merged."""
        affrun = {k: kwargs.pop(k) for k in list(kwargs) if k in AFFRUN_OPTIONS}
        if affrun:
            self._set_options(AffinityOptions.from_kwargs(self._options, **affrun))
        if "slurm_srun_args" in kwargs:
            self._user_srun_args = string_list("slurm_srun_args", kwargs["slurm_srun_args"], "srun arguments")
            kwargs["slurm_srun_args"] = self._user_srun_args
        if "slurm_setup" in kwargs:
            self._user_setup = string_list("slurm_setup", kwargs["slurm_setup"], "shell lines")
            kwargs["slurm_setup"] = self._user_setup
        if self.cluster == SLURM:
            if "slurm_srun_args" in kwargs:
                kwargs["slurm_srun_args"] = merge_srun_args(self._user_srun_args)
            if "slurm_setup" in kwargs:
                kwargs["slurm_setup"] = merge_setup(self._user_setup)
        if kwargs:
            self._executor.update_parameters(**kwargs)

    def submit(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> submitit.Job[R]:
        return self._executor.submit(fn, *args, **kwargs)

    def map_array(self, fn: Callable[..., R], *iterable: Iterable[Any]) -> list[submitit.Job[R]]:
        return self._executor.map_array(fn, *iterable)

    def submit_array(self, fns: Sequence[Callable[[], R]]) -> list[submitit.Job[R]]:
        return self._executor.submit_array(fns)

    def batch(self, allow_implicit_submissions: bool = False) -> AbstractContextManager[None]:
        return self._executor.batch(allow_implicit_submissions=allow_implicit_submissions)

    def __getattr__(self, name: str) -> Any:  # anything else AutoExecutor offers (register_dev_folders, ...)
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._executor, name)

    def __repr__(self) -> str:
        return f"AffinityExecutor(folder={str(self.folder)!r}, cluster={self.cluster!r}, options={self._options})"

    # -- internals ---------------------------------------------------------------------------------------------
    def _set_options(self, options: AffinityOptions) -> None:
        if self._executor._delayed_batch is not None:
            raise RuntimeError('Changing parameters within batch context "with executor.batch():" is not allowed')
        self._options = options
        inner = self._executor._executor
        if self.cluster in (SLURM, LOCAL):
            inner.python = task_python(options, self._user_python[self.cluster], self.cluster)  # type: ignore[attr-defined]
