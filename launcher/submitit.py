"""submitit front end (docs/submitit.md): :class:`AffinityExecutor`, ``submitit.AutoExecutor`` whose tasks start
through ``affrun exec``, and :func:`current_binding`, inside a task the binding it runs under (or ``None``).
``submitit`` is imported only when an executor is built."""

from __future__ import annotations

import os
import shlex
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.base.errors import ConfigError
from launcher.base.untrusted import short
from launcher.bind.handoff import exec_prefix
from launcher.bind.readback import TaskBinding, current_binding
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

SLURM, LOCAL, DEBUG = "slurm", "local", "debug"  # the executor the AutoExecutor ends up using, as submitit names it

# srun --cpu-bind values that do not bind (only these may be combined with affrun's own binding).
_NON_BINDING = frozenset({"none", "no", "verbose", "v", "quiet", "q"})

# Exported before srun: srun of Slurm 22.05.0 to 23.02.4 does not inherit SLURM_CPUS_PER_TASK (docs/submitit.md).
SRUN_CPUS_SETUP = 'if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"; fi'

AffinityOptions = Options  # affrun's options for every task: the one record, by affrun exec's flag names
AFFRUN_OPTIONS: tuple[str, ...] = KEYWORDS


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
    """The ``python`` hook string for submitit's ``cluster`` executor: on Slurm srun's bash runs it; the local
    executor runs it without a shell, so a ``/bin/sh -c`` stub passes its local rank and task count on."""
    inner = _wrapped_python(user_python)
    prefix = shlex.join([*exec_prefix(), *options.to_argv()])
    if cluster == LOCAL:
        script = (f'exec {prefix} --local-rank "$SUBMITIT_LOCAL_LOCALID" --nproc-per-node "$SUBMITIT_LOCAL_NTASKS" '
                  f'-- {inner} "$@"')
        return shlex.join(["/bin/sh", "-c", script, "affrun-task"])
    return f"{prefix} -- {inner}"


def string_list(keyword: str, value: object, what: str) -> list[str]:
    """submitit's ``slurm_srun_args`` / ``slurm_setup`` as a list of strings, read once (a generator too). One
    string is one item (an srun string with white space is refused: one argument or several?); an item holds no
    control character. Anything else is one ConfigError naming ``keyword``."""
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
    """The user's ``srun`` arguments with ``--cpu-bind=none`` merged in; a ``--cpu-bind`` that binds raises
    ``ConfigError``."""
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


class AffinityExecutor:
    """``submitit.AutoExecutor(folder, cluster, **kwargs)`` whose tasks are bound by ``affrun exec`` before Python
    starts; ``kwargs`` also take affrun's options (:data:`AFFRUN_OPTIONS`), here and in :meth:`update_parameters`.
    The user's python hook, srun arguments and setup lines are merged with affrun's (docs/submitit.md)."""

    def __init__(self, folder: str | Path, cluster: str | None = None, **kwargs: Any) -> None:
        import submitit

        affrun = {k: kwargs.pop(k) for k in list(kwargs) if k in AFFRUN_OPTIONS}
        self._options = AffinityOptions.from_kwargs(**affrun)
        self._user_python = {name: kwargs.pop(f"{name}_python", None) for name in (SLURM, LOCAL)}
        for name, value in self._user_python.items():
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{name}_python={value!r}: expected a shell command string")
        self._user: dict[str, list[str] | None] = {"slurm_srun_args": None, "slurm_setup": None}  # as given
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
        for key, what in (("slurm_srun_args", "srun arguments"), ("slurm_setup", "shell lines")):
            if key in kwargs:
                kwargs[key] = self._user[key] = string_list(key, kwargs[key], what)
        for key, merge in (("slurm_srun_args", merge_srun_args), ("slurm_setup", merge_setup)):
            if key in kwargs and self.cluster == SLURM:
                kwargs[key] = merge(self._user[key])
        if kwargs:
            self._executor.update_parameters(**kwargs)

    def __getattr__(self, name: str) -> Any:  # submit, map_array, submit_array, batch...: AutoExecutor's own
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._executor, name)

    def __repr__(self) -> str:
        return f"AffinityExecutor(folder={str(self.folder)!r}, cluster={self.cluster!r}, options={self._options})"

    def _set_options(self, options: AffinityOptions) -> None:
        if self._executor._delayed_batch is not None:
            raise RuntimeError('Changing parameters within batch context "with executor.batch():" is not allowed')
        self._options = options
        inner = self._executor._executor
        if self.cluster in (SLURM, LOCAL):
            inner.python = task_python(options, self._user_python[self.cluster], self.cluster)  # type: ignore[attr-defined]
