"""``affrun sbatch``: write a Slurm batch script from a template, print it, save it, or submit it."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields
from typing import Any

import click
from click.core import ParameterSource

from launcher.cli.options import env_options, plan_options
from launcher.errors import ConfigError, LaunchError
from launcher.option_table import options_in
from launcher.options import PlanOptions
from launcher.sbatch_script import STYLES, SbatchSpec, render

# config key -> click parameter name, for affrun's own options (--map lands in cpu_map); other keys are
# key.replace("-", "_")
_PARAM_OF = {spec.flag[2:]: spec.dest for spec in options_in("plan", "env")}


def _param(key: str) -> str:
    return _PARAM_OF.get(key, key.replace("-", "_"))


def _merge(ctx: click.Context, kwargs: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Command-line values over the profile over the defaults; repeatable options add to the file's lines."""
    from launcher.sbatch_profile import KEYS

    merged = dict(kwargs)
    for key, value in settings.items():
        name = _param(key)
        given = ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
        if KEYS[key] == "lines":
            merged[name] = tuple(value) + (tuple(kwargs[name]) if given else ())
        elif not given:
            merged[name] = value
    return merged


def _spec(values: dict[str, Any], command: tuple[str, ...]) -> SbatchSpec:
    return SbatchSpec(
        command=command,
        style=values["style"],
        nodes=values["nodes"],
        gpus_per_node=None if values["gpus_per_node"] in (None, "") else str(values["gpus_per_node"]),
        ntasks_per_node=values["ntasks_per_node"],
        cpus_per_task=values["cpus_per_task"],
        time=values["time"],
        partition=values["partition"],
        account=values["account"],
        qos=values["qos"],
        constraint=values["constraint"],
        job_name=values["job_name"],
        output=values["output"],
        error=values["error"],
        mem=None if values["mem"] is None else str(values["mem"]),
        exclusive=values["exclusive"],
        sbatch_lines=tuple(values["sbatch_line"]),
        setup=tuple(values["setup"]),
        rdzv_port=values["rdzv_port"],
        affrun=values["affrun"],
        plan=PlanOptions(**{f.name: values[f.name] for f in fields(PlanOptions)}),  # --gpus is a str or None
        omp_bind=values["omp_bind"],
        env_policy=values["env_policy"],
        mem_policy=values["mem_policy"],
    )


def _encode(text: str) -> bytes:
    # Arguments that were not valid UTF-8 arrive as surrogate escapes: give them back their own bytes.
    return text.encode("utf-8", "surrogateescape")


def _submit(script: str, path: str | None, wait: bool) -> int:
    argv = ["sbatch", "--parsable"] + (["--wait"] if wait else []) + ([path] if path else [])
    try:
        proc = subprocess.Popen(argv, stdin=None if path else subprocess.PIPE, stdout=subprocess.PIPE)
    except FileNotFoundError:
        raise LaunchError("sbatch not found on PATH (is this a Slurm login node?)") from None
    assert proc.stdout is not None
    if proc.stdin is not None:
        try:
            proc.stdin.write(_encode(script))
            proc.stdin.close()
        except BrokenPipeError:
            pass
    try:
        first = proc.stdout.readline().decode(errors="replace").strip()
        if first:
            click.echo(first.split(";")[0])  # "JOBID" or "JOBID;CLUSTER"
        rest = proc.stdout.read().decode(errors="replace")
        if rest.strip():
            click.echo(rest, nl=False, err=True)
        return proc.wait()
    except KeyboardInterrupt:
        return proc.wait() or 130


@click.command(context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]})
@click.option("--style", type=click.Choice(STYLES), default="torchrun", show_default=True,
              help="torchrun: one task per node runs affrun torchrun (c10d rendezvous on the first node); "
                   "srun: one task per GPU runs affrun exec.")
@click.option("--template", metavar="FILE", help="Render this template instead of the style's (see templates/README.md).")
@click.option("--config", "config_file", metavar="FILE",
              help="Site defaults and profiles (YAML). Default: $AFFRUN_CONFIG, else ~/.config/affrun/config.yaml.")
@click.option("--profile", metavar="NAME", help="A named profile of the configuration file (flags override it).")
@click.option("-N", "--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Nodes.")
@click.option("--gpus-per-node", metavar="[TYPE:]N", help="GPUs per node, as sbatch takes it (4 or a100:4).")
@click.option("--ntasks-per-node", type=click.IntRange(min=1),
              help="Ranks per node (srun style: tasks; torchrun style: --nproc-per-node). Default: one per GPU.")
@click.option("-c", "--cpus-per-task", type=click.IntRange(min=1),
              help="CPUs of each task (torchrun style: of the node's one task). Default: all the job has there.")
@click.option("-t", "--time", metavar="TIME", help="Time limit (sbatch --time).")
@click.option("-p", "--partition", metavar="NAME", help="Partition.")
@click.option("-A", "--account", metavar="NAME", help="Account to charge.")
@click.option("-q", "--qos", metavar="NAME", help="Quality of service.")
@click.option("-C", "--constraint", metavar="LIST", help="Node features (sbatch --constraint).")
@click.option("-J", "--job-name", metavar="NAME", help="Job name.")
@click.option("--output", metavar="PATTERN", help="The job's stdout file (sbatch --output, e.g. logs/%x-%j.out).")
@click.option("-e", "--error", metavar="PATTERN", help="The job's stderr file (sbatch --error).")
@click.option("--mem", metavar="SIZE", help="Memory per node (sbatch --mem).")
@click.option("--exclusive/--no-exclusive", default=False, help="Whole nodes.")
@click.option("--sbatch-line", multiple=True, metavar="OPTION",
              help="An extra #SBATCH line, e.g. --sbatch-line=--mail-type=END (repeatable).")
@click.option("--setup", multiple=True, metavar="LINE",
              help="A shell line run before srun: module load, venv activation (repeatable).")
@click.option("--rdzv-port", type=click.IntRange(1, 65535),
              help="Rendezvous / MASTER_PORT port. Default: 20000 + SLURM_JOB_ID % 10000.")
@click.option("--affrun", default="affrun", show_default=True, metavar="CMD",
              help="How the job runs affrun (e.g. '/path/venv/bin/affrun' or 'python -m launcher').")
@plan_options
@env_options
@click.option("-o", "--script-file", metavar="FILE", help="Write the script to FILE instead of printing it.")
@click.option("--submit", is_flag=True, help="Submit with sbatch and print the job id.")
@click.option("--wait", is_flag=True, help="With --submit: wait for the job and exit with its exit code.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def sbatch(ctx: click.Context, /, command: tuple[str, ...], **kwargs: Any) -> None:
    """Write a Slurm batch script that runs COMMAND with every rank bound by affrun.

    \b
    affrun sbatch --nodes 2 --gpus-per-node 4 --time 1:00:00 -- train.py --epochs 3
    affrun sbatch --style srun --profile gpu-a100 --submit --wait -- python train.py
    """
    from launcher.sbatch_profile import load_config

    if kwargs["wait"] and not kwargs["submit"]:
        raise ConfigError("--wait needs --submit")
    settings = load_config(kwargs.pop("config_file")).settings(kwargs.pop("profile"))
    values = _merge(ctx, kwargs, settings)
    spec = _spec(values, tuple(command))
    script = render(spec, values["template"])
    if spec.cpus_per_task is None and not spec.exclusive and not values["template"]:
        click.echo("affrun: note: no --cpus-per-task and no --exclusive: each task gets Slurm's default CPUs "
                   "(often 1, or the site's DefCpuPerGPU); affrun plans within what the job gets", err=True)
    path = values["script_file"]
    if path:
        try:
            with open(path, "wb") as fh:
                fh.write(_encode(script))
            os.chmod(path, 0o755)
        except OSError as exc:
            raise ConfigError(f"-o {path}: {exc.strerror or exc}") from None
    if values["submit"]:
        sys.exit(_submit(script, path, values["wait"]))
    if not path:
        out = sys.stdout.buffer
        out.write(_encode(script))
        out.flush()
