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

