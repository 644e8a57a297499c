"""pytest plugin (docs/python-api.md, "In CI: the pytest plugin"): the ``affinity_doctor`` fixture, which runs
``affrun doctor``'s checks on a launch environment, and ``--affrun-guard``, which audits pytest's own."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from launcher.doctor.findings import SEVERITIES, Finding, Severity, severity_named, worst_first
from launcher.topology.model import Topology

if TYPE_CHECKING:
    from launcher.doctor.diagnose import Audited

TopologySource = str | os.PathLike[str] | Topology | None


def load_env_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """``KEY=VALUE`` lines of a shell-style environment file; ``export``, quotes and ``#`` comments are allowed."""
    env: dict[str, str] = {}
    for number, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].strip()
        key, sep, value = line.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"{path}:{number}: expected KEY=VALUE, got {raw!r}")
        parts = shlex.split(value, comments=True)
        env[key] = " ".join(parts) if parts else ""
    return env


def _machine(source: TopologySource) -> Audited:
    """The machine ``topology=`` names (a Topology, an fsroot directory, a saved file), else this one."""
    from launcher.doctor.diagnose import Audited, audited_machine

    if isinstance(source, Topology):
        return Audited(source, live=False)
    if source is None:
        return audited_machine()
    path = os.fspath(source)
    return audited_machine(fsroot=path) if os.path.isdir(path) else audited_machine(topology_file=path)


def check_launch_environment(
    environ: Mapping[str, str] | None = None,
    *,
    nproc_per_node: int | None = None,
    topology: TopologySource = None,
    openmp: Sequence[str] | None = None,
    host: bool = False,
) -> list[Finding]:
    """``affrun doctor``'s findings for ``environ`` (default: this process's), on ``topology`` (a saved file, an
    fsroot directory or a Topology; default this machine), with the ``openmp`` runtimes the job uses (default the
    installed torch's); ``host``: also check this machine."""
    from launcher.doctor.diagnose import diagnose

    env = dict(os.environ if environ is None else environ)
    return diagnose(env, _machine(topology), nproc=nproc_per_node, openmp=openmp,
                    openmp_source="given" if openmp is not None else "", probe_host=host)[1]


def assert_launch_environment_safe(
    environ: Mapping[str, str] | None = None,
    *,
    fail_on: Severity = "error",
    nproc_per_node: int | None = None,
    topology: TopologySource = None,
    openmp: Sequence[str] | None = None,
    host: bool = False,
) -> list[Finding]:
    """Fail (``AssertionError``) when a finding reaches ``fail_on``; return every finding otherwise."""
    if fail_on not in SEVERITIES:
        raise ValueError(f"fail_on must be one of {', '.join(SEVERITIES)}")
    findings = check_launch_environment(environ, nproc_per_node=nproc_per_node, topology=topology, openmp=openmp,
                                        host=host)
    bad = _lines(findings, fail_on)
    if bad:
        raise AssertionError(f"unsafe launch environment (affrun doctor):\n{bad}")
    return findings


def _lines(findings: list[Finding], level: Severity) -> str:
    """The findings at or above ``level``, worst first, one line each."""
    from launcher.doctor.report import finding_line

    return "\n".join(finding_line(f) for f in worst_first(findings) if f.at_least(level))


class AffinityDoctor:
    """What the ``affinity_doctor`` fixture gives a test."""

    check = staticmethod(check_launch_environment)
    assert_safe = staticmethod(assert_launch_environment_safe)
    load_env_file = staticmethod(load_env_file)


@pytest.fixture
def affinity_doctor() -> AffinityDoctor:
    return AffinityDoctor()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("affrun", "affrun launch-environment guard")
    group.addoption("--affrun-guard", action="store", nargs="?", const="error", default=None,
                    choices=list(SEVERITIES), metavar="SEVERITY",
                    help="audit the environment pytest runs in (affrun doctor) and stop when a finding reaches "
                         "SEVERITY (default when given: error)")
    parser.addini("affrun_guard", "like --affrun-guard: info, warning or error (empty: off)", default="")


def _guard_level(config: pytest.Config) -> Severity | None:
    level = config.getoption("affrun_guard") or str(config.getini("affrun_guard") or "").strip() or None
    if level is None:
        return None
    try:
        return severity_named(level)
    except ValueError:
        raise pytest.UsageError(f"affrun_guard = {level!r}: choose info, warning or error") from None


def pytest_sessionstart(session: pytest.Session) -> None:
    level = _guard_level(session.config)
    if level is None:
        return
    bad = _lines(check_launch_environment(host=True), level)
    if bad:
        pytest.exit(f"affrun guard: unsafe launch environment\n{bad}", returncode=1)
