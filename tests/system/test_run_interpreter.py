"""``affrun run`` never reports a binding it did not make (issue 21, item 1).

Under ``affrun run`` only the startup hook binds, and only an interpreter whose site-packages hold
``affrun-startup.pth`` runs it. The tests run the real CLI with real interpreters: this venv's python (it has the
hook), and a plain ``python -m venv --without-pip`` venv, which does not (``PYTHONPATH`` makes ``launcher``
importable there, but no ``.pth`` file runs it), reached every way COMMAND can name an interpreter: by path, by
name on ``PATH``, through ``env``, a ``#!`` line, ``#!/usr/bin/env -S``, a console script, pip's ``/bin/sh``
trampoline. ``affrun doctor --pid`` then audits such a job while it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need
from tests.errors import refused
from tests.fakesys import this_machine_with_gpus, write_tree
from tests.launch import affrun_argv, clean_env, executable, rank_lines
from tests.system.test_hostile_input import affrun

CPUS = frozenset(os.sched_getaffinity(0))
HERE = str(Path(sys.executable).parent)  # this venv's bin: its python loads the hook
# What a rank reports: the mask it runs on and whether the hook bound it; then the canary says it ran.
REPORT = ("import os, sys, json; print(json.dumps([sorted(os.sched_getaffinity(0)), "
          "os.environ.get('AFFRUN_LOCAL_RANK')])); open(sys.argv[1], 'w').close()")


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv without affrun: ``bin/python3`` has no ``affrun-startup.pth`` in its site-packages."""
    root = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python3"
    site = subprocess.run([str(python), "-c", "import site; print(*site.getsitepackages())"], capture_output=True,
                          text=True, check=True).stdout.split()
    assert not any((Path(d) / "affrun-startup.pth").exists() for d in site)
    return python


def commands(bare: Path, tmp: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Every way a COMMAND reaches the venv without affrun: (COMMAND, extra environment)."""
    body = f"import sys\nexec({REPORT!r})\n"
    on_path = {"PATH": f"{bare.parent}:{os.environ['PATH']}"}
    return {
        "path": ([str(bare), "-c", REPORT], {}),
        "name on PATH": (["python3", "-c", REPORT], on_path),
        "env": (["env", "A=1", "python3", "-c", REPORT], on_path),
        "#! line": ([str(executable(tmp / "train.py", f"#!{bare}\n{body}"))], {}),
        "#!/usr/bin/env": ([str(executable(tmp / "env_train.py", f"#!/usr/bin/env python3\n{body}"))], on_path),
        "#!/usr/bin/env -S": ([str(executable(tmp / "split.py", f"#!/usr/bin/env -S python3 -u\n{body}"))], on_path),
        # a console script as pip writes it (torchrun, accelerate, deepspeed are such), found on PATH
        "console script": (["mytrain"], {"PATH": f"{executable(tmp / 'bin' / 'mytrain', console(bare)).parent}:"
                                                 f"{os.environ['PATH']}"}),
        # pip's and uv's trampoline for a long interpreter path or one with a space
        "sh trampoline": ([str(executable(tmp / "tramp", f"#!/bin/sh\n'''exec' \"{bare}\" \"$0\" \"$@\"\n' '''\n{body}"))],
                          {}),
    }


def console(bare: Path) -> str:
    """A console script as pip writes it for an entry point."""
    return f"#!{bare}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nexec({REPORT!r})\n"


CASES = ["path", "name on PATH", "env", "#! line", "#!/usr/bin/env", "#!/usr/bin/env -S", "console script",
         "sh trampoline"]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "bin").mkdir()
    return tmp_path


@pytest.mark.parametrize("case", CASES)
def test_a_python_without_the_hook_is_one_warning_and_no_rank_line(bare: Path, workdir: Path, case: str) -> None:
    command, extra = commands(bare, workdir)[case]
    canary = workdir / "ran"
    proc = affrun("run", "--nproc-per-node", "1", "--", *command, str(canary), env=extra)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("affrun: warning:")]
    assert len(warnings) == 1, proc.stderr
    assert str(bare.parent) in warnings[0] and "startup hook" in warnings[0]
    assert "pip install affrun" in warnings[0] and "environment that has affrun" in warnings[0]
    assert rank_lines(proc.stderr) == []  # no line reports the binding that is not made
    bound = json.loads(proc.stdout.splitlines()[-1])[1]
    assert bound is None and canary.exists()  # COMMAND still ran, as given, unbound


@pytest.mark.parametrize("case", CASES)
def test_strict_refuses_and_runs_nothing(bare: Path, workdir: Path, case: str) -> None:
    command, extra = commands(bare, workdir)[case]
    canary = workdir / "ran"
    line = refused(affrun("run", "--strict", "--nproc-per-node", "1", "--", *command, str(canary), env=extra),
                   "--strict", str(bare.parent), "startup hook")
    assert "nothing was run" in line
    assert not canary.exists()


def test_strict_refuses_before_any_rank_line(bare: Path, tmp_path: Path) -> None:
    proc = affrun("run", "--strict", "--nproc-per-node", "1", "--", str(bare), "-c", "pass")
    refused(proc)
    assert proc.stderr.splitlines() == [ln for ln in proc.stderr.splitlines() if ln.startswith("affrun: error:")]


# Not -I or -E here: they drop PYTHONPATH, which points the tests at this checkout's affrun.
@pytest.mark.parametrize(("flags", "shown"), [(["-S"], "-S"), (["-s", "-S"], "-S"), (["-uS"], "-S"),
                                              (["-B", "-sS", "-X", "utf8"], "-S")])
def test_an_option_that_turns_site_off_is_named(tmp_path: Path, flags: list[str], shown: str) -> None:
    """This venv's python has the hook, but not with -S: the warning names the option, not the install."""
    canary = tmp_path / "ran"
    proc = affrun("run", "--nproc-per-node", "1", "--", sys.executable, *flags, "-c", REPORT, str(canary))
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("affrun: warning:")]
    assert len(warnings) == 1 and f"drop {shown}" in warnings[0], proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])[1] is None and canary.exists()
    refused(affrun("run", "--strict", "--nproc-per-node", "1", "--", sys.executable, *flags, "-c", "pass"),
            f"drop {shown}")


@pytest.mark.parametrize("env_words", [["env", "-i"], ["env", "-uAFFRUN_RUN"], ["env", "--unset=AFFRUN_RUN"],
                                       ["env", "-", "PATH=/usr/bin"]])
def test_an_env_that_drops_the_plan_is_named(tmp_path: Path, env_words: list[str]) -> None:
    canary = tmp_path / "ran"
    proc = affrun("run", "--nproc-per-node", "1", "--", *env_words, sys.executable, "-c", REPORT, str(canary))
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("affrun: warning:")]
    assert len(warnings) == 1 and "AFFRUN_" in warnings[0] and "env" in warnings[0], proc.stderr
    assert rank_lines(proc.stderr) == [] and canary.exists()
    refused(affrun("run", "--strict", "--nproc-per-node", "1", "--", *env_words, sys.executable, "-c", "pass"))


def good_commands(tmp: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    on_path = {"PATH": f"{HERE}:{os.environ['PATH']}"}
    body = f"import sys\nexec({REPORT!r})\n"
    return {
        "path": ([sys.executable, "-u", "-c", REPORT], {}),
        "env name": (["env", "-u", "UNRELATED", "python3", "-c", REPORT], on_path),
        "#!/usr/bin/env -S": ([str(executable(tmp / "ok.py", f"#!/usr/bin/env -S python3 -u\n{body}"))], on_path),
        "sh trampoline": ([str(executable(tmp / "ok", f"#!/bin/sh\n'''exec' '{sys.executable}' \"$0\" \"$@\"\n' '''\n"
                                                  f"{body}"))], {}),
    }


@pytest.mark.parametrize("case", ["path", "env name", "#!/usr/bin/env -S", "sh trampoline"])
def test_a_python_with_the_hook_binds_under_strict(tmp_path: Path, case: str) -> None:
    """No false alarm: the hook is there, --strict runs COMMAND, and the rank is bound and reported."""
    command, extra = good_commands(tmp_path)[case]
    canary = tmp_path / "ran"
    proc = affrun("run", "--strict", "--verbose", "--nproc-per-node", "1", "--", *command, str(canary), env=extra)
    assert proc.returncode == 0 and "affrun: warning" not in proc.stderr, proc.stderr
    assert "loads affrun's startup hook" in proc.stderr
    bound = json.loads(proc.stdout.splitlines()[-1])[1]
    assert bound == "0" and canary.exists()
    assert rank_lines(proc.stderr)[0]["cpus"]


def test_a_real_console_script_with_the_hook_passes(tmp_path: Path) -> None:
    torchrun = Path(HERE) / "torchrun"
    need(torchrun.exists(), "torchrun is not installed in this venv")
    proc = affrun("run", "--strict", "--verbose", "--nproc-per-node", "1", "--dry-run", "--", str(torchrun), "t.py")
    assert proc.returncode == 0 and f"the #! line of {torchrun}" in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", [["bash", "-c", "exit 0"], ["true"], ["env", "sh", "-c", "exit 0"],
                                     ["shell script"], ["taskset", "-c", "0", "true"]])
def test_a_command_that_is_no_python_is_not_checked(tmp_path: Path, command: list[str]) -> None:
    """Wrappers that are not Python cannot be checked: nothing said, and --verbose says so; --strict runs them."""
    if command == ["shell script"]:
        command = [str(executable(tmp_path / "job.sh", "#!/bin/sh\nexit 0\n"))]
    need(shutil.which(command[0]), f"{command[0]} is not installed")
    quiet = affrun("run", "--strict", "--nproc-per-node", "1", "--", *command)
    assert quiet.returncode == 0 and "affrun: warning" not in quiet.stderr and "affrun: note" not in quiet.stderr
    loud = affrun("run", "--strict", "--verbose", "--nproc-per-node", "1", "--", *command)
    notes = [ln for ln in loud.stderr.splitlines() if ln.startswith("affrun: note:")]
    assert loud.returncode == 0 and len(notes) == 1 and "could not be checked" in notes[0], loud.stderr


def test_the_probe_neither_binds_nor_prints() -> None:
    """AFFRUN_RUN=probe: the hook answers through a flag and does nothing else, even with no plan at all. The flag
    is on the hook's loader (_affrun_startup), which stays in sys.modules; affrun's package leaves none behind."""
    code = ("import os, sys; m = sys.modules['_affrun_startup']; print(m.answered_probe, "
            f"sorted(os.sched_getaffinity(0)) == {sorted(CPUS)!r}, os.environ.get('AFFRUN_LOCAL_RANK'))")
    proc = subprocess.run([sys.executable, "-c", code], env=clean_env(AFFRUN_RUN="probe"), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout.split() == ["True", "True", "None"]


def test_cpu_only_without_nproc_plans_one_rank_and_binds_it(tmp_path: Path) -> None:
    """No GPU and no --nproc-per-node: one rank, as affrun plan does (it refused with "give --nproc-per-node")."""
    root = write_tree(tmp_path / "root", this_machine_with_gpus(0))
    cpu = min(CPUS)
    canary = tmp_path / "ran"
    proc = affrun("run", "--fsroot", str(root), "--cpus", str(cpu), "--", sys.executable, "-c", REPORT, str(canary))
    assert proc.returncode == 0, proc.stderr
    (line,) = rank_lines(proc.stderr)[:1]
    assert (line["rank"], line["size"]) == ("0", "1")
    mask, bound = json.loads(proc.stdout.splitlines()[-1])
    assert mask == [cpu] and bound == "0"


def test_doctor_reports_a_rank_that_carries_the_plan_unbound(bare: Path) -> None:
    """A job under affrun run whose interpreter lacks the hook: the audit finds its one rank off its CPUs."""
    from tests.system.test_doctor_live import audit, findings, running

    need(len(CPUS) >= 2, "an unbound rank differs from a bound one with at least 2 allowed CPUs")
    cpu = min(CPUS)
    job = "import os, time; os.write(1, f'READY {os.getpid()}\\n'.encode()); time.sleep(600)"
    for python, unbound in ((str(bare), True), (sys.executable, False)):
        argv = affrun_argv("run", "--map", str(cpu), "--", python, "-c", job)
        with running(argv, clean_env()) as (_proc, lines):
            pid = int(lines[-1].split()[1])
            assert (os.sched_getaffinity(pid) == {cpu}) != unbound
            code, data = audit(pid, duration=0.3)
        found = findings(data).get("run-unbound")
        if not unbound:
            assert found is None, found
            continue
        assert code == 1 and found is not None and found["severity"] == "error"
        assert f"pid {pid}" in found["message"] and str(bare) in found["message"]
        assert "startup hook" in found["why"] and "--strict" in found["fix"]
