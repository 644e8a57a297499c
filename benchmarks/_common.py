"""Shared helpers for the benchmarks: run commands repeatedly and take medians (ratios, not absolute goals)."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def byte_compile_affrun() -> None:
    """Write affrun's ``.pyc`` files, as ``pip install`` does for a regular install.

    An editable install, or a sandbox with ``PYTHONDONTWRITEBYTECODE=1``, has none: every affrun process would then
    compile its modules from source (about 85 ms for ``affrun torchrun``'s parent, measured here), which no
    installed affrun pays. torch, the baseline, ships its ``.pyc`` files.
    """
    import compileall

    compileall.compile_dir(os.path.join(ROOT, "launcher"), quiet=1)
    print("(affrun's modules byte-compiled first, as pip install does)")


def install_affrun(directory: str) -> tuple[str, str]:
    """Install affrun as the README says (a regular, non-editable ``pip install .``) into a new venv under
    ``directory``; return that venv's python and its ``affrun`` script.

    The development venv is an editable install: every interpreter started there, ``python -c pass`` included,
    first imports the editable finder, which makes any baseline slow and any ratio to it look good. The wheel is
    built offline with this interpreter's setuptools; of affrun's dependencies only click, ``affrun exec``'s parser
    and the one it imports, is there, copied from this interpreter's install.
    """
    import click
    wheels = os.path.join(directory, "wheels")
    venv = os.path.join(directory, "venv")
    quiet = {"check": True, "stdout": subprocess.DEVNULL}
    subprocess.run([PY, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels, ROOT], **quiet)
    subprocess.run([PY, "-m", "venv", venv], **quiet)
    python = os.path.join(venv, "bin", "python")
    wheel = [os.path.join(wheels, name) for name in os.listdir(wheels) if name.startswith("affrun-")]
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *wheel], **quiet)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True,
                          capture_output=True, text=True).stdout.strip()
    shutil.copytree(os.path.dirname(click.__file__), os.path.join(site, "click"))
    print(f"(affrun installed from a wheel into {venv}, as the README's install does)")
    return python, os.path.join(venv, "bin", "affrun")


def affrun_argv() -> list[str]:
    """How to run the affrun under test: its console script on PATH, else this interpreter's ``-m launcher``."""
    script = shutil.which("affrun")
    return [script] if script else [sys.executable, "-m", "launcher"]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "AFFRUN_", "LOCAL_", "PET_"))}
    env.update(extra)
    return env


def wall(argv: Sequence[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(list(argv), env=env if env is not None else clean_env(), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # a failure shows its stderr
    return time.perf_counter() - t0


def median_walls(commands: dict[str, Sequence[str]], repeats: int, env: dict[str, str] | None = None,
                 envs: dict[str, dict[str, str]] | None = None) -> dict[str, float]:
    """Run each command ``repeats`` times, interleaved (so drift hits all alike); return medians in seconds.
    ``envs`` gives some commands an environment of their own (default: ``env``)."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, argv in commands.items():
            times[name].append(wall(argv, (envs or {}).get(name, env)))
    return {name: statistics.median(values) for name, values in times.items()}


PY = sys.executable
AFFRUN = [PY, "-m", "launcher"]
