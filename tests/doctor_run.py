"""Running affrun doctor in-process, and a seccomp wrapper that denies set_mempolicy(2) as a container profile does."""

from __future__ import annotations

import os

from click.testing import CliRunner

from launcher.cli import cli
from tests.launch import clean_env


# ----------------------------------------------------------------------------- the CLI
def doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``affrun doctor ARGS`` in-process with exactly ``env`` as the environment (default: clean_env())."""
    wanted = clean_env() if env is None else env
    overrides: dict[str, str | None] = {k: None for k in os.environ if k not in wanted}
    overrides.update(wanted)
    result = CliRunner().invoke(cli, ["doctor", *args], env=overrides)
    return result.exit_code, result.output


SECCOMP_WRAPPER = r"""
import ctypes, os, sys
# Deny set_mempolicy(2) with EPERM, as a container's seccomp profile does, then exec the command.
ARCH, NR = int(sys.argv[1]), int(sys.argv[2])
class F(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
class P(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(F))]
prog = (F * 6)(F(0x20, 0, 0, 4), F(0x15, 0, 3, ARCH), F(0x20, 0, 0, 0), F(0x15, 0, 1, NR),
               F(0x06, 0, 0, 0x00050000 | 1), F(0x06, 0, 0, 0x7FFF0000))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
fprog = P(6, prog)
assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0, ctypes.get_errno()  # PR_SET_SECCOMP, FILTER
os.execv(sys.argv[3], sys.argv[3:])
"""

