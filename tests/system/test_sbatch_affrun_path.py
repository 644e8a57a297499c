"""``affrun sbatch`` writes the absolute path of the affrun that rendered it (issue 21 item 5): the job runs that
affrun whether or not ``affrun`` is on the job's PATH; ``--affrun-command`` (or ``--affrun``, or a profile's
``affrun-command``) overrides it. The script is run with bash, srun recorded (tests/sbatch_script.py)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sbatch_script import run_affrun, run_script

VENV_AFFRUN = Path(sys.executable).parent / "affrun"


def srun_words(script: Path, tmp_path: Path, style: str) -> list[str]:
    """The words srun runs in the job: affrun's command, then exec/torchrun."""
    argv = [a.decode() for a in run_script(script, tmp_path)]
    start = next(i for i, word in enumerate(argv) if not word.startswith("-"))  # after srun's own options
    return argv[start:argv.index("exec" if style == "srun" else "torchrun", start)]


@pytest.mark.parametrize("style", ["srun", "torchrun"])
def test_the_script_names_this_affrun_by_absolute_path(tmp_path: Path, style: str) -> None:
    script = tmp_path / "job.sbatch"
    proc = run_affrun("sbatch", "--style", style, "--exclusive", "-o", str(script), "--", "train.py")
    assert proc.returncode == 0, proc.stderr
    (affrun,) = srun_words(script, tmp_path, style)  # the job's PATH (bin/ of recorders, /usr/bin, /bin) has none
    assert os.path.isabs(affrun), affrun
    assert os.access(affrun, os.X_OK), affrun
    assert Path(affrun) == VENV_AFFRUN  # python -m launcher: the affrun beside this interpreter
    version = subprocess.run([affrun, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and "affrun" in version.stdout, version.stderr


def test_started_as_a_script_elsewhere_it_names_that_script(tmp_path: Path) -> None:
    # an `affrun` script outside the venv (a copy on a shared file system, a link in ~/bin) is what the job runs
    bin_dir = tmp_path / "tools bin"
    bin_dir.mkdir()
    mine = bin_dir / "affrun"
    mine.write_text(f"#!{sys.executable}\nimport sys\nfrom launcher.main import main\nsys.exit(main())\n")
    mine.chmod(0o755)
    script = tmp_path / "job.sbatch"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run(["affrun", "sbatch", "--exclusive", "-o", str(script), "--", "train.py"],
                          capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"  {shlex.quote(str(mine))} torchrun" in script.read_text()  # quoted: the path has a blank
    assert srun_words(script, tmp_path, "torchrun") == [str(mine)]


@pytest.mark.parametrize("flag", ["--affrun-command", "--affrun"])
def test_affrun_command_overrides_it(tmp_path: Path, flag: str) -> None:
    script = tmp_path / "job.sbatch"
    proc = run_affrun("sbatch", "--style", "srun", "--exclusive", flag, "/opt/site/venv/bin/affrun --quiet-x",
                      "-o", str(script), "--", "prog")
    assert proc.returncode == 0, proc.stderr
    assert srun_words(script, tmp_path, "srun") == ["/opt/site/venv/bin/affrun", "--quiet-x"]


def test_a_profile_sets_the_affrun_command_and_a_flag_overrides_it(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("profiles:\n  site:\n    affrun-command: /opt/site/bin/affrun\n    exclusive: true\n")
    env = {**os.environ, "AFFRUN_CONFIG": str(config)}
    script = tmp_path / "job.sbatch"
    proc = run_affrun("sbatch", "--profile", "site", "-o", str(script), "--", "train.py", env=env)
    assert proc.returncode == 0, proc.stderr
    assert srun_words(script, tmp_path, "torchrun") == ["/opt/site/bin/affrun"]
    proc = run_affrun("sbatch", "--profile", "site", "--affrun-command", "python3 -m launcher", "-o", str(script),
                      "--", "train.py", env=env)
    assert proc.returncode == 0, proc.stderr
    assert srun_words(script, tmp_path, "torchrun") == ["python3", "-m", "launcher"]


def test_help_names_the_option_and_its_default() -> None:
    proc = run_affrun("sbatch", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.decode().split())
    assert "--affrun-command, --affrun CMD" in text and "absolute path of the affrun" in text
