"""``affrun exec [OPTIONS] -- CMD ARGS...``: the click command of one rank; :mod:`launcher.launch.rank` binds it
and execs CMD."""

from __future__ import annotations

import sys
from typing import Any

import click

from launcher.launch.rank import main
from launcher.options.click import COMMAND, COUNT, Launch, given, launch_options, nproc_option


@click.command("exec", cls=Launch, help="Bind this rank (local rank from LOCAL_RANK, SLURM_LOCALID, OMPI_..., "
               "MPI_..., PMI_...), set its OpenMP/BLAS environment and memory policy, then exec COMMAND in place.")
@click.option("--local-rank", type=COUNT, help="This process's local rank (default: from the launcher's variables).")
@nproc_option("Local ranks on this node (default: from the launcher's variables).")
@launch_options(verbose="Print one line per rank on stderr.", dry_run="Print what would be applied and exit 0.")
@click.pass_context
def command(ctx: click.Context, /, **values: Any) -> None:
    sys.exit(main(ctx.meta[COMMAND], values, given(ctx)))
