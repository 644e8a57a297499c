"""Rendering and running sbatch scripts with real bash, srun recorded, and the golden scripts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "data" / "sbatch"


# Every kind of argument a shell could misread. CANARY is replaced by a path that must never be created.
HOSTILE = [
    "two words",
    "",
    "it's",
    'say "hi"',
    "$(touch CANARY)",
    "`touch CANARY`",
    "; touch CANARY",
    "a && touch CANARY",
    "| touch CANARY",
    "line one\nline two",
    "trailing newline\n",
    "*",
    "?[ab]*",
    "{a,b}",
    "~",
    "$HOME ${IFS} $1 $@",
    "\\",
    "'\"'",
    "\t tab",
    "ünïcødé ✓ 日本",
    "#SBATCH --nodes=99",
    "--",
    "--nnodes=9",
    "-c",
    "!!",
    "%j %x",
]


def hostile(canary: Path) -> list[str]:
    return [a.replace("CANARY", str(canary)) for a in HOSTILE]


def run_affrun(*args: str | bytes, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, env=env, cwd=cwd, timeout=60)


def write_recorders(bin_dir: Path, record: Path) -> None:
    """``srun`` and ``scontrol`` that only record what bash gave them: the rest of the script is really run."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    srun = bin_dir / "srun"
    srun.write_text(f"#!{sys.executable}\nimport os, sys\n"
                    f"open({str(record)!r}, 'wb').write(b'\\0'.join(os.fsencode(a) for a in sys.argv[1:]))\n")
    scontrol = bin_dir / "scontrol"
    scontrol.write_text("#!/bin/sh\nprintf 'n1\\nn2\\n'\n")
    srun.chmod(0o755)
    scontrol.chmod(0o755)


def run_script(script: Path, tmp: Path) -> list[bytes]:
    """Run the batch script with bash as a job would, and return the argv its ``exec srun`` received."""
    record = tmp / "srun.argv"
    record.unlink(missing_ok=True)
    write_recorders(tmp / "bin", record)
    env = {
        "PATH": f"{tmp / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp),
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_NNODES": "2",
        "SLURM_JOB_ID": "4242",
        "SLURM_CPUS_ON_NODE": "8",
    }
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, timeout=30, cwd=tmp)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return record.read_bytes().split(b"\0")


def after(argv: list[bytes], marker: bytes) -> list[bytes]:
    return argv[argv.index(marker) + 1 :]



# Control characters a #SBATCH line or a setup line must not carry (tests/unit/test_hostile_api.py).
CONTROL = ["a\x85b", "a\x9bb", "a\u2028b", "a\u2029b", "a\x7fb", "a\x1bb", "a\x0bb"]


# (a newline or a carriage return in a #SBATCH value was refused already; in a setup line it was not)
CONTROL_CASES = [(key, text) for key in ("setup", "job-name", "partition", "sbatch-line", "mem") for text in CONTROL]

