"""affrun run --dry-run as a subprocess, in an environment without affrun's or OpenMP's variables."""

from __future__ import annotations

import os
import subprocess
import sys

AFFRUN = [sys.executable, "-m", "launcher", "run"]


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AFFRUN_", "LOCAL_", "OMP_", "KMP_"))}
    return {**base, **extra}


def dry_run(*options: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    out = subprocess.run([*AFFRUN, *options, "--dry-run", "--", "x"], capture_output=True, text=True, timeout=60,
                         check=True, env=env(**(extra or {}))).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if line.startswith("AFFRUN_"))

