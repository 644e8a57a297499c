"""``affrun run [OPTIONS] -- COMMAND ARGS...``: plan once, hand the plan to every descendant in ``AFFRUN_PLAN`` with
``AFFRUN_RUN`` set, so that the startup hook (:mod:`launcher.startup`) binds each Python process at interpreter
start, then ``exec`` COMMAND in place. ``--top`` and each role: docs/launchers.md ("Other launchers: affrun run").
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import click

from launcher.base.errors import ConfigError, LaunchError
from launcher.base.untrusted import shell_join, shown, warning_line
from launcher.bind.apply import exec_or_status
from launcher.bind.handoff import ParentPlan, plan_job
from launcher.bind.wire import PLAN_VARIABLE
from launcher.context.launchers import command_is_launcher
from launcher.context.local_rank import task_identity
from launcher.context.run_role import LAUNCHER_VARIABLE, RUN_VARIABLE, TASK_VARIABLE
from launcher.env.rank_line import mem_text, rank_line
from launcher.env.variables import user_values
from launcher.launch.run_target import check_command
from launcher.launch.shebang import exec_failure
from launcher.options.click import COMMAND, Choice, Launch, given, launch_options, nproc_option
from launcher.options.record import Options
from launcher.plan.request import check_rank_count

TOP_CHOICES = ("auto", "rank0", "launcher")


@click.command("run", cls=Launch, help="Plan once, then run COMMAND (accelerate launch, deepspeed, python train.py "
               "with Lightning or torch.multiprocessing.spawn...): every Python process it starts binds itself to its "
               "local rank at interpreter start (affrun's startup hook).")
@nproc_option("Local ranks the launcher starts (default: one per --gpus/--map entry, else per visible GPU, else 1).")
@click.option("--top", type=Choice(TOP_CHOICES), default="auto", show_default=True,
              help="The first Python process without a rank variable: rank0 (the script is rank 0, as Lightning's "
              "is), launcher (left unbound), or auto (launcher for torchrun, accelerate, deepspeed, mpirun, srun; "
              "rank0 otherwise).")
@launch_options(verbose="Every process the hook binds prints its rank line (with its pid and why) on stderr.",
                dry_run="Print the plan and the environment; start nothing.")
@click.option("--strict", is_flag=True, help="When COMMAND's Python interpreter does not load affrun's startup hook, "
              "exit 2 with an error and run nothing, instead of a warning (for CI).")
@click.pass_context
def command(ctx: click.Context, /, **values: Any) -> None:
    from launcher.options.tuned import apply_tuned

    tuned = apply_tuned(values, given(ctx))  # affrun tune --save's options, under the flags given here
    sys.exit(main(ctx.meta[COMMAND], SimpleNamespace(**values, tuned_file=tuned)))


def top_role(command: Sequence[str]) -> str:
    """``launcher`` when COMMAND is a known launcher (directly or as ``python -m MODULE``), else ``rank0``."""
    return "launcher" if command_is_launcher(command) else "rank0"


def prepare(args: SimpleNamespace, environ: dict[str, str]) -> ParentPlan:
    if args.nproc is not None:
        check_rank_count(args.nproc)
    user_env = user_values(environ)
    from launcher.options.tuned import foreign_check, plan_tuned

    tuned = getattr(args, "tuned_file", None)
    loaded = None if tuned is None else foreign_check(tuned, Options.from_args(args), environ, _warn)

    def plan(values: SimpleNamespace) -> ParentPlan:
        return plan_job(Options.from_args(values), values.nproc, environ=environ, user_env=user_env,
                        default_nproc=1, loaded=loaded)[1]

    return plan_tuned(tuned, args, plan)  # a file of another machine is warned about before planning


def _warn(text: str) -> None:
    print(warning_line(text), file=sys.stderr)


def main(command: list[str], args: SimpleNamespace) -> int:
    if not command and not args.dry_run:
        raise ConfigError("no command: use affrun run [OPTIONS] -- COMMAND [ARGS...]")
    environ = dict(os.environ)
    if environ.get(RUN_VARIABLE):
        raise LaunchError("affrun run is already running above this process (AFFRUN_RUN is set): "
                          "run the launcher directly")
    parent = prepare(args, environ)
    from launcher.feed.variables import feed_variables, start_afresh

    feed = feed_variables(args)
    # before anything is printed or run: without the hook the rank lines would report a binding never made
    bound = check_command(command, environ, strict=args.strict, verbose=args.verbose) if command else True
    role = top_role(command) if args.top == "auto" else args.top
    host = os.uname().nodename
    for rank in parent.plan.ranks if bound else ():
        print(shown(rank_line(rank, len(parent.plan.ranks), mem_text(parent.mem_policy, rank.mem_nodes), host)),
              file=sys.stderr)
    for warning in parent.plan.warnings:
        _warn(warning)
    from launcher.context.binders import binders_in_command, binders_in_environment

    for binder in (*binders_in_environment(environ), *binders_in_command(command)):
        _warn(f"double-binding: {binder.source} binds the ranks too, and the last binder wins: {binder.fix}")
    identity = task_identity(environ)
    task = json.dumps(identity, separators=(",", ":")) if identity else ""
    if args.dry_run:  # every line shown: a --feed-json path may hold a newline or an escape sequence
        print(f"{RUN_VARIABLE}={role}")
        print(shown(f"{PLAN_VARIABLE}={parent.to_json()}"))
        if task:
            print(shown(f"{TASK_VARIABLE}={task}"))
        for name, value in sorted(feed.items()):
            print(shown(f"{name}={value}"))
        from launcher.launch.dry_run import job_notes

        for line in job_notes(parent.to_json()):
            print(line)
        if command:
            print("exec " + shell_join(command))
        return 0
    environ[PLAN_VARIABLE] = parent.to_env()  # in the variable, never a file: ParentPlan.to_env says why
    environ[RUN_VARIABLE] = role
    environ.pop(LAUNCHER_VARIABLE, None)  # only the hook of a launcher below writes it
    environ.pop(TASK_VARIABLE, None)
    if task:
        environ[TASK_VARIABLE] = task
    start_afresh(feed)
    environ.update(feed)
    sys.stderr.flush()
    sys.stdout.flush()
    return exec_or_status(command, environ, lambda exc: exec_failure(command, environ, exc))
