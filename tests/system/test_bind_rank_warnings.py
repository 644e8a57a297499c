"""``launcher.bind_rank`` says the plan's warnings for its rank, as ``affrun exec`` does (``--main-thread
priority`` on a machine with no priority core was silent): once on stderr unless ``quiet``, and in
``BindReport.warnings``; under ``affrun run`` the parent has said them, and the rank does not again."""

from __future__ import annotations

import json
import sys

from tests.launch import affrun_argv, clean_env, run

PROBE = """
import json, sys, launcher
report = launcher.bind_rank(0, 1, quiet=sys.argv[1] == "quiet", **json.loads(sys.argv[2]))
print(json.dumps(list(report.warnings)))
"""
ABSENT = "--reserve names CPUs 65000, which this machine does not have"  # no machine here has CPU 65000


def test_bind_rank_says_its_plan_s_warnings_once() -> None:
    done = run([sys.executable, "-c", PROBE, "loud", json.dumps({"reserve": "65000"})], env=clean_env())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [ABSENT]
    assert done.stderr.splitlines() == [f"affrun: warning: bind_rank(0): {ABSENT}"]
    quiet = run([sys.executable, "-c", PROBE, "quiet", json.dumps({"reserve": "65000"})], env=clean_env())
    assert quiet.returncode == 0 and json.loads(quiet.stdout) == [ABSENT] and quiet.stderr == ""


def test_under_affrun_run_the_parent_says_them() -> None:
    done = run(affrun_argv("run", "--nproc-per-node", "1", "--reserve", "65000", "--",
                           sys.executable, "-c", PROBE, "loud", "{}"), env=clean_env())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    assert sum(ABSENT in line for line in done.stderr.splitlines()) == 1, done.stderr


def test_the_job_s_warnings_are_said_by_rank_0_alone_and_each_rank_reports_its_own() -> None:
    """Two ranks (as ``mp.spawn`` starts them): rank 0 says the job's warnings once, as ``affrun exec`` does; rank
    1 says nothing (every rank said every rank's warnings, and its own twice); each report holds its rank's."""
    own = "--loader-cores is ignored in shared modes (numa, socket)"
    options = json.dumps({"mode": "numa", "loader_cores": 1})
    first, second = (run([sys.executable, "-c", PROBE.replace("bind_rank(0, 1", f"bind_rank({r}, 2"), "loud", options],
                         env=clean_env()) for r in (0, 1))
    for done in (first, second):
        assert done.returncode == 0 and json.loads(done.stdout) == [own], done.stderr
    assert first.stderr.splitlines() == [f"affrun: warning: bind_rank(0): rank {r}: {own}" for r in (0, 1)]
    assert second.stderr == ""
