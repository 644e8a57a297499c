"""What a user sees on bad input: one line 'affrun: error: ...' and exit 2."""

from __future__ import annotations

import subprocess


# ------------------------------------------------------------------------------------------ through the CLI
def assert_one_line_exit_2(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("affrun: error: ") and result.stderr.count("\n") == 1, result.stderr
    for needle in needles:
        assert needle in result.stderr


def error_lines(stderr: str) -> list[str]:
    """The ``affrun: error:`` lines of ``stderr``."""
    return [line for line in stderr.splitlines() if line.startswith("affrun: error:")]


def refused(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, no traceback, exactly one ``affrun: error:`` line (short, containing ``needles``), whatever warnings
    come with it; returns it."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = error_lines(proc.stderr)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert len(errors) == 1, proc.stderr[-3000:]
    assert len(errors[0]) < 500, f"the error echoes unbounded input: {errors[0][:200]}..."
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    """Exit 0 and no traceback: returns stdout."""
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stdout

