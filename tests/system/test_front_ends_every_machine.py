"""Every front end on every machine the suite has (issue 26): ``affrun show`` (text and ``--svg``), ``affrun
topology`` (text and ``--json``), ``affrun plan`` (table and ``--json``) and ``affrun doctor``. None may traceback
or exit above 2, and an exit 2 is one ``affrun: error:`` line.

The machines are found, not listed: every hwloc tree (``*.tar.bz2``) and XML export (``*.xml``) under the shared
fixtures, every shape of :func:`tests.fakesys.generated_machines`, and every live-like tree of
:func:`tests.fakesys.write_live_like` (uniform ``cpu_capacity``, one kind allowed, no cpufreq, no ``cache/``, a
hybrid narrowed to one kind with ``--cpus``...). A new fixture or shape is covered without a new test.

The six commands of a machine go through the console script's function (``launcher.main.main``, what ``affrun``
and ``python -m launcher`` call), in this process, each with its own streams, exit status and the environment a
subprocess of the suite gets. Measured on the 2-CPU VM under load: 72 machines in 12 s wall, 4.4 s CPU this way,
against 39 s wall, 21 s CPU with a fresh process per machine (mostly its imports).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from launcher.base.cpulist import parse_cpulist
from tests.conftest import FIXTURES, extract_tarball, need
from tests.fakesys import LIVE_VARIANTS, generated_machines, write_live_like, write_tree
from tests.launch import clean_env

SVG_NS = "{http://www.w3.org/2000/svg}"

@dataclass(frozen=True)
class Machine:
    """``fsroot``: a fixture tarball, a generated shape or a live-like variant; ``topology``: an XML file."""

    name: str
    tarball: Path | None = None
    xml: Path | None = None
    shape: str | None = None
    live: str | None = None
    extra: tuple[str, ...] = field(default=())

    def args(self, tmp: Path) -> list[str]:
        if self.xml is not None:
            return ["--topology", str(self.xml), *self.extra]
        if self.tarball is not None:
            top = extract_tarball(self.tarball, tmp)
            root = top / "fsroot" if (top / "fsroot").is_dir() else top  # hwloc's x86+linux tarballs: <name>/fsroot
        elif self.shape is not None:
            root = write_tree(tmp / "tree", generated_machines()[self.shape])
        else:
            assert self.live is not None
            root = write_live_like(tmp / "tree", self.live, cpus=range(4))
        return ["--fsroot", str(root), *self.extra]


def machines() -> list[Machine]:
    found = [Machine(f"fixture:{p.relative_to(FIXTURES).as_posix()}", tarball=p)
             for p in sorted(FIXTURES.rglob("*.tar.bz2"))]
    found += [Machine(f"fixture:{p.relative_to(FIXTURES).as_posix()}", xml=p) for p in sorted(FIXTURES.rglob("*.xml"))]
    found += [Machine(f"generated:{name}", shape=name) for name in generated_machines()]
    found += [Machine(f"live-like:{variant}", live=variant) for variant in LIVE_VARIANTS]
    # a hybrid machine narrowed to one kind: by --cpus, and in hwloc's Raptor Lake export (P-cores are 0-11)
    found.append(Machine("live-like:hybrid --cpus P-cores", live="hybrid", extra=("--cpus", "0-1")))
    found.append(Machine("live-like:hybrid --cpus E-cores", live="hybrid", extra=("--cpus", "2-3")))
    raptor = FIXTURES / "hwloc-hybrid" / "Intel-RaptorLake-Corei7-1370P.xml"
    if raptor.is_file():
        found.append(Machine("fixture:Raptor Lake XML --cpus P-cores", xml=raptor, extra=("--cpus", "0-11")))
    return found


MACHINES = machines()


def test_the_fixtures_are_there() -> None:
    """Under CI=true, missing fixtures fail here instead of leaving the machines below silently fewer."""
    need(any(m.tarball for m in MACHINES) and sum(1 for m in MACHINES if m.xml) >= 20,
         f"hwloc trees and XML exports not found under {FIXTURES} (set AFFRUN_FIXTURES)")


def run_commands(commands: list[list[str]], monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Each argv through ``launcher.main.main`` with its own stdout and stderr, in the environment a subprocess of
    the suite gets (:func:`tests.launch.clean_env`): ``{rc, stdout, stderr, traceback}`` per command. An exception
    out of ``main`` is what a user would see as a traceback."""
    from launcher.main import main

    clean = clean_env()
    for name in [n for n in os.environ if n not in clean]:
        monkeypatch.delenv(name)
    results = []
    for argv in commands:
        out, err, tb = io.StringIO(), io.StringIO(), None
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(argv)
                rc = 0
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
            except BaseException:  # whatever escapes main is the finding
                rc, tb = 1, traceback.format_exc()
        results.append({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue(), "traceback": tb})
    return results


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.name)
def test_every_front_end_runs_on_every_machine(machine: Machine, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    args = machine.args(tmp_path)
    svg = tmp_path / "map.svg"
    commands = [["show", *args, "--svg", str(svg)], ["topology", *args], ["topology", *args, "--json"],
                ["plan", *args], ["plan", *args, "--json"], ["doctor", *args]]
    results = run_commands(commands, monkeypatch)
    for argv, r in zip(commands, results):
        said = f"affrun {' '.join(argv)} exited {r['rc']}\nstderr:\n{r['stderr'][-3000:]}"
        assert r["traceback"] is None, f"{said}\n{r['traceback']}"
        assert "Traceback" not in r["stderr"], said
        assert r["rc"] in ((0, 1, 2) if argv[0] == "doctor" else (0, 2)), said
        if r["rc"] == 2:
            assert len([ln for ln in r["stderr"].splitlines() if ln.startswith("affrun: error:")]) == 1, said
    show, _, topo_json, _, plan_json, _ = results
    if topo_json["rc"] != 0:
        return  # the machine is refused (one line, checked above); so is every command on it
    cpus = set(json.loads(topo_json["stdout"])["cpus"])
    if plan_json["rc"] == 0:  # what plan --json gives is on the machine topology --json describes
        for rank in json.loads(plan_json["stdout"])["ranks"]:
            assert set(rank["cpus"]) <= cpus, (rank, sorted(cpus))
    if show["rc"] == 0:  # the SVG draws every allowed CPU, in one core box each
        drawn = [parse_cpulist(r.get("data-pus", "")) for r in ET.parse(svg).getroot().iter(f"{SVG_NS}rect")
                 if "core" in (r.get("class") or "").split()]
        assert sum(len(d & cpus) for d in drawn) == len(cpus) and set().union(*drawn) >= cpus
