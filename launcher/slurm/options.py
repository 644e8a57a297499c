"""``affrun sbatch``'s own options, defined once: flags, the kind of value, help, and where each value goes.

This table feeds the click options of ``affrun sbatch`` (:mod:`launcher.cli.sbatch_cmd`), the keys of the YAML
site profiles (:data:`launcher.slurm.profile.KEYS`) and the :class:`~launcher.slurm.script.SbatchSpec` the
script is rendered from (:func:`spec_values`). Defaults are :class:`SbatchSpec`'s own. affrun's planning
options (``--mode``...) are not here: they come from :mod:`launcher.options.table`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from launcher.base.untrusted import unwritable
from launcher.slurm.script import STYLES, SbatchSpec

# The kind of an option's value, which a profile's YAML value is checked against (launcher.slurm.profile):
# "int", "port", "str", "strint", "time", "bool", "lines" (repeatable), or a tuple of allowed strings.
Kind = Any


@dataclass(frozen=True)
class SbatchOption:
    flags: tuple[str, ...]  # as click takes them: ("-N", "--nodes"), ("--exclusive/--no-exclusive",)
    kind: Kind
    help: str
    metavar: str | None = None
    field: str | None = None  # the SbatchSpec field it fills; None: used by the command itself (template)
    blank_is_unset: bool = False  # an empty value means "not given"
    show_default: bool = False

    @property
    def key(self) -> str:
        """The name in a profile (``gpus-per-node``): the long flag without its dashes."""
        return next(f for f in self.flags if f.startswith("--"))[2:].split("/")[0]

    @property
    def param(self) -> str:
        """click's parameter name (``gpus_per_node``)."""
        return self.key.replace("-", "_")

    def spec_value(self, value: Any) -> Any:
        """A command-line or profile value as the SbatchSpec field takes it."""
        if self.kind == "lines":
            return tuple(value)
        if self.kind == "strint":
            return None if value is None or (self.blank_is_unset and value == "") else str(value)
        return value


SBATCH_OPTIONS: tuple[SbatchOption, ...] = (
    SbatchOption(("--style",), STYLES, "torchrun: one task per node runs affrun torchrun (c10d rendezvous on the "
                 "first node); srun: one task per GPU runs affrun exec.", field="style", show_default=True),
    SbatchOption(("--template",), "str", "Render this template instead of the style's (see templates/README.md).",
                 metavar="FILE"),
    SbatchOption(("-N", "--nodes"), "int", "Nodes.", field="nodes", show_default=True),
    SbatchOption(("--gpus-per-node",), "strint", "GPUs per node, as sbatch takes it (4 or a100:4).",
                 metavar="[TYPE:]N", field="gpus_per_node", blank_is_unset=True),
    SbatchOption(("--ntasks-per-node",), "int", "Ranks per node (srun style: tasks; torchrun style: "
                 "--nproc-per-node). Default: one per GPU.", field="ntasks_per_node"),
    SbatchOption(("-c", "--cpus-per-task"), "int", "CPUs of each task (torchrun style: of the node's one task). "
                 "Default: all the job has there.", field="cpus_per_task"),
    SbatchOption(("-t", "--time"), "time", "Time limit (sbatch --time).", metavar="TIME", field="time"),
    SbatchOption(("-p", "--partition"), "str", "Partition.", metavar="NAME", field="partition"),
    SbatchOption(("-A", "--account"), "str", "Account to charge.", metavar="NAME", field="account"),
    SbatchOption(("-q", "--qos"), "str", "Quality of service.", metavar="NAME", field="qos"),
    SbatchOption(("-C", "--constraint"), "str", "Node features (sbatch --constraint).", metavar="LIST",
                 field="constraint"),
    SbatchOption(("-J", "--job-name"), "str", "Job name.", metavar="NAME", field="job_name"),
    SbatchOption(("--output",), "str", "The job's stdout file (sbatch --output, e.g. logs/%x-%j.out).",
                 metavar="PATTERN", field="output"),
    SbatchOption(("-e", "--error"), "str", "The job's stderr file (sbatch --error).", metavar="PATTERN",
                 field="error"),
    SbatchOption(("--mem",), "strint", "Memory per node (sbatch --mem).", metavar="SIZE", field="mem"),
    SbatchOption(("--exclusive/--no-exclusive",), "bool", "Whole nodes.", field="exclusive"),
    SbatchOption(("--sbatch-line",), "lines", "An extra #SBATCH line, e.g. --sbatch-line=--mail-type=END "
                 "(repeatable).", metavar="OPTION", field="sbatch_lines"),
    SbatchOption(("--setup",), "lines", "A shell line run before srun: module load, venv activation (repeatable).",
                 metavar="LINE", field="setup"),
    SbatchOption(("--rdzv-port",), "port", "Rendezvous / MASTER_PORT port. Default: 20000 + SLURM_JOB_ID % 10000.",
                 field="rdzv_port"),
    SbatchOption(("--affrun-command", "--affrun"), "str", "How the job runs affrun, a shell command (e.g. "
                 "'/path/venv/bin/affrun' or 'python -m launcher'). Default: the absolute path of the affrun "
                 "writing the script, so the job needs no affrun on its PATH.", metavar="CMD", field="affrun"),
)


def this_affrun() -> str:
    """The absolute path of the affrun that runs now, as a shell word: the ``affrun`` script it was started as
    (``sys.argv[0]``), else the one beside this interpreter (a venv's ``bin/affrun``), else ``python -m launcher``
    with this interpreter's absolute path. ``affrun sbatch`` writes it into the job unless told otherwise."""
    import os
    import shlex
    import sys

    started_as = sys.argv[0] if sys.argv else ""
    candidates = [started_as] if os.path.basename(started_as) == "affrun" else []
    candidates.append(os.path.join(os.path.dirname(sys.executable), "affrun"))
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return shlex.quote(os.path.abspath(path))
    return shlex.join([os.path.abspath(sys.executable), "-m", "launcher"])

_SPEC_DEFAULTS = {f.name: f.default for f in fields(SbatchSpec)}


def default_of(option: SbatchOption) -> Any:
    """The option's default: its SbatchSpec field's (``()`` for repeatable options), else none; none for the
    affrun command too, which :func:`this_affrun` fills in when neither a flag nor a profile gave it."""
    if option.field is None or option.field == "affrun":
        return None
    return _SPEC_DEFAULTS[option.field]


def spec_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The SbatchSpec fields of sbatch's own options, from click's parameter values."""
    return {o.field: o.spec_value(values[o.param]) for o in SBATCH_OPTIONS if o.field is not None}


class BadValue(ValueError):
    """A value ``affrun sbatch`` refuses; the message says why (``expected an integer from 1``), and the caller
    says where it came from (``--nodes 99...``, or a site profile's file and key)."""


def check_value(value: object, kind: Kind) -> Any:
    """One validation for a value of ``kind`` (see :data:`Kind`), whether it came from the command line (click
    has turned counts into ints, a repeatable option into a tuple) or from a YAML site profile; returns the
    value as the script is written from it (a "strint" is the string, without surrounding white space: the value
    written is the value checked). Every string goes through :func:`launcher.base.untrusted.unwritable`: no control
    character (Cc, Zl, Zp) but a tab, in a script line or a one-line value."""
    if isinstance(value, int) and value.bit_length() > 63:
        raise BadValue("expected a smaller number")  # beyond any count, port or size sbatch takes
    for text in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(text, str):
            bad = unwritable(text)
            if bad is not None:
                raise BadValue(f"cannot contain {bad}")
    if isinstance(kind, tuple):
        if not isinstance(value, str) or value not in kind:
            raise BadValue(f"expected one of {', '.join(kind)}")
        return value
    if kind in ("int", "count", "port"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadValue("expected an integer")
        low, high = {"int": (1, None), "count": (0, None), "port": (1, 65535)}[kind]
        if value < low or (high is not None and value > high):
            raise BadValue(f"expected an integer from {low}" + (f" to {high}" if high else ""))
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise BadValue("expected true or false")
        return value
    if kind == "time":
        if not isinstance(value, str):
            raise BadValue('expected a string in quotes, such as "1:00:00" or "60" (YAML reads 1:00:00 as the '
                           "number 3600)")
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise BadValue("expected a string")
        return value
    if kind == "strint":
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise BadValue("expected a string or a number")
        return str(value).strip()
    if kind == "lines":
        if isinstance(value, str):
            return [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise BadValue("expected a string or a list of strings")
        return list(value)
    raise AssertionError(kind)  # pragma: no cover
