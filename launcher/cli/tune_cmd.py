"""``affrun tune``: trials of the user's script under candidate plans, measured by the feed meter
(:mod:`launcher.tune`); the table, the best options, ``--json``, ``--save`` and ``--svg``."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import click

from launcher.options.click import Verbatim

if TYPE_CHECKING:
    from launcher.options.record import Options
    from launcher.topology.model import Topology
    from launcher.tune.candidates import Candidate
    from launcher.tune.command import TuneArgs
    from launcher.tune.session import Interrupts


@click.command(cls=Verbatim)  # its words are affrun torchrun's: torchrun's argparse parser reads them
def tune(words: list[str]) -> None:
    """Find the loader cores and DataLoader workers that feed your script fastest (affrun tune --help)."""
    from launcher.launch.torchrun import import_torch_unbound
    from launcher.tune.command import help_text, rank_cores, split

    try:
        try:
            import_torch_unbound()
        except ImportError:
            click.echo("affrun: error: affrun tune needs torch (pip install torch)", err=True)
            sys.exit(2)
        parsed = split(words)
        if parsed is None:
            click.echo(help_text(), nl=False)
            return
        status = _run(parsed, *rank_cores(parsed.torchrun))
    except KeyboardInterrupt:  # before the first trial started (from then on, launcher.tune.session notes it)
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # exiting: a second Ctrl-C must not end it by the signal
        click.echo("affrun: tune: interrupted", err=True)
        status = 130
    sys.exit(status)


def _run(parsed: TuneArgs, nproc: int, cores: int, topo: Topology, source: Options) -> int:
    """The trials, the table and the files, the stopping signals noted (exit status 128 + the signal)."""
    from launcher.tune.session import noted

    with noted(exiting=True) as interrupted:
        _tune(parsed, nproc, cores, topo, source, interrupted)
    return 128 + interrupted.signum if interrupted() else 0


def _tune(parsed: TuneArgs, nproc: int, cores: int, topo: Topology, source: Options,
          interrupted: Interrupts) -> None:
    from launcher.base.untrusted import clip, shell_join, shown
    from launcher.tune.candidates import families
    from launcher.tune.result import best, table, to_json, verdict
    from launcher.tune.session import tune as run_tune
    from launcher.tune.trial import TrialSpec

    values = parsed.values
    spec = TrialSpec(parsed.before, parsed.script, nproc, values["warmup_seconds"], values["trial_seconds"],
                     values["start_seconds"], log_dir=getattr(parsed.torchrun, "log_dir", None) is None)
    count = 1 + sum(len(f) for f in families(cores))
    click.echo(f"affrun: tune: {nproc} rank(s) of {cores} core(s): up to {count} trials of "
               f"{values['trial_seconds']:g} s, {values['repeats']} repeat(s), budget {values['budget']:g} s", err=True)
    session = run_tune(spec, cores, values["repeats"], values["budget"],
                       lambda line: click.echo(shown(f"affrun: tune: {line}"), err=True), interrupted)
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
    described = clip(shell_join(parsed.script), 120)  # one printable line: no newline into the YAML comment
    if values["save"] and chosen is not None:
        _save(values["save"], chosen.trial.candidate, described, topo, source)
    if values["svg"]:
        from launcher.tune.command import CHART_TITLE
        from launcher.tune.result import chart

        _write("--svg", values["svg"], chart(session.results, chosen, f"{CHART_TITLE}{clip(described, 80)}"))


def _save(path: str, candidate: Candidate, described: str, topo: Topology, source: Options) -> None:
    import os

    from launcher.base.untrusted import shown
    from launcher.options.tuned import machine_identity, render_tuned
    from launcher.topology import tree_root

    values = {} if candidate.is_default else {"loader_cores": candidate.loader_cores,
                                              "loader_workers": candidate.workers}
    root = tree_root(source.fsroot, source.topology, os.environ)
    now = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    about = (f"affrun tune, {now}: the fastest options for {described} on this machine"
             + (" (the default stood: no option)" if candidate.is_default else ""))
    _write("--save", path, render_tuned(values, machine_identity(topo, root), now, about))
    click.echo(shown(f"saved {path}"), err=True)


def _write(option: str, path: str, text: str) -> None:
    """Write ``text`` to the file the user named, through the one writer, checked again."""
    from launcher.base.outpath import marked, written
    from launcher.tune.command import OUTPUTS

    written(option, path, text.encode("utf-8"), marked(next(m for o, _, m in OUTPUTS if o == option)))
