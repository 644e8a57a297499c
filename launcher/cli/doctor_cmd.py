"""``affrun doctor``: audit the environment and machine, or a running job with ``--pid``."""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Literal

import click

from launcher.base.cpulist import format_cpulist
from launcher.base.errors import ConfigError
from launcher.base.untrusted import seconds, shown
from launcher.doctor.findings import CATALOGUE, SEVERITIES, Finding, Severity
from launcher.options.click import PID, Choice, nproc_option, topology_options

SHOWN_VARIABLES = re.compile(
    r"^(OMP_|KMP_|GOMP_|MKL_|OPENBLAS_|GOTO_|LOCAL_|AFFRUN_CPUS|AFFRUN_LOADER|AFFRUN_OMP|SLURM_CPUS|SRUN_CPUS|"
    r"SLURM_LOCALID|CUDA_DEVICE_ORDER|CUDA_VISIBLE|PET_NUMA|LD_PRELOAD|TORCHELASTIC_RUN_ID)"
)


def _exit_status(findings: list[Finding], fail_on: Severity) -> int:
    return 1 if any(f.at_least(fail_on) for f in findings) else 0


@click.command()
@topology_options
@nproc_option("Local ranks the job will run (default: from LOCAL_WORLD_SIZE/SLURM/..., else one per GPU, else 1).")
@click.option("--pid", type=PID, default=None,
              help="Audit this running job instead: the process, its children and all their threads.")
@click.option("--duration", default=None, metavar="SECONDS",
              help="With --pid: seconds to sample for, at most a day (default 2; sampling ends when the job does).")
@click.option("--interval", default="0.05", show_default=True, metavar="SECONDS",
              help="With --pid: seconds between samples (at least 0.005).")
@click.option("--json", "as_json", is_flag=True, help="Print the documented JSON contract.")
@click.option("--fail-on", type=Choice(SEVERITIES[::-1]), default="warning", show_default=True,
              help="Exit 1 when a finding is at least this severe (the CI guard is --fail-on error).")
@click.option("--ids", "list_ids", is_flag=True, help="List every finding id and what it means, then exit.")
def doctor(
    fsroot: str | None,
    topology_file: str | None,
    cpus: str | None,
    nproc: int | None,
    pid: int | None,
    duration: str | None,
    interval: str,
    as_json: bool,
    fail_on: Severity,
    list_ids: bool,
) -> None:
    """Find silent CPU-side starvation: wrong OpenMP variables, oversubscription, collapsed DataLoader workers.

    One finding per line: severity, id, what is wrong, why it matters and the exact fix. Exit status 0 when no
    finding reaches --fail-on, 1 when one does, 2 for usage errors.
    """
    if list_ids:
        for fid, meaning in CATALOGUE.items():
            click.echo(f"{fid:<24} {meaning}")
        return
    if pid is None and duration is not None:
        raise click.UsageError("--duration applies to --pid only")
    if pid is not None:
        if fsroot or topology_file or cpus or nproc:
            raise click.UsageError("--pid audits the live machine: drop --fsroot/--topology/--cpus/--nproc-per-node")
        seconds = 2.0 if duration is None else parse_seconds("duration", duration)
        sys.exit(_live(pid, seconds, parse_seconds("interval", interval), as_json, fail_on))
    sys.exit(_environment(fsroot, topology_file, cpus, nproc, as_json, fail_on))


def parse_seconds(name: Literal["duration", "interval"], text: str) -> float:
    """``--duration``/``--interval`` as a number of seconds in range (:func:`launcher.base.untrusted.seconds`),
    else :class:`ConfigError` (exit 2)."""
    from launcher.doctor.sampling import MAX_SECONDS, MIN_INTERVAL

    low = MIN_INTERVAL if name == "interval" else 0.0
    try:
        return seconds(text, low, inclusive=True, high=MAX_SECONDS)
    except ValueError as exc:
        raise ConfigError(f"--{name} {exc}") from None


def _environment(fsroot: str | None, topology_file: str | None, cpus: str | None, nproc: int | None,
                 as_json: bool, fail_on: Severity) -> int:
    from launcher.doctor.diagnose import audited_machine, diagnose
    from launcher.doctor.report import cpu_json, cpu_text, environment_json, findings_lines
    from launcher.plan.request import check_rank_count

    if nproc is not None:
        check_rank_count(nproc)

    environ = dict(os.environ)
    machine = audited_machine(fsroot, topology_file, cpus, environ, cpu_identity=True)
    topo = machine.topology
    facts, findings = diagnose(environ, machine, nproc=nproc)
    nodes = topo.cpu_nodes()
    context: dict[str, Any] = {
        "mode": "environment",
        "machine": {
            "source": topo.source,
            "allowed_cpus": format_cpulist(topo.allowed),
            "cores": len(topo.allowed_cores()),
            "numa_nodes": len(nodes),
            "gpus": len(topo.visible_gpus()),
        },
        "cpu": cpu_json(topo),
        "rank": {
            "cpus": format_cpulist(facts.rank_cpus),
            "local_ranks": facts.local_size,
            "local_ranks_from": facts.local_size_source,
            "ranks_sharing_cpus": facts.ranks_sharing,
        },
        "openmp": {"runtimes": list(facts.openmp), "from": facts.openmp_source, "installed": list(facts.other_openmp)},
        "environment": {k: v for k, v in sorted(environ.items()) if SHOWN_VARIABLES.match(k)},
    }
    if as_json:
        click.echo(json.dumps(environment_json(findings, context), indent=2))
    else:
        machine = context["machine"]
        lines = [
            f"machine: CPUs {machine['allowed_cpus']} ({machine['cores']} cores, {machine['numa_nodes']} NUMA "
            f"node(s), {machine['gpus']} GPU(s)); {facts.local_size} local rank(s): {facts.local_size_source}",
            cpu_text(topo),
            f"OpenMP: {', '.join(facts.openmp) or 'unknown'}"
            + (f" ({facts.openmp_source})" if facts.openmp_source else ""),
            *findings_lines(findings),
        ]
        click.echo("\n".join(shown(line) for line in lines))
    return _exit_status(findings, fail_on)


def _live(pid: int, duration: float, interval: float, as_json: bool, fail_on: Severity) -> int:
    from launcher.doctor.report import job_json, job_text
    from launcher.doctor.sampling import sample_job

    audit = sample_job(pid, duration=duration, interval=interval)
    if as_json:
        click.echo(json.dumps(job_json(audit), indent=2))
    else:
        click.echo(job_text(audit))
    return _exit_status(audit.findings, fail_on)
