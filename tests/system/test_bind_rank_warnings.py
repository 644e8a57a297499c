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
