"""``affrun tune --svg``'s chart says what the table's verdict says (pure)."""

from __future__ import annotations

from launcher.tune.candidates import DEFAULT, Candidate
from launcher.tune.result import TrialResult, best, chart, verdict


def test_the_chart_verdict_is_the_tables() -> None:
    unmeasured = [TrialResult(DEFAULT, failures=["failed (exit 3)"]), TrialResult(Candidate(1, 2), rates=[50.0])]
    assert best(unmeasured) is None
    drawn = chart(unmeasured, None, "t")
    assert "the default stands" not in drawn  # nothing was compared with the default
    assert verdict(None).split(":")[0] in drawn
    faster = [TrialResult(DEFAULT, rates=[10.0]), TrialResult(Candidate(1, 2), rates=[20.0])]
    assert verdict(best(faster)) in chart(faster, best(faster), "t")
