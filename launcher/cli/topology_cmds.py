"""``affrun topology``, ``affrun plan`` and ``affrun show``."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from launcher.base.outpath import checked, marked, written
from launcher.base.untrusted import shown
from launcher.bind.handoff import ParentPlan, plan_job
from launcher.env.policy import plan_json
from launcher.env.variables import user_values
from launcher.options.click import PID, env_options, nproc_option, plan_options, topology_options
from launcher.options.record import Options
from launcher.topology import load_topology
from launcher.topology.model import Topology

if TYPE_CHECKING:
    from launcher.base.outpath import Mine


@click.command()
@topology_options
@click.option("--json", "as_json", is_flag=True, help="Print the documented JSON contract.")
@click.option("--save", metavar="FILE", help="Save a snapshot that --topology FILE loads back.")
@click.option("--nvml", is_flag=True, help="Add GPU UUIDs from NVML and cross-check the GPU list with it "
              "(needs nvidia-ml-py and the driver; without them, nothing changes).")
def topology(fsroot: str | None, topology_file: str | None, cpus: str | None, as_json: bool, save: str | None,
             nvml: bool) -> None:
    """Show the machine: packages, NUMA nodes, cores, allowed CPUs, GPUs and NICs."""
    from launcher.topology.snapshot import FORMAT, to_snapshot

    mine = marked(f'"format": "{FORMAT}"'.encode())  # what a snapshot affrun saved holds
    if save is not None:
        checked("--save", save, mine)  # before the machine is read
    topo = load_topology(fsroot=fsroot, topology_file=topology_file, cpus=cpus, nvml=nvml, cpu_identity=True)
    if save is not None:
        written("--save", save, (json.dumps(to_snapshot(topo), indent=1) + "\n").encode("utf-8"), mine)
    if as_json:
        click.echo(json.dumps(topo.to_json(), indent=2))
        return
    from launcher.base.cpulist import format_cpulist

    data = topo.to_json()
    click.echo(f"source   {shown(topo.origin)}")
    click.echo(f"packages {data['packages']}   cores {len(data['cores'])}   allowed CPUs {format_cpulist(topo.allowed)}")
    for node in topo.numa_nodes:
        cpulist = format_cpulist(node.cpus & topo.allowed) or "(no CPUs)"
        click.echo(f"numa {node.os_index:<4} cpus {cpulist}")
    if topo.cpu is not None:
        click.echo(shown(f"cpu      {topo.cpu.line()}; from {topo.cpu.source}"))
    from launcher.show.model import kind_marks

    for mark in kind_marks(topo.kinds()):
        kind = mark.kind
        click.echo(shown(f"kind {mark.letter:<4} cpus {format_cpulist(kind.cpus)}  {kind.name} "
                         f"(efficiency {kind.efficiency}, {mark.speed}; from {kind.source})"))
    click.echo(shown(_priority_line(topo)))
    for i, gpu in enumerate(topo.visible_gpus()):
        click.echo(shown(f"gpu {i:<5} {gpu.pci} {gpu.vendor:<6} numa "
                         f"{gpu.numa_node if gpu.numa_node is not None else '?'}  local cpus {format_cpulist(gpu.cpus) or '?'}"))
    for nic in topo.nics:
        ports = " ".join(f"{p.number}:{p.state}" + (f"@{p.rate_gbps:g}Gb/s" if p.rate_gbps else "") for p in nic.ports)
        click.echo(f"nic {shown(nic.name):<9} {nic.pci} {nic.kind:<10} numa "
                   f"{nic.numa_node if nic.numa_node is not None else '?'}  ports {ports or '-'}")
    for w in topo.warnings:
        click.echo(f"warning: {shown(w)}")
    if save is not None:
        click.echo(shown(f"saved {save}"))


def _priority_line(topo: Topology) -> str:
    """The priority CPUs best first and their evidence, or why there are none (docs/priority-cores.md); where the
    core kinds are priority classes, that the planner treats them as one kind."""
    prio = topo.priority_cores()
    classes = ("; the kinds above are priority classes (one frequency alone differs, on a non-hybrid Intel CPU): "
               "planned as one kind" if prio.one_kind and topo.kinds().hybrid else "")
    if not prio.cpus:
        return f"priority none: {shown(prio.why_none)}{classes}"
    return f"priority cpus {','.join(map(str, prio.order))} (best first); from {shown(prio.source)}{classes}"


def _plan(kwargs: dict[str, Any]) -> tuple[Topology, ParentPlan]:
    """The job these options describe (one rank per --gpus/--map entry, else per visible GPU, else 1)."""
    nproc = kwargs.pop("nproc_per_node")
    return plan_job(Options.from_values(kwargs), nproc, user_env=user_values(os.environ), default_nproc=1)


nproc = nproc_option("Local ranks (default: one per --gpus/--map entry, else per visible GPU unless --no-gpu, else 1).",
                     "nproc_per_node")


@click.command()
@topology_options
@nproc
@plan_options
@env_options
@click.option("--json", "as_json", is_flag=True, help="Print the documented JSON contract.")
def plan(**kwargs: Any) -> None:
    """Print the per-rank plan: CPUs, GPU, NUMA nodes, threads and environment, and where each thread lives."""
    as_json = kwargs.pop("as_json")
    topo, parent = _plan(kwargs)
    the_plan = parent.plan
    from launcher.show.table import plan_table, thread_plans

    threads = thread_plans(topo, the_plan)
    if as_json:
        envs = [parent.environment(r) for r in the_plan.ranks]
        click.echo(json.dumps(plan_json(the_plan, envs, parent.mem_policy, threads), indent=2))
        return
    click.echo(plan_table(topo, the_plan, threads))


@click.command()
@topology_options
@nproc
@plan_options
@click.option("--svg", metavar="FILE", help="Also write the map as SVG (or HTML when FILE ends in .html).")
@click.option("--color/--no-color", default=None, help="Force colours on or off (default: when stdout is a terminal).")
@click.option("--pid", type=PID, default=None,
              help="Draw this running job instead: each core coloured by the rank whose threads ran there, marked "
                   "with the role that ran there most, strays highlighted.")
@click.option("--duration", default=None, metavar="SECONDS",
              help="With --pid: seconds to sample for, at most a day (default 2; sampling ends when the job does).")
def show(**kwargs: Any) -> None:
    """Draw the machine with every core coloured by the rank that owns it, GPUs beside their NUMA node; with
    --pid, by the rank whose threads ran there."""
    svg_path, color = kwargs.pop("svg"), kwargs.pop("color")
    pid, duration = kwargs.pop("pid"), kwargs.pop("duration")
    import shutil

    if color is None:
        color = sys.stdout.isatty()
    width = min(max(shutil.get_terminal_size((100, 24)).columns, 80), 120)
    if pid is None and duration is not None:
        raise click.UsageError("--duration applies to --pid only")
    if svg_path is not None:
        checked("--svg", svg_path, _picture())  # before the job is sampled or planned
    if pid is not None:
        ctx = click.get_current_context()
        given = [p.opts[0] for p in ctx.command.params if p.name in kwargs and ctx.get_parameter_source(p.name)
                 in (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)]
        if given:
            raise click.UsageError(f"--pid draws the live job on this machine: drop {', '.join(given)}")
        _show_live(pid, duration, svg_path, color, width)
        return
    topo, parent = _plan(kwargs)
    the_plan = parent.plan
    from launcher.show.svg import svg
    from launcher.show.terminal import picture

    click.echo(picture(topo, the_plan, color=color, width=width), color=color)
    if svg_path is not None:
        _write_svg(svg(topo, the_plan, _html(svg_path)), svg_path)


def _show_live(pid: int, duration: str | None, svg_path: str | None, color: bool, width: int) -> None:
    """``affrun show --pid``: sample the job as ``affrun doctor --pid`` does, then draw where its threads ran."""
    from launcher.base.cpulist import format_cpulist
    from launcher.cli.doctor_cmd import parse_seconds
    from launcher.doctor.sampling import sample_job
    from launcher.doctor.thread_homes import cpu_use
    from launcher.show.live import LiveJob, LiveRank, live_document, live_picture

    audit = sample_job(pid, duration=2.0 if duration is None else parse_seconds("duration", duration))
    ranks = audit.ranks()
    local = [r.rank for r in ranks]
    distinct = None not in local and len(set(local)) == len(local)
    key = {r.pid: (r.rank if distinct and r.rank is not None else i) for i, r in enumerate(ranks)}
    use = {cpu: {(key[pid_], role, strayed): n for (pid_, role, strayed), n in cell.items()}
           for cpu, cell in cpu_use(audit).items()}
    live = tuple(LiveRank(key[r.pid], r.label(), format_cpulist(r.owned),
                          sum(len(p.threads) for p in (r, *audit.children_of(r))),
                          sum(1 for p in (r, *audit.children_of(r)) for t in p.threads.values() if t.verdict == "strayed"),
                          r.thread_plan is not None, not r.alive) for r in ranks)
    ended = any(p.pid == pid and not p.alive for p in audit.processes)  # as doctor --pid says it (a zombie too)
    job = LiveJob(pid, len(audit.processes), audit.samples, audit.duration, live, use, ended)
    topo = load_topology()
    click.echo(live_picture(topo, job, color=color, width=width), color=color)
    if svg_path is not None:
        _write_svg(live_document(topo, job, _html(svg_path)), svg_path)


def _picture() -> Mine:
    """What a picture affrun show wrote holds: its title (launcher.show.svg.TITLE)."""
    from launcher.show.svg import TITLE

    return marked(f"<title>{TITLE}".encode())


def _html(path: str) -> bool:
    """Whether ``--svg FILE`` asks for an HTML page (FILE ends in ``.html`` or ``.htm``), not an SVG document."""
    return path.lower().endswith((".html", ".htm"))


def _write_svg(text: str, path: str) -> None:
    """``--svg``'s picture, through the one writer (checked again: what took the name meanwhile is refused)."""
    written("--svg", path, text.encode("utf-8"), _picture())
    click.echo(shown(f"wrote {path}"))
