"""What ``affrun run``'s COMMAND starts (:func:`resolve`: ``PATH``, ``env``, ``#!`` lines, pip's and uv's
trampolines), and whether that Python interpreter loads affrun's startup hook (:func:`probe`, bounded), before
``affrun run`` execs it. Each rule and why: docs/design.md §9 ("before the exec, does COMMAND's Python load the
hook?").
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.base.errors import LaunchError
from launcher.base.untrusted import note_line, short, warning_line
from launcher.bind.wire import PLAN_VARIABLE
from launcher.context.launchers import read_python_options
from launcher.context.run_role import PROBE, RUN_VARIABLE
from launcher.launch.shebang import Unreadable, find_program, script_interpreter, split_string

# What the hook needs to find in a process's environment to bind it.
HOOK_VARIABLES = (RUN_VARIABLE, PLAN_VARIABLE)
PROBE_SECONDS = 10.0
MAX_STEPS = 8  # env, #! lines and trampolines followed before giving up (Linux follows 4 interpreter levels)
HEAD_BYTES = 1024  # a #! line is at most 256 bytes (BINPRM_BUF_SIZE); a trampoline's exec line follows it
# The answer is in the hook's loader, which stays in sys.modules (docs/design.md §11, "The hook's module").
PROBE_CODE = ("import sys; m = sys.modules.get('_affrun_startup'); "
              "print('affrun-probe', int(bool(getattr(m, 'answered_probe', False))), getattr(m, 'hook_file', ''))")
_PYTHON_NAME = re.compile(r"(python|pypy)(\d+(\.\d+)*)?[a-z]?")
# Interpreter options that decide whether site runs and which site-packages it reads: the probe passes them on.
_SITE_FLAGS = "ISsE"
_ENV_FLAGS = "i0v"  # env options without a value
_ENV_VALUED = {"u": "unset", "C": "chdir", "S": "split-string"}
_ENV_LONG_FLAGS = ("ignore-environment", "null", "debug", "list-signal-handling")
_ENV_LONG_OPTIONAL = ("ignore-signal", "default-signal", "block-signal")  # --NAME[=SIG]


class Unchecked(Exception):
    """COMMAND cannot be followed to a Python interpreter: why, in words."""


class CannotStart(Unchecked):
    """COMMAND cannot start at all (not found, a ``#!`` interpreter that does not exist): its exec will fail."""


@dataclass(frozen=True)
class Target:
    """The Python ``interpreter`` COMMAND starts, with the ``options`` that decide whether ``site`` runs, the
    environment and directory it starts in, and how it was found (``via``: "the #! line of /venv/bin/torchrun").
    ``lost``: the hook's variables an ``env`` in COMMAND takes away, with how (``env -i``)."""

    interpreter: str
    options: tuple[str, ...]
    environ: Mapping[str, str]
    cwd: str
    via: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    lost_by: str = ""


@dataclass(frozen=True)
class Answer:
    """What the probe found: ``loads`` (``None``: no answer), the hook's module or what went wrong, the time."""

    loads: bool | None
    detail: str
    seconds: float


def python_name(path: str) -> bool:
    """``path`` names a Python interpreter (python, python3.11, pypy3, python3.13t), itself or by its link."""
    names = {os.path.basename(path), os.path.basename(os.path.realpath(path))}
    return any(_PYTHON_NAME.fullmatch(n) for n in names)


def site_options(args: Sequence[str]) -> tuple[str, ...]:
    """The options among an interpreter's ``args`` (before its script, ``-m`` or ``-c``) that decide whether
    ``site`` runs and which site-packages it reads (``-I``, ``-S``, ``-s``, ``-E``), as one word."""
    flags = "".join(dict.fromkeys(f for f in read_python_options(args)[0] if f in _SITE_FLAGS))
    return (f"-{flags}",) if flags else ()


def env_command(args: Sequence[str], environ: dict[str, str], cwd: str) -> tuple[list[str], str, list[str], str]:
    """Apply ``env ARGS`` (GNU coreutils' options) to ``environ`` in place; return the command it runs, its
    directory, the hook's variables it takes away and how."""
    words = list(args)
    original = dict(environ)
    lost: list[str] = []
    how = ""

    def lose(names: Sequence[str], why: str) -> None:
        nonlocal how
        for name in names:
            if name in HOOK_VARIABLES and name not in lost:
                lost.append(name)
                how = how or why

    def apply(option: str, value: str) -> None:
        nonlocal words, cwd
        if option == "unset":
            environ.pop(value, None)
            lose([value], f"env -u {value}")
        elif option == "chdir":
            cwd = os.path.join(cwd, value)
        else:  # expanded from env's own environment, before -i, -u and NAME=VALUE apply (as env.c does)
            words = split_string(value, original) + words

    while words and words[0].startswith("-") and words[0] != "--":
        word = words.pop(0)
        if word == "-" or word[1:2] != "-":  # "-" is -i; then short options, maybe combined: -iu NAME, -S'...'
            for j, flag in enumerate(word[1:] or "i", start=1):
                if flag == "i":
                    environ.clear()
                    lose(HOOK_VARIABLES, "env -i")
                elif flag in _ENV_VALUED:
                    value = word[j + 1 :] or (words.pop(0) if words else "")
                    apply(_ENV_VALUED[flag], value)
                    break
                elif flag not in _ENV_FLAGS:
                    raise Unreadable(f"env option -{flag} is not one affrun knows")
            continue
        name, eq, value = word[2:].partition("=")
        if name in _ENV_VALUED.values():
            apply(name, value if eq else (words.pop(0) if words else ""))
        elif name == "ignore-environment" and not eq:
            environ.clear()
            lose(HOOK_VARIABLES, "env --ignore-environment")
        elif not (name in _ENV_LONG_FLAGS and not eq) and name not in _ENV_LONG_OPTIONAL:
            raise Unreadable(f"env option --{name} is not one affrun knows")
    if words and words[0] == "--":
        words.pop(0)
    while words and "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        environ[name] = value
        lose([name], f"env {name}=...")
    if not words:
        raise Unchecked("env runs no command")
    return words, cwd, lost, how


def resolve(command: Sequence[str], environ: Mapping[str, str], cwd: str | None = None) -> Target:
    """The Python interpreter ``command`` starts with ``environ``; :class:`Unchecked` when it is no Python."""
    words = list(command)
    env = dict(environ)
    here = cwd or os.getcwd()
    via: list[str] = []
    lost: list[str] = []
    lost_by = ""
    one_arg = ""  # the one argument of the last #! line, when its interpreter comes next
    scripts: list[str] = []  # the scripts of one exec, whose #! lines the kernel follows
    for _ in range(MAX_STEPS):
        if not words:
            raise Unchecked("no command")
        if os.path.basename(words[0]) == "env":
            words, here, gone, how = env_command(words[1:], env, here)
            one_arg, scripts = "", []
            lost_by = lost_by or how
            lost += [name for name in gone if name not in lost]
            continue
        path = find_program(words[0], env, here)
        if not path:
            raise CannotStart(f"{short(words[0], 120)} is not found (or not executable)"
                              + (f" ({via[-1]})" if via else ""))
        if python_name(path):
            if one_arg.startswith("-") and any(c.isspace() for c in one_arg):
                # #!/venv/bin/python3 -u -S: Linux passes "-u -S" as one argument, which Python refuses
                raise Unreadable(f"{via[-1]} gives {path} {short(one_arg)} as one argument (Linux passes "
                                 "everything after the interpreter as one), which Python refuses: use "
                                 f"#!/usr/bin/env -S {os.path.basename(path)} {one_arg.strip()}")
            return Target(path, site_options(words[1:]), env, here, tuple(via), tuple(lost), lost_by)
        if os.path.realpath(path) in scripts:
            raise CannotStart(f"the #! lines loop ({' -> '.join([*scripts, path])})")
        scripts.append(os.path.realpath(path))
        try:
            with open(path, "rb") as fh:
                head = fh.read(HEAD_BYTES)
        except OSError as exc:
            raise Unchecked(f"{path} cannot be read ({exc.strerror})") from None
        found = script_interpreter(head)
        if found is None:
            kind = "a compiled program" if head.startswith(b"\x7fELF") else "a file without a #! line"
            raise Unchecked(f"{path} is {kind}, not Python" + (f" ({via[-1]})" if via else ""))
        interp, line = found
        one_arg = interp[1] if line == "#! line" and len(interp) > 1 else ""
        via.append(f"the {line} of {path}")
        words = [os.path.join(here, interp[0]), *interp[1:], path, *words[1:]]
    raise Unreadable(f"more than {MAX_STEPS} levels of env and #! lines")


def probe(interpreter: str, options: Sequence[str], environ: Mapping[str, str], cwd: str,
          seconds: float = PROBE_SECONDS) -> Answer:
    """Run ``interpreter`` once under ``AFFRUN_RUN=probe`` and see whether affrun's startup hook answered; waits
    for the interpreter alone, up to ``seconds``, then ends its whole process group (docs/design.md §9)."""
    env = {k: v for k, v in environ.items() if k != PLAN_VARIABLE}
    env[RUN_VARIABLE] = PROBE
    start = time.monotonic()
    out_fd, err_fd = os.memfd_create("affrun-probe-out"), os.memfd_create("affrun-probe-err")
    try:
        try:
            child = subprocess.Popen([interpreter, *options, "-c", PROBE_CODE], env=env, cwd=cwd,
                                     stdin=subprocess.DEVNULL, stdout=out_fd, stderr=err_fd, start_new_session=True)
        except OSError as exc:
            return Answer(None, f"it could not be started ({exc.strerror})", 0.0)
        try:
            if not _exited(child.pid, start + seconds):
                return Answer(None, f"it gave no answer in {seconds:g} s", time.monotonic() - start)
        finally:
            _end_group(child)
        took = time.monotonic() - start
        out, err = _read(out_fd), _read(err_fd)
    finally:
        os.close(out_fd)
        os.close(err_fd)
    for line in out.splitlines():
        words = line.split(" ", 2)
        if words[0] == "affrun-probe" and len(words) == 3:
            return Answer(words[1] == "1", words[2], took)
    said = [line for line in err.splitlines() if line.startswith("affrun: error:")]
    return Answer(False, said[0] if said else f"it exited with status {child.returncode}", took)


def _exited(pid: int, deadline: float) -> bool:
    """Wait until the process ``pid`` exits (``True``) or ``deadline`` passes; it stays unreaped, so that its
    process group cannot be another's when :func:`_end_group` ends it."""
    pause = 0.002
    while True:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)


def _end_group(child: subprocess.Popen[bytes]) -> None:
    """End the probe's process group (what it left running, or the interpreter itself), then reap the
    interpreter."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        pass  # the group is gone: nothing was left running
    child.wait()


def _read(fd: int, limit: int = 1 << 22) -> str:
    """What the probe wrote into the memory file ``fd`` (its last ``limit`` bytes: the answer is printed last)."""
    size = os.fstat(fd).st_size
    return os.pread(fd, min(size, limit), max(0, size - limit)).decode(errors="replace")


def has_hook_file() -> bool:
    """This interpreter's site-packages hold affrun's startup hook (``affrun-startup.pth``)."""
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()] if hasattr(site, "getsitepackages") else []
    return any(os.path.isfile(os.path.join(d, "affrun-startup.pth")) for d in dirs)


def diagnose(target: Target) -> tuple[str, str]:
    """Why ``target``'s interpreter will not bind (``""``: it will, or nobody can tell) and, for ``--verbose``,
    what was found. Probes the interpreter, twice when its options may be the cause."""
    name = target.interpreter + (f" ({', '.join(target.via)})" if target.via else "")
    if target.lost:
        return (f"{target.lost_by} in COMMAND takes {' and '.join(target.lost)} away from Python {name}, so no "
                f"rank will be bound: drop it from COMMAND"), ""
    answer = probe(target.interpreter, target.options, target.environ, target.cwd)
    if answer.loads is None:  # no rank line may then claim a binding nobody saw applied
        return (f"COMMAND's Python {name} could not be checked for affrun's startup hook ({answer.detail}), so "
                "no rank line is printed and its ranks may run unbound"), ""
    if answer.loads:
        return "", (f"COMMAND's Python {name} loads affrun's startup hook ({answer.detail}; checked in "
                    f"{answer.seconds * 1000:.0f} ms)")
    if target.options and probe(target.interpreter, (), target.environ, target.cwd).loads:
        given = target.options[0][1:]
        alone = [f for f in given if len(given) > 1
                 and probe(target.interpreter, (f"-{given.replace(f, '')}",), target.environ, target.cwd).loads]
        flags = f"-{''.join(alone) or given}"  # the one that is the cause (-S, not -I) when one is
        return (f"COMMAND's Python {name} does not load affrun's startup hook with {flags} (affrun-startup.pth "
                f"in site-packages), so no rank will be bound: drop {flags}"), ""
    if answer.detail.startswith("affrun:"):  # a hook that does not know the probe: another affrun's
        return (f"COMMAND's Python {name} loads the startup hook of another affrun version, which does not "
                f"answer this one ({answer.detail}): install this affrun into that interpreter "
                f"({target.interpreter} -m pip install affrun)"), ""
    ours = f" (such as {sys.executable})" if sys.executable and has_hook_file() else ""
    return (f"COMMAND's Python {name} does not load affrun's startup hook, so no rank will be bound: run "
            f"COMMAND with the python of an environment that has affrun{ours}, or install affrun into that "
            f"interpreter ({target.interpreter} -m pip install affrun)"), ""


def check_command(command: Sequence[str], environ: Mapping[str, str], *, strict: bool, verbose: bool) -> bool:
    """Whether the ranks below ``command`` can be bound: ``False`` after one warning that names the
    interpreter and the fix; :class:`LaunchError` instead under ``--strict``, before anything runs. A command
    that cannot be followed to a Python interpreter passes, with a note under ``--verbose``."""
    try:
        problem, note = diagnose(resolve(command, environ))
    except Unreadable as exc:  # not read for sure: no rank line may claim a binding nobody saw applied
        problem, note = (f"COMMAND cannot be read for sure ({exc}), so affrun cannot tell whether its Python "
                         "loads the startup hook; no rank line is printed and its ranks may run unbound"), ""
    except CannotStart as exc:  # its exec fails (and says why): no rank line for a binding that never happens
        if verbose:
            print(note_line(f"COMMAND cannot start: {exc}"), file=sys.stderr)
        return False
    except Unchecked as exc:
        problem, note = "", (f"COMMAND could not be checked for affrun's startup hook: {exc}; the Python "
                             "processes it starts are bound only if their interpreter has affrun installed")
    if problem and strict:
        raise LaunchError(f"--strict: {problem}; nothing was run")
    if problem:
        print(warning_line(problem), file=sys.stderr)
    elif verbose:
        print(note_line(note), file=sys.stderr)
    return not problem
