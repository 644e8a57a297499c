"""Issue 34, class 4: hostile ``--tuned FILE`` files, and the same attacks on ``affrun sbatch``'s site profiles
(both read by launcher/base/safe_yaml.py), through the real ``affrun`` command: one ``affrun: error:`` line naming
the file, exit 2, no traceback, no hang (a FIFO, a device, a directory, a 1 GiB file are refused before a byte is
read), no Python object built. A file from another machine is applied with a warning; an option it gives that
this machine cannot take is the same error as that flag given on the command line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.errors import refused
from tests.fakesys import FakeGPU, uniform, write_tree
from tests.launch import affrun, affrun_argv, clean_env, run
from tests.machines import fake_cpu_4000_tree

HEAD = "affrun-tuned: 1\noptions:\n  loader-cores: 1\n"
BOMB = "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return fake_cpu_4000_tree(tmp_path)


def exec_tuned(tree: Path, path: str, *flags: str) -> object:
    return affrun("exec", "--dry-run", "--fsroot", str(tree), "--local-rank", "0", "--nproc-per-node", "2", *flags,
                  "--tuned", path, "--", "true")


# ------------------------------------------------------------------------------------------ the file's text
BAD_TEXT: dict[str, tuple[str | bytes, str]] = {
    "alias bomb": (HEAD + BOMB, "more than 100000 values once its aliases are expanded"),
    "alias bomb as the date": (HEAD + BOMB + "date: *l9\n", "values once its aliases are expanded"),
    "alias bomb in the machine": (HEAD + BOMB + "machine: {gpus: *l9}\n", "values once its aliases are expanded"),
    "alias inside itself": (HEAD + "machine: &m {gpus: [*m]}\n", "an alias refers to the value that holds it"),
    "python tag": (HEAD + "date: !!python/object/apply:os.system ['true']\n",
                   "the tag !!python/object/apply:os.system is not plain data"),
    "python name": ("affrun-tuned: 1\noptions: !!python/name:os.system\n", "!!python/name:os.system"),
    "deep flow nesting": (HEAD + "date: " + "[" * 20_000 + "]" * 20_000 + "\n", "nest"),
    "deep block nesting": (HEAD + "machine:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(100)),
                           "nested deeper than"),
    "5,000-digit count": ("affrun-tuned: 1\noptions:\n  loader-cores: " + "9" * 5000 + "\n", "cannot build"),
    "int tag on a word": ("affrun-tuned: 1\noptions:\n  loader-cores: !!int abc\n", "cannot build"),
    "a key twice": ("affrun-tuned: 1\noptions:\n  loader-cores: 1\n  loader-cores: 0\n", "given twice"),
    "not UTF-8": (b"affrun-tuned: 1\noptions: {mode: \xff}\n", "not UTF-8 text"),
    "NUL byte": (b"affrun-tuned: 1\x00\n", "not valid YAML"),
    "two documents": (HEAD + "---\n" + HEAD, "not valid YAML"),
    "not a mapping": ("- affrun-tuned\n", "not a file of affrun tune --save"),
    "no options": ("affrun-tuned: 1\n", "not a file of affrun tune --save"),
    "another format": ("affrun-tuned: 2\noptions: {}\n", "'affrun-tuned: 1' is missing"),
    "empty": ("", "not a file of affrun tune --save"),
    # unknown keys: one line naming the key and the nearest valid one
    "unknown option": ("affrun-tuned: 1\noptions:\n  loader-core: 2\n",
                       "unknown option loader-core: did you mean loader-cores?"),
    "an option tune does not set": ("affrun-tuned: 1\noptions:\n  cpus: 0-3\n", "unknown option cpus"),
    "unknown top-level key": ("affrun-tuned: 1\noption:\n  loader-cores: 2\n",
                              "unknown key option: did you mean options?"),
    "unknown machine key": (HEAD + "machine: {core: 4}\n", "unknown machine key core: did you mean cores?"),
    "non-string key": ("affrun-tuned: 1\noptions:\n  7: 2\n", "unknown option 7"),
    # wrong types
    "count as a list": ("affrun-tuned: 1\noptions:\n  loader-cores: [1]\n", "loader-cores: a list of 1 item(s)"),
    "count as true": ("affrun-tuned: 1\noptions:\n  loader-workers: true\n", "loader-workers: True is not a whole"),
    "count as a float": ("affrun-tuned: 1\noptions:\n  comm-cores: 1.5\n", "comm-cores: 1.5 is not a whole number"),
    "count past any machine": ("affrun-tuned: 1\noptions:\n  loader-workers: 99999\n", "from 0 to 65536"),
    "negative count": ("affrun-tuned: 1\noptions:\n  loader-cores: -1\n", "loader-cores: -1"),
    "flag as a string": ("affrun-tuned: 1\noptions:\n  smt: 'yes'\n", "smt: 'yes' is not true or false"),
    "not a choice": ("affrun-tuned: 1\noptions:\n  mode: sideways\n", "mode: 'sideways' is not one of"),
    "map as a list": ("affrun-tuned: 1\noptions:\n  map: [0, 1]\n", "map: a list of 2 item(s) is not a string"),
    "options as a list": ("affrun-tuned: 1\noptions: [loader-cores]\n", "no 'options' mapping"),
    "machine as a string": (HEAD + "machine: big\n", "machine: 'big' is not a mapping"),
    "cores as a string": (HEAD + "machine: {cores: many}\n", "machine: cores: 'many' is not a whole number"),
    "gpus as a string": (HEAD + "machine: {gpus: nvidia}\n", "machine: gpus: 'nvidia' is not a list"),
    "date as a mapping": (HEAD + "date: {day: 1}\n", "date: a mapping of 1 key(s) is not a string"),
}


@pytest.mark.parametrize("case", list(BAD_TEXT))
def test_a_hostile_tuned_file_is_one_line_naming_it(tree: Path, tmp_path: Path, case: str) -> None:
    text, needle = BAD_TEXT[case]
    path = tmp_path / "t.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    refused(exec_tuned(tree, str(path)), f"--tuned {path}: ", needle)


def test_a_python_tag_builds_nothing(tree: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "t.yaml"
    path.write_text(f"affrun-tuned: 1\noptions: !!python/object/apply:os.system ['touch {marker}']\n")
    refused(exec_tuned(tree, str(path)), "is not plain data")
    assert not marker.exists()


def test_dates_and_timestamps_stay_strings(tree: Path, tmp_path: Path) -> None:
    """``date: 2001-02-30`` (no such day) unquoted, as a hand-edited file may have it: a string, no error."""
    path = tmp_path / "t.yaml"
    path.write_text(HEAD + "machine: {cores: 64}\ndate: 2001-02-30\n")
    proc = exec_tuned(tree, str(path))
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    assert "tuned on another machine on 2001-02-30: cores 64 there, 4 here" in proc.stderr  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------ what the path names
def special(tmp_path: Path, kind: str) -> str:
    """A path that names no small regular file: a directory, a FIFO nobody writes to, a sparse 1 GiB file, a
    character device, a link to a FIFO, a missing file."""
    path = tmp_path / f"{kind}.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind in ("fifo", "link to a fifo"):
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        if kind == "fifo":
            return str(fifo)
        path.symlink_to(fifo)
    elif kind == "1 GiB":
        with open(path, "wb") as fh:
            fh.write(HEAD.encode())
            fh.truncate(1 << 30)
    elif kind == "device":
        return "/dev/zero"
    return str(path)


SPECIAL = {"directory": "is a directory", "fifo": "not a regular file", "link to a fifo": "not a regular file",
           "1 GiB": "larger than 65536 bytes", "device": "not a regular file", "missing": "No such file"}


@pytest.mark.parametrize("kind", list(SPECIAL))
def test_a_path_that_is_no_small_file_is_refused_at_once(tree: Path, tmp_path: Path, kind: str) -> None:
    """Refused before a byte is read: a FIFO's open does not wait for a writer (the run's timeout would catch a
    wait), a 1 GiB file's size is checked first."""
    path = special(tmp_path, kind)
    refused(exec_tuned(tree, path), f"--tuned {path}: {SPECIAL[kind]}")


def _script(tmp_path: Path) -> str:
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    return str(script)


def front_end(command: str, path: str, tmp_path: Path) -> list[str]:
    script = _script(tmp_path)
    return {"exec": ["exec", "--dry-run", "--tuned", path, "--", sys.executable, script],
            "run": ["run", "--dry-run", "--tuned", path, "--", sys.executable, script],
            "torchrun": ["torchrun", "--dry-run", "--nproc-per-node", "1", "--tuned", path, script],
            "sbatch": ["sbatch", "--tuned", path, "--", script]}[command]


@pytest.mark.parametrize("command", ["exec", "run", pytest.param("torchrun", marks=pytest.mark.torch), "sbatch"])
@pytest.mark.parametrize("kind", ["fifo", "1 GiB", "alias bomb", "python tag", "unknown option"])
def test_every_front_end_refuses_the_same_way(tmp_path: Path, command: str, kind: str) -> None:
    if kind in SPECIAL:
        path, needle = special(tmp_path, kind), SPECIAL[kind]
    else:
        text, needle = BAD_TEXT[kind]
        path = str(tmp_path / "t.yaml")
        Path(path).write_text(str(text))
    proc = run(affrun_argv(*front_end(command, path, tmp_path)), env=clean_env(), timeout=60)
    refused(proc, f"--tuned {path}: ", needle)
    assert "ran" not in proc.stdout


# ------------------------------------------------------------------------------------------ another machine
FOREIGN = ("affrun-tuned: 1\noptions:\n{options}machine:\n  cpu-model: Other CPU\n  packages: 2\n  cores: 64\n"
           "  cpus: 128\n  gpus: [nvidia, nvidia]\ndate: '2026-01-01'\n")


def test_a_file_from_another_machine_is_applied_with_a_warning(tree: Path, tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(FOREIGN.format(options="  loader-cores: 1\n  loader-workers: 3\n"))
    proc = exec_tuned(tree, str(path))
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    (warning,) = [line for line in proc.stderr.splitlines() if "warning" in line]  # type: ignore[attr-defined]
    for difference in ("cpu-model 'Other CPU' there, 'Fake CPU 4000' here", "packages 2 there, 1 here",
                       "cores 64 there, 4 here", "cpus 128 there, 4 here", "gpus ['nvidia', 'nvidia'] there, [] here"):
        assert difference in warning, warning
    assert "AFFRUN_LOADER_WORKERS=3" in proc.stdout and "AFFRUN_LOADER_CPUS=1\n" in proc.stdout  # type: ignore[attr-defined]


def test_the_warning_shows_the_file_s_escape_sequences_escaped(tree: Path, tmp_path: Path) -> None:
    path = tmp_path / "t\x1b[31m.yaml"
    path.write_text(HEAD + 'machine: {cpu-model: "Other\\x1b[2J", cores: 64}\ndate: "x\\x1b]0;title\\x07"\n')
    proc = exec_tuned(tree, str(path))
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    (warning,) = [line for line in proc.stderr.splitlines() if "warning" in line]  # type: ignore[attr-defined]
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr  # type: ignore[attr-defined]
    assert "on x\\x1b]0;title\\x07: cpu-model 'Other\\x1b[2J' there" in warning, warning


def test_the_machine_s_cpuinfo_as_a_fifo_does_not_hang_the_comparison(tree: Path, tmp_path: Path) -> None:
    (tree / "proc/cpuinfo").unlink()
    os.mkfifo(tree / "proc/cpuinfo")
    path = tmp_path / "t.yaml"
    path.write_text(FOREIGN.format(options="  loader-cores: 1\n"))
    proc = exec_tuned(tree, str(path))
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    assert "cpu-model 'Other CPU' there, 'unknown' here" in proc.stderr  # type: ignore[attr-defined]


# An option this machine cannot take: the file's value is applied as if given on the command line, so the
# outcome is that flag's (docs/tune.md): the same error line, which names the file and its machine, or the same
# warning.
LACKING = {
    "CPUs it lacks": ("map", "0-1;2-63"),
    "GPUs it lacks": ("gpus", "0,1"),
    "more loader cores than a rank has": ("loader-cores", "8"),
    "reserving every core": ("reserve", "0-3"),
}


@pytest.mark.parametrize("case", list(LACKING))
def test_an_option_this_machine_lacks_is_that_flag_s_error(tree: Path, tmp_path: Path, case: str) -> None:
    key, value = LACKING[case]
    path = tmp_path / "t.yaml"
    path.write_text(FOREIGN.format(options=f"  {key}: '{value}'\n"))
    given = refused(affrun("exec", "--dry-run", "--fsroot", str(tree), "--local-rank", "0", "--nproc-per-node",
                           "2", f"--{key}", value, "--", "true"))
    machine = "tuned on 'Other CPU', 2 packages, 64 cores, 128 CPUs, 2 GPUs"
    assert refused(exec_tuned(tree, str(path))) == f"{given} (from --tuned {path}, {machine})"


def test_more_comm_cores_than_a_rank_has_is_a_warning_as_the_flag_s(tree: Path, tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(FOREIGN.format(options="  comm-cores: 8\n"))
    proc = exec_tuned(tree, str(path))
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    assert "--comm-cores 8 ignored" in proc.stdout  # type: ignore[attr-defined]  # the dry run's note
    assert "AFFRUN_COMM_CPUS=\n" in proc.stdout  # type: ignore[attr-defined]


def test_a_gpu_machine_s_file_names_only_what_differs(tmp_path: Path) -> None:
    """Tuned on a machine of the same GPUs and more cores: applied (comm cores and loader cores here too), and
    the warning names the cores, not the GPUs."""
    m = uniform(1, 8)
    m.gpus = [FakeGPU(pci=f"0000:{0x17 + i:02x}:00.0", numa_node=0) for i in range(2)]
    root = write_tree(tmp_path / "gpu", m)
    path = tmp_path / "t.yaml"
    path.write_text("affrun-tuned: 1\noptions:\n  comm-cores: 1\n  loader-cores: 1\n"
                    "machine: {cores: 64, gpus: [nvidia, nvidia]}\n")
    proc = affrun("exec", "--dry-run", "--fsroot", str(root), "--local-rank", "0", "--nproc-per-node", "2",
                  "--tuned", str(path), "--", "true")
    assert proc.returncode == 0, proc.stderr
    (warning,) = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert "cores 64 there, 8 here; run affrun tune here" in warning, warning
    env = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert env["AFFRUN_COMM_CPUS"] and env["NCCL_PROXY_CPUSET"] == env["AFFRUN_COMM_CPUS"], proc.stdout
    assert env["AFFRUN_LOADER_CPUS"] and env["AFFRUN_GPU"] == "0", proc.stdout


# ------------------------------------------------------------------------------------------ site profiles
PROFILE_TEXT = {
    "alias bomb": (BOMB + "defaults:\n  setup: *l9\n", "values once its aliases are expanded"),
    "alias inside itself": ("defaults: &d\n  setup: [*d]\n", "an alias refers to the value that holds it"),
    "a key twice": ("defaults:\n  nodes: 1\n  nodes: 2\n", "the key 'nodes' is given twice"),
    "binary tag": ("defaults:\n  job-name: !!binary aGVsbG8=\n", "the tag !!binary is not plain data"),
    "unknown key": ("defaults:\n  partiton: a\n", "defaults.partiton: unknown key: did you mean partition?"),
    "unknown top-level key": ("default:\n  nodes: 1\n", "default: unknown key: did you mean defaults?"),
}


@pytest.mark.parametrize("case", list(PROFILE_TEXT))
def test_a_hostile_site_profile_is_one_line(tmp_path: Path, case: str) -> None:
    text, needle = PROFILE_TEXT[case]
    path = tmp_path / "config.yaml"
    path.write_text(text)
    refused(affrun("sbatch", "--config", str(path), "--", "train.py"), f"{path}: ", needle)


def test_a_python_tag_in_a_profile_builds_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "config.yaml"
    path.write_text(f"defaults: !!python/object/apply:os.system ['touch {marker}']\n")
    refused(affrun("sbatch", "--config", str(path), "--", "train.py"), "is not plain data")
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["directory", "fifo", "1 GiB", "device"])
def test_a_profile_path_that_is_no_small_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    path = special(tmp_path, kind)
    needle = {"1 GiB": "larger than 1 MiB"}.get(kind, SPECIAL[kind])
    refused(run(affrun_argv("sbatch", "--config", path, "--", "train.py"), env=clean_env(), timeout=60),
            f"{path}: {needle}")


def test_a_mode_given_on_the_command_line_wins_over_the_file_s_map(tree: Path, tmp_path: Path) -> None:
    """The file's ``map`` belongs to its ``mode: map``: ``--mode exclusive`` given here plans exclusive (the
    file's map made it map mode silently before); without a flag the file's map is applied."""
    path = tmp_path / "t.yaml"
    path.write_text(FOREIGN.format(options="  mode: map\n  map: '0;3'\n"))
    mine = exec_tuned(tree, str(path), "--mode", "exclusive")
    assert mine.returncode == 0, mine.stderr  # type: ignore[attr-defined]
    assert "AFFRUN_CPUS=0-1\n" in mine.stdout, mine.stdout  # type: ignore[attr-defined]  # 2 of 4 cores: exclusive
    theirs = exec_tuned(tree, str(path))
    assert "AFFRUN_CPUS=0\n" in theirs.stdout, theirs.stdout  # type: ignore[attr-defined]
    # --mode map given here as well: the file's map still belongs to it (it was dropped: "--mode map needs --map")
    same = exec_tuned(tree, str(path), "--mode", "map")
    assert same.returncode == 0 and "AFFRUN_CPUS=0\n" in same.stdout, same.stderr  # type: ignore[attr-defined]
