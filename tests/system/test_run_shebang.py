"""``affrun run`` and a script's ``#!`` line (issue 26, items 5 and 7), through the real CLI and real files.

- ``#!/usr/bin/env -S`` lines are split as GNU env splits them (``\\_``, ``${NAME}``, quotes, ``\\c``, ``#``), so a
  ``-S`` that turns Python's ``site`` off (and with it affrun's startup hook) is found however it is written; the
  splitter is compared with the real ``/usr/bin/env -S`` on generated strings.
- A line affrun cannot read for sure is one warning, no rank line, and ``--strict`` refuses it.
- An interpreter that cannot run (a Windows line ending, a removed venv, a dangling link, ``#!`` lines that loop)
  is named as a shell's "bad interpreter" names it, with the shell's status; never "command not found" for a
  script that exists, nor "too many levels of symbolic links".
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.launch.shebang import Unreadable, split_string
from tests.conftest import need
from tests.errors import refused
from tests.launch import clean_env, executable, rank_lines
from tests.system.test_hostile_input import affrun

HERE = str(Path(sys.executable).parent)  # this venv's bin: its python3 loads the hook, but not with -S
REPORT = ("import os, sys, json; print(json.dumps([sorted(os.sched_getaffinity(0)), "
          "os.environ.get('AFFRUN_LOCAL_RANK')])); open(sys.argv[1], 'w').close()")
BODY = f"import sys\nexec({REPORT!r})\n"
ON_PATH = {"PATH": f"{HERE}:{os.environ['PATH']}", "FLAGS": "-S", "NOTHING": ""}


def env_program() -> str:
    env = shutil.which("env") or ""
    need(bool(env) and subprocess.run([env, "-S", "true"], capture_output=True).returncode == 0,
         "this env has no -S (GNU coreutils 8.30 or later)")
    return env


# #!/usr/bin/env -S lines that give this venv's python3 -S, each written another way.
SITE_OFF = {
    "\\_": "python3\\_-S",
    "\\_ after -u": "python3 -u\\_-S",
    "${NAME}": "python3 ${FLAGS}",
    "${NAME} in double quotes": 'python3 "${FLAGS}"',
    "quoted": "'python3' \"-S\"",
    "empty quotes": "py''thon3 -''S",
    "env options first": "-u UNRELATED -- python3 -S",
    "split after -v": "-v python3\\_-S",
    "nested -S": "-S\\_python3\\_-S",
    "\\c ends it": "python3 -u -S\\c -X",
    "glued": "python3 '-S'x",
    "#-word ends it": "python3 -S #-u",
}


@pytest.mark.parametrize("case", list(SITE_OFF))
def test_a_site_off_flag_in_an_env_split_string_is_never_missed(tmp_path: Path, case: str) -> None:
    env = env_program()
    path = executable(tmp_path / "train.py", f"#!{env} -S {SITE_OFF[case]}\n{BODY}")
    canary = tmp_path / "ran"
    proc = affrun("run", "--nproc-per-node", "1", "--", str(path), str(canary), env=ON_PATH)
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("affrun: warning:")]
    assert len(warnings) == 1 and "drop -S" in warnings[0] and "Traceback" not in proc.stderr, proc.stderr
    assert rank_lines(proc.stderr) == []  # no line claims the binding that is not made
    assert json.loads(proc.stdout.splitlines()[-1])[1] is None and canary.exists()
    canary.unlink()
    refused(affrun("run", "--strict", "--nproc-per-node", "1", "--", str(path), str(canary), env=ON_PATH),
            "--strict", "drop -S")
    assert not canary.exists()


@pytest.mark.parametrize("line", ["python3 -u", "python3\\_-u", "'python3' ${UNSET_NAME} -u #-S",
                                  '"python3" -u\\c -S', "python3 -X\\_utf8"])
def test_a_split_string_that_keeps_site_binds(tmp_path: Path, line: str) -> None:
    """No false alarm: the same spellings without -S bind, under --strict."""
    env = env_program()
    path = executable(tmp_path / "train.py", f"#!{env} -S {line}\n{BODY}")
    canary = tmp_path / "ran"
    proc = affrun("run", "--strict", "--nproc-per-node", "1", "--", str(path), str(canary), env=ON_PATH)
    assert proc.returncode == 0 and "affrun: warning" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])[1] == "0" and len(rank_lines(proc.stderr)) == 1


# Lines that cannot be read for sure: env refuses them, or Linux hands Python "-u -S" as one argument.
UNREADABLE = {
    "$NAME": ("{env} -S python3 $FLAGS", "only ${NAME}"),
    "bad escape": ("{env} -S python3\\q", "invalid sequence"),
    "open quote": ("{env} -S python3 '-S", "quote"),
    "unknown env option": ("{env} --frobnicate python3", "--frobnicate"),
    "one kernel argument": (sys.executable + " -u -S", "as one argument"),
}


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_a_line_that_cannot_be_read_for_sure_warns_and_strict_refuses(tmp_path: Path, case: str) -> None:
    line, needle = UNREADABLE[case]
    path = executable(tmp_path / "train.py", f"#!{line.format(env=env_program())}\n{BODY}")
    canary = tmp_path / "ran"
    proc = affrun("run", "--nproc-per-node", "1", "--", str(path), str(canary), env=ON_PATH)
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("affrun: warning:")]
    assert len(warnings) == 1 and "cannot be read for sure" in warnings[0] and needle in warnings[0], proc.stderr
    assert rank_lines(proc.stderr) == [] and "Traceback" not in proc.stderr
    refused(affrun("run", "--strict", "--nproc-per-node", "1", "--", str(path), str(canary), env=ON_PATH),
            "--strict", "cannot be read for sure")


def test_the_splitter_agrees_with_gnu_env_on_generated_strings(tmp_path: Path) -> None:
    """Generated strings of env -S's special characters: the same words as the real env, or refused when it is."""
    env = env_program()
    dump = executable(tmp_path / "dump", f"#!{sys.executable} -IS\nimport sys, json\nprint(json.dumps(sys.argv[1:]))\n")
    variables = {"X": "v x", "E": ""}
    tokens = ["a", "b", " ", "\t", "'", '"', "\\", "_", "c", "t", "n", "#", "$", "{", "}", "${X}", "${E}", "${U}",
              "\\_", "\\c", "\\t", "\\'", '\\"', "\\\\", "\\#", "\\$", "q", "-S"]
    rng = random.Random(26)
    base = {k: v for k, v in os.environ.items() if k not in ("X", "E", "U")}
    for _ in range(150):
        text = "".join(rng.choice(tokens) for _ in range(rng.randint(1, 10)))
        real = subprocess.run([env, "-S", f"{dump} {text}"], env={**base, **variables}, capture_output=True,
                              text=True, timeout=60)
        try:
            ours: list[str] | None = split_string(f"{dump} {text}", variables)[1:]
        except Unreadable:
            ours = None
        theirs = json.loads(real.stdout) if real.returncode == 0 else None
        assert ours == theirs, (text, real.returncode, real.stderr)


def bad_interpreters(tmp: Path) -> dict[str, tuple[Path, str, str, int]]:
    """Scripts whose interpreter cannot run: (script, the interpreter as a message shows it, why, status)."""
    venv = tmp / "gone"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    console = executable(tmp / "mytrain", f"#!{venv}/bin/python3\nimport sys\n")
    shutil.rmtree(venv)  # the environment the console script was installed into is removed
    (tmp / "bin").mkdir()
    (tmp / "bin" / "python3").symlink_to(tmp / "no-such-python3.11")
    loop_a, loop_b = tmp / "loop_a", tmp / "loop_b"
    executable(loop_a, f"#!{loop_b}\n")
    executable(loop_b, f"#!{loop_a}\n")
    return {
        "CRLF": (executable(tmp / "crlf.py", b"#!/usr/bin/python3\r\nprint(1)\r\n"), "'/usr/bin/python3\\r'",
                 "Windows line ending", 127),
        "removed venv": (console, f"'{venv}/bin/python3'", "removed or moved environment", 127),
        "dangling link": (executable(tmp / "link.py", f"#!{tmp}/bin/python3\n"), f"'{tmp}/bin/python3'",
                          "a link to", 127),
        "#! loop": (loop_a, f"'{loop_b}'", "the #! lines loop", 126),
        "interpreter is a directory": (executable(tmp / "dir.py", f"#!{tmp}/bin\n"), f"'{tmp}/bin'",
                                       "not an executable file", 126),
        "nested": (executable(tmp / "outer.py", f"#!{tmp}/crlf.py\n"), f"'{tmp}/crlf.py'", "Windows line ending", 127),
    }


# affrun run; affrun exec (issue 40: it said "command not found"); affrun exec through numactl, whose own message
# ("numactl: execution of ... failed", status 1) would name neither
LAUNCHERS = {"run": ("run", "--nproc-per-node", "1"), "exec": ("exec",),
             "exec through numactl": ("exec", "--mem-backend", "numactl", "--mem-policy", "membind")}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize("case", ["CRLF", "removed venv", "dangling link", "#! loop", "interpreter is a directory",
                                  "nested"])
def test_an_interpreter_that_cannot_run_is_named(tmp_path: Path, case: str, launcher: str) -> None:
    if launcher == "exec through numactl":
        need(shutil.which("numactl") is not None, "numactl is not installed")
    path, shown, why, status = bad_interpreters(tmp_path)[case]
    for command in ([str(path)], [path.name]):  # by path, and by name on PATH
        proc = affrun(*LAUNCHERS[launcher], "--", *command, env={"PATH": f"{path.parent}:/usr/bin:/bin"})
        line = refused(subprocess.CompletedProcess(proc.args, 2 if proc.returncode == status else proc.returncode,
                                                   proc.stdout, proc.stderr), "bad interpreter", shown, why)
        assert "command not found" not in line and "symbolic links" not in line
        assert line.startswith(f"affrun: error: {command[0]}: bad interpreter")
        assert rank_lines(proc.stderr) == []  # nothing ran: no binding is claimed
    bash = shutil.which("bash")
    if bash:  # the shell's own status for the same failure
        assert subprocess.run([bash, "-c", f"'{path}'"], env=clean_env(), capture_output=True).returncode == status


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_a_missing_command_is_still_not_found(tmp_path: Path, launcher: str) -> None:
    if launcher == "exec through numactl":
        need(shutil.which("numactl") is not None, "numactl is not installed")
    proc = affrun(*LAUNCHERS[launcher], "--", str(tmp_path / "nothing-here.py"))
    assert proc.returncode == 127 and rank_lines(proc.stderr) == []
    assert proc.stderr.splitlines() == [f"affrun: error: {tmp_path / 'nothing-here.py'}: command not found"]


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize("what", ["file", "directory"])
def test_a_path_that_is_no_program_is_permission_denied(tmp_path: Path, launcher: str, what: str) -> None:
    """A file without the execute bit, or a directory, named by its path: 126 and "permission denied", as a shell
    says and as affrun exec says without numactl (through numactl it said "command not found", 127)."""
    if launcher == "exec through numactl":
        need(shutil.which("numactl") is not None, "numactl is not installed")
    path = tmp_path / "data.txt"
    if what == "file":
        path.write_text("not a program\n")
    else:
        path.mkdir()
    proc = affrun(*LAUNCHERS[launcher], "--", str(path))
    assert proc.returncode == 126 and rank_lines(proc.stderr) == [], proc.stderr
    assert proc.stderr.splitlines() == [f"affrun: error: {path}: permission denied"]


@pytest.mark.torch
def test_torchrun_no_python_ranks_name_the_bad_interpreter(tmp_path: Path) -> None:
    """``affrun torchrun --no-python`` starts the script itself, through each rank's ``affrun exec``."""
    path, shown, why, _status = bad_interpreters(tmp_path)["removed venv"]
    proc = affrun("torchrun", "--nproc-per-node", "1", "--no-python", str(path))
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("affrun: error:")]
    assert errors and errors[0].startswith(f"affrun: error: {path}: bad interpreter {shown}: "), proc.stderr[-3000:]
    assert why in errors[0] and "command not found" not in proc.stderr
