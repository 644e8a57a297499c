"""``affrun tune``: trials of the user's script under candidate plans, measured by the feed meter
(:mod:`launcher.tune`); the table, the best options, ``--json``, ``--save`` and ``--svg``."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import click

from launcher.errors import AffrunError

if TYPE_CHECKING:
    from launcher.options.groups import SourceOptions
    from launcher.topology.model import Topology
    from launcher.tune.candidates import Candidate
    from launcher.tune.command import TuneArgs


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def tune(args: tuple[str, ...]) -> None:
    """Find the loader cores and DataLoader workers that feed your script fastest (affrun tune --help)."""
    from launcher.launch.torchrun import import_torch_unbound
    from launcher.tune.command import help_text, rank_cores, split

    try:
        import_torch_unbound()
    except ImportError:
        click.echo("affrun: error: affrun tune needs torch (pip install torch)", err=True)
        sys.exit(2)
    parsed = split(list(args))
    if parsed is None:
        click.echo(help_text(), nl=False)
        return
    sys.exit(_run(parsed, *rank_cores(parsed.torchrun)))


def _run(parsed: TuneArgs, nproc: int, cores: int, topo: Topology, source: SourceOptions) -> int:
    from launcher.tune.candidates import families
    from launcher.tune.result import best, table, to_json, verdict
    from launcher.tune.session import tune as run_tune
    from launcher.tune.trial import TrialSpec

    values = parsed.values
    spec = TrialSpec(parsed.before, parsed.script, nproc, values["warmup_seconds"], values["trial_seconds"],
                     values["start_seconds"])
    count = 1 + sum(len(f) for f in families(cores))
    click.echo(f"affrun: tune: {nproc} rank(s) of {cores} core(s): up to {count} trials of "
               f"{values['trial_seconds']:g} s, {values['repeats']} repeat(s), budget {values['budget']:g} s", err=True)
    session = run_tune(spec, cores, values["repeats"], values["budget"],
                       lambda line: click.echo(f"affrun: tune: {line}", err=True))
    chosen = best(session.results)
    stopped = {"budget": "stopped: the budget ran out; the table holds what was measured",
               "interrupted": "stopped: interrupted; the table holds what was measured"}.get(session.stopped, "")
    if values["as_json"]:
        click.echo(json.dumps(to_json(session.results, chosen, session.workers_how, session.stopped), indent=2))
    else:
        click.echo(table(session.results, session.workers_how))
        if stopped:
            click.echo(stopped)
        click.echo(verdict(chosen))
    if values["save"] and chosen is not None:
        _save(values["save"], chosen.trial.candidate, parsed.script, topo, source)
    if values["svg"]:
        from launcher.tune.chart import write_chart

        title = f"affrun tune: {' '.join(parsed.script)[:80]}"
        try:
            write_chart(session.results, chosen, title, values["svg"])
        except OSError as exc:
            raise AffrunError(f"--svg {values['svg']}: {exc.strerror or exc}") from None
    return 130 if session.stopped == "interrupted" else 0


def _save(path: str, candidate: Candidate, script: list[str], topo: Topology, source: SourceOptions) -> None:
    import os

    from launcher.options.tuned import machine_identity, render_tuned
    from launcher.topology import tree_root

    values = {} if candidate.is_default else {"loader_cores": candidate.loader_cores,
                                              "loader_workers": candidate.workers}
    root = tree_root(source.fsroot, source.topology_file, os.environ)
    now = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    about = (f"affrun tune, {now}: the fastest options for {' '.join(script)[:120]} on this machine"
             + (" (the default stood: no option)" if candidate.is_default else ""))
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(render_tuned(values, machine_identity(topo, root), now, about))
    except OSError as exc:
        raise AffrunError(f"--save {path}: {exc.strerror or exc}") from None
    click.echo(f"saved {path}", err=True)
