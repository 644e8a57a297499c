"""Site defaults and profiles for ``affrun sbatch`` (YAML): lookup order, precedence, and errors naming the file
and the key. Checked through the real CLI, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.errors import ConfigError
from launcher.slurm.profile import KEYS, find_config, load_config, parse_config

SITE = """\
defaults:
  account: proj42
  time: "01:00:00"
  setup:
    - module load cuda/12.4
profiles:
  gpu-a100:
    partition: a100
    gpus-per-node: 4
    cpus_per_task: 16
    constraint: a100
    loader-cores: 1
    setup: source /opt/venv/bin/activate
  cpu:
    partition: cpu
    no-gpu: true
    ntasks-per-node: 2
"""


def sbatch(*args: str, env_extra: dict[str, str] | None = None, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AFFRUN_CONFIG", "XDG_CONFIG_HOME")}
    if home is not None:
        env["HOME"] = str(home)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "launcher", "sbatch", *args], capture_output=True, text=True,
                          env=env, timeout=60)


def directives(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


@pytest.fixture
def site(tmp_path: Path) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(SITE)
    return path


def test_profile_applies_over_defaults(site: Path) -> None:
    proc = sbatch("--config", str(site), "--profile", "gpu-a100", "--", "train.py")
    assert proc.returncode == 0, proc.stderr
    lines = directives(proc.stdout)
    for expected in ("--account=proj42", "--time=01:00:00", "--partition=a100", "--gpus-per-node=4",
                     "--cpus-per-task=16", "--constraint=a100"):
        assert f"#SBATCH {expected}" in lines
    assert "module load cuda/12.4\nsource /opt/venv/bin/activate\n" in proc.stdout  # lines add up, in order
    assert "--nproc-per-node=4" in proc.stdout
    assert "--loader-cores 1" in proc.stdout  # planning options pass through to affrun in the job


def test_flags_override_the_profile(site: Path) -> None:
    proc = sbatch("--config", str(site), "--profile", "gpu-a100", "--partition", "debug", "--gpus-per-node", "2",
                  "--loader-cores", "0", "--setup", "echo mine", "--", "train.py")
    assert proc.returncode == 0, proc.stderr
    lines = directives(proc.stdout)
    assert "#SBATCH --partition=debug" in lines and "#SBATCH --partition=a100" not in lines
    assert "#SBATCH --gpus-per-node=2" in lines
    assert "--loader-cores" not in proc.stdout
    assert "source /opt/venv/bin/activate\necho mine\n" in proc.stdout


def test_defaults_without_profile(site: Path) -> None:
    proc = sbatch("--config", str(site), "--", "train.py")
    assert proc.returncode == 0, proc.stderr
    lines = directives(proc.stdout)
    assert "#SBATCH --account=proj42" in lines
    assert not any("--partition" in line for line in lines)


def test_lookup_order(tmp_path: Path, site: Path) -> None:
    home = tmp_path / "home"
    default = home / ".config" / "affrun" / "config.yaml"
    default.parent.mkdir(parents=True)
    default.write_text("defaults:\n  account: from-home\n")
    assert "#SBATCH --account=from-home" in sbatch("--", "t.py", home=home).stdout
    via_env = sbatch("--", "t.py", home=home, env_extra={"AFFRUN_CONFIG": str(site)})
    assert "#SBATCH --account=proj42" in via_env.stdout
    other = tmp_path / "other.yaml"
    other.write_text("defaults:\n  account: from-flag\n")
    via_flag = sbatch("--config", str(other), "--", "t.py", home=home, env_extra={"AFFRUN_CONFIG": str(site)})
    assert "#SBATCH --account=from-flag" in via_flag.stdout
    xdg = tmp_path / "xdg"
    (xdg / "affrun").mkdir(parents=True)
    (xdg / "affrun" / "config.yaml").write_text("defaults:\n  account: from-xdg\n")
    assert "#SBATCH --account=from-xdg" in sbatch("--", "t.py", home=home, env_extra={"XDG_CONFIG_HOME": str(xdg)}).stdout


def test_no_file_is_fine_unless_named(tmp_path: Path) -> None:
    assert sbatch("--", "t.py", home=tmp_path).returncode == 0
    assert find_config(None, {"HOME": str(tmp_path)}) == (None, False)
    missing = tmp_path / "nope.yaml"
    proc = sbatch("--", "t.py", home=tmp_path, env_extra={"AFFRUN_CONFIG": str(missing)})
    assert proc.returncode == 2
    assert proc.stderr == f"affrun: error: {missing}: configuration file not found\n"


@pytest.mark.parametrize("body,message", [
    ("profiles:\n  p:\n    gpu-per-node: 4\n", "profiles.p.gpu-per-node: unknown key: did you mean gpus-per-node? (valid: "),
    ("defaults:\n  nodes: two\n", "defaults.nodes: expected an integer, got 'two'"),
    ("defaults:\n  nodes: 0\n", "defaults.nodes: expected an integer from 1"),
    ("defaults:\n  exclusive: 'yes'\n", "defaults.exclusive: expected true or false, got 'yes'"),
    ("defaults:\n  nodes: true\n", "defaults.nodes: expected an integer, got True"),
    ("defaults:\n  time: 1:00:00\n", "defaults.time: expected a string in quotes"),
    ("defaults:\n  mode: fastest\n", "defaults.mode: expected one of exclusive"),
    ("defaults:\n  setup: [1, 2]\n", "defaults.setup: expected a string or a list of strings"),
    ("defaults:\n  rdzv-port: 70000\n", "defaults.rdzv-port: expected an integer from 1 to 65535"),
    ("default:\n  nodes: 2\n", "default: unknown key: did you mean defaults? (valid at the top: defaults, profiles)"),
    ("- a\n- b\n", "expected a mapping with 'defaults' and/or 'profiles'"),
    ("profiles: [a]\n", "profiles: expected a mapping of profile names"),
    ("profiles:\n  p: 3\n", "profiles.p: expected a mapping of option names to values"),
    ("defaults: {nodes: 2\n", "not valid YAML (line"),
    ("defaults: !!python/object:os.system {}\n", "the tag !!python/object:os.system is not plain data"),
])
def test_errors_name_the_file_and_the_key(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    proc = sbatch("--config", str(path), "--", "t.py")
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"affrun: error: {path}: "), proc.stderr
    assert message in proc.stderr
    assert len(proc.stderr.splitlines()) == 1


@pytest.mark.parametrize("body,flags,message", [
    ("defaults:\n  mode: map\n", [], "mode: map needs --map with one CPU list per rank"),  # no map set: a flag
    ("defaults:\n  reserve: x\n", [], "reserve: 'x': not a cpu list"),
    ("defaults:\n  ntasks-per-node: 2\nprofiles:\n  p:\n    map: 0;1;2\n", ["--profile", "p"],
     "map gives 3 entries for 2 rank(s) per node"),
    ("profiles:\n  p:\n    gpus-per-node: 2\n    gpus: 0,2\n", ["--profile", "p"],
     "gpus names GPU 2, but the job asks for 2 GPU(s) per node"),
    # The flag a user typed keeps its flag's name next to the key the file set.
    ("defaults:\n  mode: numa\n", ["--map", "0;1"], "--map gives explicit CPUs, which mode: numa would ignore"),
    ("defaults:\n  no-gpu: true\n", ["--gpus", "0"], "--gpus names GPUs for the ranks, no-gpu plans without GPUs"),
])
def test_option_errors_name_the_profile_s_keys(tmp_path: Path, body: str, flags: list[str], message: str) -> None:
    """A planning option the site file set is named as the file spells it (``map``), not as the flag
    (``--map``), in the planner's checks that sbatch runs before submitting."""
    path = tmp_path / "site.yaml"
    path.write_text(body)
    proc = sbatch("--config", str(path), *flags, "--", "t.py")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("affrun: error: ") and message in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    named = [f"--{word}" for word in ("mode", "map", "reserve", "gpus", "no-gpu") if f"{word}:" in body]
    assert not any(flag in proc.stderr for flag in named), proc.stderr


def test_a_profile_value_is_read_as_the_command_line_reads_it(tmp_path: Path) -> None:
    """One reader per kind of value: a CPU list or a count written as a YAML number is taken, and an empty memory
    request clears the defaults' (as an empty ``gpus-per-node`` did), as the same flags would."""
    path = tmp_path / "site.yaml"
    path.write_text("defaults:\n  mem: 4000\n  reserve: 0\n  loader-cores: '1'\nprofiles:\n  p:\n    mem: ''\n")
    proc = sbatch("--config", str(path), "--profile", "p", "--", "t.py")
    assert proc.returncode == 0, proc.stderr
    assert not [line for line in directives(proc.stdout) if "--mem" in line], directives(proc.stdout)
    assert "--reserve 0 --loader-cores 1" in proc.stdout
    flags = sbatch("--config", str(path), "--mem", "", "--", "t.py")
    assert flags.returncode == 0 and not [line for line in directives(flags.stdout) if "--mem" in line], flags.stdout


def test_unknown_profile_lists_the_profiles(site: Path) -> None:
    proc = sbatch("--config", str(site), "--profile", "gpu-h100", "--", "t.py")
    assert proc.returncode == 2
    assert proc.stderr == f"affrun: error: --profile gpu-h100: no such profile in {site} (profiles: cpu, gpu-a100)\n"


def test_template_path_is_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "mine.sbatch").write_text("{{shebang}}\n# site template\nexec {{command}}\n")
    cfg = tmp_path / "site" / "config.yaml"
    cfg.write_text("defaults:\n  template: mine.sbatch\n")
    proc = sbatch("--config", str(cfg), "--", "t.py")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "#!/bin/bash\n# site template\nexec t.py\n"


def test_every_key_is_an_sbatch_option() -> None:
    from launcher.cli.sbatch_cmd import sbatch as command

    longs = {opt.lstrip("-") for p in command.params for opt in p.opts if opt.startswith("--")}
    assert set(KEYS) <= longs


def test_parse_config_returns_canonical_keys() -> None:
    cfg = parse_config("profiles:\n  x:\n    gpus_per_node: 8\n    sbatch-line: --mail-type=END\n", "f.yaml")
    assert cfg.settings("x") == {"gpus-per-node": "8", "sbatch-line": ["--mail-type=END"]}
    with pytest.raises(ConfigError, match="no such profile"):
        cfg.settings("y")


def test_empty_file_is_no_settings(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing yet\n")
    assert load_config(str(path)).settings(None) == {}
