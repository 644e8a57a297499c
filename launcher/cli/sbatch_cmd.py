"""``affrun sbatch``: write a Slurm batch script from a template, print it, save it, or submit it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from launcher.base.untrusted import ascii_uint, note_line, short, shown
from launcher.cli.options import env_options, plan_options
from launcher.errors import AffrunError, ConfigError, LaunchError
from launcher.options.groups import ApplyOptions, pick
from launcher.options.plan_options import PlanOptions
from launcher.options.table import TUNED_OPTION, options_in, spell_error
from launcher.slurm.options import (
    SBATCH_OPTIONS,
    BadValue,
    SbatchOption,
    check_value,
    default_of,
    spec_values,
    this_affrun,
)
from launcher.slurm.script import SbatchSpec, render

# config key -> click parameter name, for affrun's own options (--map lands in cpu_map); other keys are
# key.replace("-", "_")
_PARAM_OF = {spec.name("profile"): spec.dest for spec in options_in("plan", "env")}


F = TypeVar("F", bound=Callable[..., Any])


def _param(key: str) -> str:
    return _PARAM_OF.get(key, key.replace("-", "_"))


def _merge(ctx: click.Context, kwargs: dict[str, Any], settings: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """Command-line values over the profile over the defaults; repeatable options add to the file's lines.
    Also the parameters whose value is the file's (an error about them names the file's key, not the flag)."""
    from launcher.slurm.profile import KEYS

    merged = dict(kwargs)
    from_file: set[str] = set()
    for key, value in settings.items():
        name = _param(key)
        given = ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
        if KEYS[key] == "lines":
            merged[name] = tuple(value) + (tuple(kwargs[name]) if given else ())
        elif not given:
            merged[name] = value
            from_file.add(name)
    return merged, from_file


def _spec(values: dict[str, Any], command: tuple[str, ...], tuned: str | None = None) -> SbatchSpec:
    spec = spec_values(values)
    if spec["affrun"] is None:  # neither --affrun-command nor the profile: this affrun, by absolute path
        spec["affrun"] = this_affrun()
    return SbatchSpec(
        command=command,
        **spec,
        plan=pick(PlanOptions, values),  # --gpus is a str or None
        apply=pick(ApplyOptions, values),
        tuned=tuned,
    )


def _tuned(path: str | None) -> str | None:
    """``--tuned FILE``, checked now and named by its absolute path: affrun applies it on the job's nodes (a flag
    given here wins there too, and the machine it was tuned on is compared with theirs)."""
    if path is None:
        return None
    from launcher.options.tuned import load_tuned

    load_tuned(path)
    return os.path.abspath(path)


class _WholeNumber(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2 only
    """ASCII digits only, as every count affrun reads (click's int also takes '١', '1_0' and ' +3'). Anything else
    stays the text it was, which :func:`_check_command_line` refuses in one line, as a profile's value."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        number = ascii_uint(value) if isinstance(value, str) else None
        return value if number is None else number


WHOLE_NUMBER = _WholeNumber()


def _check_command_line(ctx: click.Context, values: dict[str, Any]) -> dict[str, Any]:
    """The values given on the command line, through the validation a site profile's go through
    (:func:`launcher.slurm.options.check_value`): one rule for both, and the value written is the value checked."""
    from launcher.slurm.profile import KEYS

    out = dict(values)
    for key, kind in KEYS.items():
        name = _param(key)
        if ctx.get_parameter_source(name) not in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            continue
        value = values[name]
        if kind == "lines":
            checked = [_checked(key, line, "str") for line in value]
            out[name] = (*checked,)
        elif value is not None and not (kind == "bool" and isinstance(value, bool)):
            out[name] = _checked(key, value, kind)
    return out


def _checked(key: str, value: object, kind: Any) -> Any:
    try:
        return check_value(value, kind)
    except BadValue as exc:
        raise ConfigError(f"--{key} {short(value)}: {exc}") from None


def _click_option(option: SbatchOption) -> Callable[[F], F]:
    kind = option.kind
    extra: dict[str, Any] = {}
    if isinstance(kind, tuple):
        extra["type"] = click.Choice(kind)
    elif kind in ("int", "port"):
        extra["type"] = WHOLE_NUMBER  # the range is check_value's, as for a profile's value
    elif kind == "lines":
        extra["multiple"] = True
    return click.option(*option.flags, option.param, default=default_of(option), metavar=option.metavar,
                        show_default=option.show_default, help=option.help, **extra)


def sbatch_options(func: F) -> F:
    """sbatch's own options (launcher.slurm.options), as click options."""
    for option in reversed(SBATCH_OPTIONS):
        func = _click_option(option)(func)
    return func


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
            click.echo(shown(first.split(";")[0]))  # "JOBID" or "JOBID;CLUSTER"
        rest = proc.stdout.read().decode(errors="replace")
        if rest.strip():
            click.echo("".join(shown(line) + "\n" for line in rest.splitlines()), nl=False, err=True)
        return proc.wait()
    except KeyboardInterrupt:
        return proc.wait() or 130


@click.command(context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]})
@click.option("--config", "config_file", metavar="FILE",
              help="Site defaults and profiles (YAML). Default: $AFFRUN_CONFIG, else ~/.config/affrun/config.yaml.")
@click.option("--profile", metavar="NAME", help="A named profile of the configuration file (flags override it).")
@sbatch_options
@plan_options
@env_options
@click.option(TUNED_OPTION.flag, TUNED_OPTION.dest, metavar=TUNED_OPTION.metavar, help=TUNED_OPTION.help)
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
    from launcher.slurm.profile import load_config

    if kwargs["wait"] and not kwargs["submit"]:
        raise ConfigError("--wait needs --submit")
    tuned = _tuned(kwargs.pop(TUNED_OPTION.dest))
    settings = load_config(kwargs.pop("config_file")).settings(kwargs.pop("profile"))
    values, from_file = _merge(ctx, _check_command_line(ctx, kwargs), settings)
    spec = _spec(values, tuple(command), tuned)
    try:
        script = render(spec, values["template"])
    except AffrunError as exc:  # affrun's options that the profile set are named as its keys
        spell_error(exc, "profile", from_file)
        raise
    if spec.cpus_per_task is None and not spec.exclusive and not values["template"]:
        click.echo(note_line("no --cpus-per-task and no --exclusive: each task gets Slurm's default CPUs (often 1, "
                             "or the site's DefCpuPerGPU); affrun plans within what the job gets"), err=True)
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
