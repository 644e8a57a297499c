"""Every dry run shows the rank's environment notes (docs/threads.md): ``affrun exec --dry-run``, ``affrun run
--dry-run`` and ``affrun torchrun --affrun-dry-run`` print the same ``note:`` lines, from the record each rank
reads (launcher/launch/dry_run.py); before, only exec's did. Through the real entry points, with values of the
user's that the env policy replaces."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.launch import affrun

USER = {"OMP_NUM_THREADS": "1000", "OPENCV_FOR_THREADS_NUM": "lots"}


def _notes(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("note: ")]


@pytest.mark.torch
@pytest.mark.parametrize("nproc", [1, 2])
def test_every_dry_run_shows_the_notes(nproc: int, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    ranks = [affrun("exec", "--dry-run", "--local-rank", str(r), "--nproc-per-node", str(nproc), "--",
                    sys.executable, str(script), env=USER) for r in range(nproc)]
    for proc in ranks:
        assert proc.returncode == 0, proc.stderr
    # exec's, rank by rank; where a dry run shows several ranks, each note is named
    expected = [n.replace("note: ", f"note: rank {r}: " if nproc > 1 else "note: ", 1)
                for r, proc in enumerate(ranks) for n in _notes(proc.stdout)]
    assert any("OMP_NUM_THREADS=1000 replaced by" in n for n in expected), expected
    assert any("OPENCV_FOR_THREADS_NUM=lots replaced by" in n for n in expected), expected
    for proc in (affrun("run", "--dry-run", "--nproc-per-node", str(nproc), "--", sys.executable, str(script), env=USER),
                 affrun("torchrun", "--affrun-dry-run", "--nproc-per-node", str(nproc), str(script), env=USER)):
        assert proc.returncode == 0, proc.stderr
        assert _notes(proc.stdout) == expected, (proc.args, proc.stdout)
