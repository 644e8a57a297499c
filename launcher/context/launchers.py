"""Which commands, and which Python programs, are launchers: they start the ranks and are not one of them.

Asked by ``affrun run --top auto`` of COMMAND and by the startup hook of each Python process. Pure.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Literal

    ProgramKind = Literal["script", "module", "code", "stdin"]

# Commands (console scripts) whose process starts the ranks and is not one of them.
LAUNCHERS = ("torchrun", "accelerate", "accelerate-launch", "deepspeed", "ds", "mpirun", "mpiexec", "orterun",
             "prterun", "srun", "lightning", "fabric", "hydra")
# The same, run as ``python -m MODULE``.
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch",
                    "accelerate.commands.accelerate_cli", "deepspeed.launcher.runner", "deepspeed.launcher.launch")
# The interpreter options that take the next word as their value (python -W error, -X dev).
OPTIONS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def command_is_launcher(command: Sequence[str]) -> bool:
    """COMMAND (as given to ``affrun run``) is a known launcher, directly, after ``env VAR=value``, or run by a
    Python interpreter (``python -m MODULE``, ``python /venv/bin/torchrun``: :func:`program_is_launcher`)."""
    words = list(command)
    while words and (os.path.basename(words[0]) == "env" or "=" in words[0]):
        words = words[1:]  # env VAR=value CMD
    if not words:
        return False
    if os.path.basename(words[0]) in LAUNCHERS:
        return True
    # the interpreter, also behind a runner such as `uv run python -m torch.distributed.run`
    python = next((i for i, w in enumerate(words) if os.path.basename(w).startswith("python")), None)
    return python is not None and program_is_launcher(words[python:])


def read_python_options(args: Sequence[str]) -> tuple[str, ProgramKind, str]:
    """An interpreter's ``args`` (argv without argv[0]) read as CPython reads them: the one-letter flags given
    before the program (``"uB"`` for ``-u -B``; option values skipped), and what runs: a script (its path), a
    module (``-m``), code (``-c``) or standard input (``""``)."""
    flags = ""
    i = 0
    while i < len(args):
        word = args[i]
        if word in OPTIONS_WITH_VALUE:
            i += 2
            continue
        if word == "--":  # the end of the options: the script follows
            word = args[i + 1] if i + 1 < len(args) else "-"
            return (flags, "stdin", "") if word == "-" else (flags, "script", word)
        if word == "-" or not word.startswith("-"):
            return (flags, "stdin", "") if word == "-" else (flags, "script", word)
        if not word.startswith("--"):
            for j, flag in enumerate(word[1:], start=1):  # combined flags: -u, -uB, -Bc CODE, -um MODULE
                if flag in "cm":
                    value = word[j + 1 :] or (args[i + 1] if i + 1 < len(args) else "")
                    return flags, ("code" if flag == "c" else "module"), value
                if flag in "WX":
                    if not word[j + 1 :]:
                        i += 1  # the value is the next word
                    break
                flags += flag
        i += 1  # a long option, "--", or one-letter flags
    return flags, "stdin", ""


def python_program(argv: Sequence[str]) -> tuple[ProgramKind, str]:
    """What the interpreter started with ``argv`` (``sys.orig_argv``) runs: a script (its path), a module
    (``-m``), code (``-c``) or standard input."""
    _, kind, value = read_python_options(argv[1:])
    return kind, value


def program_is_launcher(argv: Sequence[str]) -> bool:
    """The Python process started with ``argv`` runs a known launcher (its console script, or ``-m`` module)."""
    kind, value = python_program(argv)
    if kind == "module":
        return value in LAUNCHER_MODULES
    return kind == "script" and os.path.basename(value) in LAUNCHERS
