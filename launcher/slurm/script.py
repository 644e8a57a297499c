"""Render Slurm batch scripts from the templates in ``templates/``: ``{{name}}`` placeholders, each value made
safe for its place (the command's words shell-quoted one by one, ``#SBATCH`` values double-quoted where sbatch
needs it; ``setup`` lines are shell code). The values were read by :mod:`launcher.options.values` (docs/slurm.md)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from launcher.base.errors import ConfigError, Opt, PlanError, RankCountMismatch
from launcher.base.untrusted import short, unwritable
from launcher.base.version import __version__
from launcher.options.record import Options
from launcher.plan.request import validate_request

Style = Literal["torchrun", "srun"]
STYLES: tuple[Style, ...] = get_args(Style)

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_GPUS = re.compile(r"(?:[A-Za-z0-9_.-]+:)?([0-9]{1,9})", re.ASCII)


@dataclass(frozen=True)
class SbatchSpec:
    """Everything a batch script is rendered from. ``None`` means "do not ask Slurm for it"."""

    command: tuple[str, ...]
    style: Style = "torchrun"
    nodes: int = 1
    gpus_per_node: str | None = None  # "4" or "a100:4", as sbatch takes it
    ntasks_per_node: int | None = None  # ranks per node; default: one per GPU, else 1
    cpus_per_task: int | None = None  # default: every CPU the job has on the node, shared out
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    job_name: str | None = None
    output: str | None = None
    error: str | None = None
    mem: str | None = None
    exclusive: bool = False
    sbatch_lines: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    rdzv_port: int | None = None  # default: 20000 + SLURM_JOB_ID % 10000
    affrun: str = "affrun"
    options: Options = field(default_factory=Options)  # affrun's planning and environment options
    verbose: bool = True  # srun style: every task prints its binding line to the job's stderr
    tuned: str | None = None  # --tuned FILE (absolute), applied by affrun on the job's nodes

    def gpu_count(self) -> int:
        if self.gpus_per_node is None:
            return 0
        m = _GPUS.fullmatch(self.gpus_per_node)  # as written: the command line and a profile strip it first
        if not m:
            raise ConfigError(f"--gpus-per-node {short(self.gpus_per_node)}: expected a count, or TYPE:COUNT (a100:4)")
        return int(m.group(1))

    def ranks_per_node(self) -> int:
        """--ntasks-per-node, else one rank per GPU, else one per --gpus or --map entry (as ``affrun plan``), else 1."""
        if self.ntasks_per_node is not None:
            return self.ntasks_per_node
        return self.gpu_count() or self.options.rank_count() or 1


def directive_value(option: str, value: str) -> str:
    """One ``#SBATCH`` value: sbatch splits a directive on white space unless the value is in double quotes, and
    has no escape for a quote inside quotes."""
    if '"' in value:
        raise ConfigError(f"--{option} {short(value)}: a #SBATCH value cannot contain a double quote")
    if value == "" or re.search(r"\s", value):
        return f'"{value}"'
    return value


def extra_directive(line: str) -> str:
    """An extra ``#SBATCH`` line as the user gave it, with or without the ``#SBATCH`` prefix."""
    text = line.strip()
    if text.startswith("#SBATCH"):
        text = text[len("#SBATCH"):].strip()
    if not text.startswith("-"):
        raise ConfigError(f"--sbatch-line {short(line)}: expected an sbatch option such as --mail-type=END")
    return f"#SBATCH {text}"


def sbatch_directives(spec: SbatchSpec) -> list[str]:
    ranks = spec.ranks_per_node()
    tasks = 1 if spec.style == "torchrun" else ranks
    lines: list[tuple[str, str | None]] = [
        ("job-name", spec.job_name),
        ("nodes", str(spec.nodes)),
        ("ntasks-per-node", str(tasks)),
        ("cpus-per-task", None if spec.cpus_per_task is None else str(spec.cpus_per_task)),
        ("gpus-per-node", spec.gpus_per_node if spec.gpu_count() else None),
        ("time", spec.time),
        ("partition", spec.partition),
        ("account", spec.account),
        ("qos", spec.qos),
        ("constraint", spec.constraint),
        ("mem", spec.mem),
        ("output", spec.output),
        ("error", spec.error),
    ]
    out = [f"#SBATCH --{name}={directive_value(name, value)}" for name, value in lines if value is not None]
    if spec.exclusive:
        out.append("#SBATCH --exclusive")
    out.extend(extra_directive(line) for line in spec.sbatch_lines)
    return out


def affrun_options(spec: SbatchSpec) -> list[str]:
    """affrun's own options, as flags for ``affrun exec`` / ``affrun torchrun`` inside the job."""
    argv = [*spec.options.to_argv(), *(["--tuned", spec.tuned] if spec.tuned else [])]
    if spec.verbose and spec.style == "srun":
        argv.append("--verbose")
    return argv


def affrun_words(spec: SbatchSpec) -> list[str]:
    """The --affrun-command command as words (``python -m launcher``), split as a shell would."""
    try:
        words = shlex.split(spec.affrun)
        bad = unwritable(spec.affrun)
        if bad is not None:
            raise ValueError(f"it cannot contain {bad}")
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise ConfigError(f"--affrun-command {short(spec.affrun)}: not a valid shell command: {exc}") from None
    if not words:
        raise ConfigError("--affrun-command: empty command")
    return words


def check_spec(spec: SbatchSpec) -> None:
    """Refuse, before the queue wait, what the job would refuse on every node."""
    if not spec.command:
        raise ConfigError("no training command: put it after --, e.g. affrun sbatch -- train.py --epochs 3")
    affrun_words(spec)
    check_plan_options(spec)
    if spec.style == "torchrun":
        first = Path(spec.command[0]).name
        if re.fullmatch(r"python[0-9.]*", first):
            raise ConfigError(
                f"--style torchrun: torchrun runs the script with Python itself; give `-- {shlex.join(spec.command[1:2]) or 'train.py'} ...`"
                " (or `-- --no-python CMD ...`, or use --style srun for a full command)"
            )
    check_job_command(spec)


def check_job_command(spec: SbatchSpec) -> None:
    """Refuse a training command the job itself would refuse: ``--style torchrun``, the job's command line through
    ``affrun torchrun``'s own parse (where torch is installed); ``--style srun``, an empty command name."""
    if spec.style != "torchrun":
        if not spec.command[0]:
            raise ConfigError("the training command is an empty word (''): give the program to run after --")
        return
    try:
        import torch.distributed.run  # noqa: F401  # what parse() builds its parser from

        from launcher.launch.torchrun import check_args, parse
    except ImportError:
        return
    argv = [*affrun_options(spec), f"--nnodes={spec.nodes}", f"--nproc-per-node={spec.ranks_per_node()}",
            "--rdzv-backend=c10d", "--rdzv-endpoint=node:29500", "--rdzv-id=1", *spec.command]
    import contextlib
    import io

    try:
        with contextlib.redirect_stdout(io.StringIO()):  # -h prints torchrun's help and exits
            args = parse(argv, refuse=True)
    except SystemExit:
        raise ConfigError("affrun torchrun would only print its help in the job (-h in the command): "
                          "give the training script") from None
    check_args(args)


def check_plan_options(spec: SbatchSpec) -> None:
    """Refuse planning options that would fail on every node (the planner's checks, without a topology)."""
    ranks = spec.ranks_per_node()
    request = spec.options.request(ranks)
    try:
        validate_request(request)
    except RankCountMismatch as exc:  # the job's ranks are per node, and come from sbatch's options
        raise PlanError(Opt(exc.key), f" gives {exc.given} entries for {exc.ranks} rank(s) per node "
                        "(--ntasks-per-node, else one per GPU): give one per rank") from None
    missing = sorted(g for g in request.gpus or () if g >= spec.gpu_count() > 0)
    if missing:
        raise PlanError(Opt("gpus"), f" names GPU {missing[0]}, but the job asks for {spec.gpu_count()} GPU(s) "
                        f"per node (visible indices 0-{spec.gpu_count() - 1})")


def template_variables(spec: SbatchSpec) -> dict[str, str]:
    """Every value a template may use (documented in templates/README.md), by name."""
    check_spec(spec)
    ranks = spec.ranks_per_node()
    if spec.cpus_per_task is not None:
        cpus = str(spec.cpus_per_task)
    elif spec.style == "torchrun":
        cpus = '"$SLURM_CPUS_ON_NODE"'
    else:
        cpus = f'"$(( SLURM_CPUS_ON_NODE / {ranks} ))"'
    port = str(spec.rdzv_port) if spec.rdzv_port is not None else '"$(( 20000 + SLURM_JOB_ID % 10000 ))"'
    return {
        "shebang": "#!/bin/bash",
        "sbatch_directives": "\n".join(sbatch_directives(spec)),
        "setup": "\n".join(spec.setup) if spec.setup else "# (no setup lines)",
        "style": spec.style,
        "nodes": str(spec.nodes),
        "gpus_per_node": str(spec.gpu_count()),
        "ranks_per_node": str(ranks),
        "cpus_per_task": cpus,
        "rdzv_port": port,
        "affrun": shlex.join(affrun_words(spec)),
        "affrun_options": shlex.join(affrun_options(spec)),
        "command": shlex.join(spec.command),
        "version": __version__,
    }


TEMPLATE_LIMIT = 1 << 20  # a batch script template is a few KB


def builtin_template(style: str) -> Path:
    """The shipped template of a style: ``templates/<style>.sbatch`` (package data of ``launcher.templates``)."""
    if style not in STYLES:
        raise ConfigError(f"--style {short(style)}: choose one of {', '.join(STYLES)}")
    return Path(__file__).resolve().parents[1] / "templates" / f"{style}.sbatch"


def render(spec: SbatchSpec, template: str | Path | None = None) -> str:
    """The batch script for ``spec`` from ``template`` (a file), else the style's shipped template; an unknown
    ``{{name}}`` is an error naming the template and the valid names."""
    from launcher.topology._files import read_document  # bounded, regular files only (a FIFO would hang)

    path = Path(template) if template is not None else builtin_template(spec.style)
    try:
        text = read_document(str(path), "a batch script template", ConfigError, limit=TEMPLATE_LIMIT).decode("utf-8")
    except ConfigError as exc:
        raise ConfigError(f"--template {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--template {path}: not UTF-8 text") from None
    variables = template_variables(spec)
    unknown = sorted({m.group(1) for m in _PLACEHOLDER.finditer(text)} - set(variables))
    if unknown:
        raise ConfigError(f"{path}: unknown template variable {{{{{unknown[0]}}}}} (valid: {', '.join(sorted(variables))})")
    text = _PLACEHOLDER.sub(lambda m: variables[m.group(1)], text)
    return text if text.endswith("\n") else text + "\n"
