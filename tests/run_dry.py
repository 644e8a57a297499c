"""``affrun COMMAND --dry-run`` as a subprocess, in tests/launch.py's clean environment: what it would run."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.launch import affrun_argv, clean_env, run

VARIABLE = re.compile(r"[A-Z_][A-Z0-9_]*=")


@dataclass(frozen=True)
class DryRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def variables(self) -> dict[str, str]:
        """The ``NAME=value`` lines of stdout: the variables the command would get."""
        return dict(line.split("=", 1) for line in self.stdout.splitlines() if VARIABLE.match(line))


def dry_run(command: str, *args: str, env: dict[str, str] | None = None, root: Path | None = None,
            program: tuple[str, ...] = ("--", "true"), check: bool = True) -> DryRun:
    """``affrun COMMAND --dry-run [--fsroot ROOT] ARGS PROGRAM`` with ``env`` added to :func:`clean_env`;
    ``check``: it must exit 0 without a traceback."""
    source = ("--fsroot", str(root)) if root is not None else ()
    proc = run(affrun_argv(command, "--dry-run", *source, *args, *program), env=clean_env(**(env or {})))
    if check and (proc.returncode != 0 or "Traceback" in proc.stderr):
        pytest.fail(f"affrun {command} --dry-run exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return DryRun(proc.returncode, proc.stdout, proc.stderr)
