"""How a script's ``#!`` line is read: by the kernel (:func:`script_interpreter`), by GNU ``env -S``
(:func:`split_string`), and what a shell says when the interpreter it names cannot run (:func:`exec_failure`:
"bad interpreter", for ``affrun exec`` and ``affrun run`` alike). The rules and their sources: docs/design.md §9.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Mapping, Sequence

from launcher.base.untrusted import short

_SPACES = " \t\n\v\f\r"
_ESCAPES = {"f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", '"': '"', "#": "#", "$": "$", "'": "'",
            "\\": "\\"}
_VARNAME = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
MAX_DEPTH = 4  # #! interpreters the kernel follows before ELOOP (a script whose interpreter is a script...)


class Unreadable(Exception):
    """A ``#!`` or ``env`` line that affrun cannot read for sure: why, in words."""


def split_string(text: str, environ: Mapping[str, str]) -> list[str]:
    """``env -S TEXT`` split as GNU env does (its quotes, escapes and ``${NAME}`` from ``environ``: docs/design.md
    §9). What env refuses (``$NAME``, another escape, an open quote) is :class:`Unreadable`, with env's reason."""
    words: list[str] = []
    sq = dq = False
    sep = True  # the next character starts a new word

    def add(chars: str) -> None:
        nonlocal sep
        if sep:
            words.append("")
            sep = False
        words[-1] += chars

    i = 0
    while i < len(text):
        c = text[i]
        if c == "'" and not dq:
            sq = not sq
            add("")
        elif c == '"' and not sq:
            dq = not dq
            add("")
        elif c in _SPACES and not (sq or dq):
            sep = True
        elif c == "#" and sep:
            return words
        elif c == "\\" and not (sq and text[i + 1 : i + 2] not in ("\\", "'")):
            i += 1
            nxt = text[i : i + 1]
            if nxt == "_" and not dq:
                sep = True
            elif nxt == "_":
                add(" ")
            elif nxt == "c":
                if dq:
                    raise Unreadable("env -S: '\\c' must not appear in a double-quoted string")
                return words
            elif nxt in _ESCAPES:
                add(_ESCAPES[nxt])
            elif not nxt:
                raise Unreadable("env -S: a backslash ends the string")
            else:
                raise Unreadable(f"env -S: invalid sequence '\\{nxt}'")
        elif c == "$" and not sq:
            m = _VARNAME.match(text, i)
            if not m:
                raise Unreadable("env -S: only ${NAME} is expanded, not " + repr(text[i : i + 20]))
            value = environ.get(m.group(1))
            if value is not None:
                add(value)
            i = m.end()
            continue
        else:
            add(c)
        i += 1
    if sq or dq:
        raise Unreadable("env -S: a quote is not closed")
    return words


def kernel_line(head: bytes) -> tuple[str, str] | None:
    """The interpreter and its one argument (``""``: none) that the kernel reads from a ``#!`` line; ``None``:
    no ``#!``. A carriage return stays part of what it ends, as the kernel leaves it."""
    if not head.startswith(b"#!"):
        return None
    first = head[2:].split(b"\n", 1)[0].decode(errors="surrogateescape").strip(" \t")
    interp, *more = re.split(r"[ \t]+", first, maxsplit=1)
    return interp, (more[0].rstrip(" \t") if more else "")


def script_interpreter(head: bytes) -> tuple[list[str], str] | None:
    """What the kernel runs for a file that starts with ``head``: the ``#!`` interpreter and its one argument
    (``#!`` line), or, for pip's and uv's ``/bin/sh`` trampoline, the interpreter its ``exec`` line names
    (``exec`` line); ``None``: no ``#!``."""
    line = kernel_line(head)
    if line is None:
        return None
    interp, arg = line
    if os.path.basename(interp) in ("sh", "bash", "dash"):
        import shlex

        second = head.split(b"\n", 2)[1:2]
        try:
            words = shlex.split(second[0].decode(errors="surrogateescape")) if second else []
        except ValueError:
            words = []
        if len(words) >= 2 and words[0] == "exec" and words[2:3] == ["$0"]:  # '''exec' PYTHON "$0" "$@"
            return [words[1]], "exec line"
    return ([interp, arg] if arg else [interp]), "#! line"


def _head(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(256)
    except OSError:
        return b""


def _missing(interp: str) -> str:
    """Why the interpreter path ``interp`` names nothing that runs, in words (a link to a removed file...)."""
    if interp.endswith("\r"):
        return ("the name ends in a carriage return: the #! line has a Windows line ending (convert the file "
                "with dos2unix, or save it with Unix line endings)")
    if os.path.islink(interp):
        return f"it is a link to {short_path(os.readlink(interp))}, which does not exist (a removed or moved environment)"
    parent = os.path.dirname(interp)
    if parent and not os.path.isdir(parent):
        return f"{short_path(parent)} does not exist (a removed or moved environment)"
    return ""


def cannot_run(program: str, cwd: str, errno_: int) -> tuple[str, str, int] | None:
    """When ``execve`` of the file ``program`` failed (with ``errno_``) because of its ``#!`` interpreter: that
    interpreter as a shell's "bad interpreter" names it, why, and the shell's status (127: it does not exist, else
    126). ``None``: the interpreter is not the cause."""
    seen = [os.path.realpath(os.path.join(cwd, program))]
    names: list[str] = []  # each level's #! interpreter, as written
    for _ in range(MAX_DEPTH + 2):
        line = kernel_line(_head(os.path.join(cwd, seen[-1])))
        if line is None:
            return None
        names.append(line[0])
        interp = os.path.join(cwd, line[0])
        deeper = f"the #! line of {short_path(names[-2])} names {short_path(line[0])}: " if len(names) > 1 else ""
        if not os.path.exists(interp):
            return names[0], deeper + (_missing(interp) or os.strerror(errno_)), 127
        if os.path.isdir(interp) or not os.access(interp, os.X_OK):
            return names[0], deeper + "it is not an executable file", 126
        if os.path.realpath(interp) in seen:
            return names[0], "the #! lines loop (" + " -> ".join([os.path.normpath(program), *names]) + ")", 126
        seen.append(os.path.realpath(interp))
    return names[0], f"the #! lines nest more than {MAX_DEPTH} deep, further than Linux follows", 126


def find_program(name: str, environ: Mapping[str, str], cwd: str) -> str:
    """Where ``execvp`` finds ``name`` with ``environ``'s PATH (``""``: nowhere)."""
    candidates = [name] if "/" in name else [os.path.join(d or ".", name) for d in os.get_exec_path(dict(environ))]
    for candidate in candidates:
        path = os.path.join(cwd, candidate)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return ""


def exec_failure(command: Sequence[str], environ: Mapping[str, str],
                 exc: OSError | None = None) -> tuple[str, int] | None:
    """When COMMAND's exec failed (``exc``) because of a script's ``#!`` interpreter: the line a shell's "bad
    interpreter" says, and its status (127 or 126); ``None``: COMMAND itself is the cause. Without ``exc`` (before
    a numactl wrapper's exec), the same, and a COMMAND not found (127)."""
    here = os.getcwd()
    path = find_program(command[0], environ, here)
    if not path:
        if exc is not None:
            return None
        if "/" in command[0] and os.path.exists(os.path.join(here, command[0])):  # there, but no program to run
            return f"{command[0]}: permission denied", 126
        return f"{command[0]}: command not found", 127
    found = cannot_run(path, here, (exc.errno if exc is not None else None) or errno.ENOENT)
    if found is None:
        return None
    interp, why, status = found
    return f"{command[0]}: bad interpreter {short(interp, 120)}: {why}", status


def short_path(path: str) -> str:
    """``path`` quoted, escaped and bounded for a message (a carriage return shows as ``\\r``)."""
    text = repr(path)
    return text if len(text) <= 120 else text[:120] + "..."
