"""``affrun sbatch``'s own options: rows of the one option table (:class:`launcher.options.table.OptionSpec`,
group ``sbatch``), each filling the :class:`~launcher.slurm.script.SbatchSpec` field of its ``dest`` (default
its field's). They make the click options, the site profiles' keys and the spec."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any

from launcher.options.table import OptionSpec
from launcher.slurm.script import STYLES, SbatchSpec

_SPEC_DEFAULTS = {f.name: f.default for f in fields(SbatchSpec) if f.default is not MISSING}


def _row(flag: str, dest: str, kind: str, help: str, **more: Any) -> OptionSpec:
    """An sbatch option, its default its SbatchSpec field's (``--affrun-command``'s: :func:`this_affrun`)."""
    return OptionSpec(flag, dest, "sbatch", help, kind, default=None if dest == "affrun" else _SPEC_DEFAULTS.get(dest),
                      **more)


SBATCH_OPTIONS: tuple[OptionSpec, ...] = (
    _row("--style", "style", "choice", "torchrun: one task per node runs affrun torchrun (c10d rendezvous on the "
         "first node); srun: one task per GPU runs affrun exec.", choices=STYLES),
    _row("--template", "template", "str", "Render this template instead of the style's (see templates/README.md).",
         metavar="FILE"),
    _row("--nodes", "nodes", "int", "Nodes.", short="-N"),
    _row("--gpus-per-node", "gpus_per_node", "strint", "GPUs per node, as sbatch takes it (4 or a100:4).",
         metavar="[TYPE:]N"),
    _row("--ntasks-per-node", "ntasks_per_node", "int", "Ranks per node (srun style: tasks; torchrun style: "
         "--nproc-per-node). Default: one per GPU."),
    _row("--cpus-per-task", "cpus_per_task", "int", "CPUs of each task (torchrun style: of the node's one task). "
         "Default: all the job has there.", short="-c"),
    _row("--time", "time", "time", "Time limit (sbatch --time).", metavar="TIME", short="-t"),
    _row("--partition", "partition", "str", "Partition.", metavar="NAME", short="-p"),
    _row("--account", "account", "str", "Account to charge.", metavar="NAME", short="-A"),
    _row("--qos", "qos", "str", "Quality of service.", metavar="NAME", short="-q"),
    _row("--constraint", "constraint", "str", "Node features (sbatch --constraint).", metavar="LIST", short="-C"),
    _row("--job-name", "job_name", "str", "Job name.", metavar="NAME", short="-J"),
    _row("--output", "output", "str", "The job's stdout file (sbatch --output, e.g. logs/%x-%j.out).",
         metavar="PATTERN"),
    _row("--error", "error", "str", "The job's stderr file (sbatch --error).", metavar="PATTERN", short="-e"),
    _row("--mem", "mem", "strint", "Memory per node (sbatch --mem).", metavar="SIZE"),
    _row("--exclusive", "exclusive", "flag", "Whole nodes.", also=("--no-exclusive",)),
    _row("--sbatch-line", "sbatch_lines", "lines", "An extra #SBATCH line, e.g. --sbatch-line=--mail-type=END "
         "(repeatable).", metavar="OPTION"),
    _row("--setup", "setup", "lines", "A shell line run before srun: module load, venv activation (repeatable).",
         metavar="LINE"),
    _row("--rdzv-port", "rdzv_port", "port", "Rendezvous / MASTER_PORT port. Default: 20000 + SLURM_JOB_ID % 10000."),
    _row("--affrun-command", "affrun", "str", "How the job runs affrun, a shell command (e.g. "
         "'/path/venv/bin/affrun' or 'python -m launcher'). Default: the absolute path of the affrun "
         "writing the script, so the job needs no affrun on its PATH.", metavar="CMD", also=("--affrun",)),
)


def this_affrun() -> str:
    """The affrun that runs now, by absolute path, as a shell command: the ``affrun`` script it was started as,
    else the one beside this interpreter, else this interpreter's ``-m launcher``."""
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


def spec_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The SbatchSpec fields of sbatch's own options, from the read values (lines a tuple, an empty strint none)."""
    return {o.dest: tuple(values[o.dest]) if o.kind == "lines" else values[o.dest] or None if o.kind == "strint"
            else values[o.dest] for o in SBATCH_OPTIONS if o.dest != "template"}
