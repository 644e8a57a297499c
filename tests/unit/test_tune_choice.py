"""affrun tune's pure parts: the candidates and their pruning, the window between two readings of the meter, the
best against the default's spread, the tuned file's round trip and machine check, and the chart's SVG."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from launcher.errors import ConfigError
from launcher.options.tuned import machine_differences, parse_tuned, render_tuned
from launcher.tune.candidates import DEFAULT, Candidate, clearly_worse, families
from launcher.tune.measure import all_advanced, all_started, reading, window
from launcher.tune.result import TrialResult, best, chart, table, to_json


def test_families_go_to_half_the_rank_and_try_none_one_and_two_workers_per_loader_core() -> None:
    assert [[c.options() for c in f] for f in families(5)] == [
        [["--loader-cores", "0", "--loader-workers", "0"]],
        [["--loader-cores", "1", "--loader-workers", str(w)] for w in (0, 1, 2)],
        [["--loader-cores", "2", "--loader-workers", str(w)] for w in (0, 2, 4)],
    ]
    assert DEFAULT.options() == [] and DEFAULT.label() == "default"


def test_clearly_worse_needs_the_ranges_apart() -> None:
    assert clearly_worse([80.0], [100.0])
    assert not clearly_worse([95.0], [100.0])
    assert not clearly_worse([70.0, 80.0, 105.0], [100.0, 101.0, 102.0])  # ranges overlap
    assert clearly_worse([70.0, 80.0, 85.0], [100.0, 101.0, 102.0])


def _rank(rank: int, batches: int, seconds: float, wait: float, final: bool = False) -> dict[str, object]:
    return {"rank": rank, "batches": batches, "seconds": seconds, "batches_per_s": batches / seconds,
            "data_wait_fraction": wait, "loaders": 1, "num_workers": [2], "workers_source": "overridden",
            "final": final, "pid": 1, "host": "h"}


def test_the_window_is_the_difference_of_two_readings_on_each_ranks_clock() -> None:
    first = reading([_rank(0, 100, 2.0, 0.5), _rank(1, 90, 2.0, 0.5)])
    last = reading([_rank(0, 400, 5.0, 0.2), _rank(1, 390, 5.0, 0.2), {"junk": 1}])
    w = window(first, last)
    assert w is not None
    assert w.batches_per_s == pytest.approx(100 + 100)  # 300 batches in 3 s, each rank
    # waited 5*0.2 - 2*0.5 = 0 s: the warm-up's wait does not count
    assert w.data_wait_fraction == pytest.approx(0.0)
    assert w.num_workers == (2, 2) and w.workers_source == "overridden"
    assert all_started(first, 2) and not all_started(first, 3)
    assert all_advanced(first, last, 3.0) and not all_advanced(first, last, 3.5)


def _trial(c: Candidate, *rates: float) -> TrialResult:
    return TrialResult(c, list(rates), [0.1] * len(rates))


def test_the_best_must_beat_the_default_beyond_its_spread() -> None:
    fast = Candidate(1, 2)
    chosen = best([_trial(DEFAULT, 100, 105, 110), _trial(fast, 150, 160, 170)])
    assert chosen is not None and not chosen.default_stands and chosen.trial.candidate == fast
    assert chosen.gain == pytest.approx(160 / 105)
    overlapping = best([_trial(DEFAULT, 100, 105, 130), _trial(fast, 120, 125, 140)])
    assert overlapping is not None and overlapping.default_stands
    single = best([_trial(DEFAULT, 100), _trial(fast, 103)])  # one repeat: within the margin
    assert single is not None and single.default_stands


def test_table_and_json_name_every_trial() -> None:
    results = [_trial(DEFAULT, 100, 110), _trial(Candidate(1, 2), 200, 210), TrialResult(Candidate(1, 4), pruned="pruned: x")]
    chosen = best(results)
    text = table(results, "overridden")
    assert "--loader-cores 1 --loader-workers 2" in text and "pruned: x" in text and "1.95x" in text
    data = to_json(results, chosen, "overridden", "")
    assert data["trials"][1]["batches_per_s"] == [200, 210]
    assert data["best"]["options"] == ["--loader-cores", "1", "--loader-workers", "2"]
    svg = chart(results, chosen, "affrun tune: train.py <&>")
    root = ET.fromstring(svg)
    assert any(e.text == "affrun tune: train.py <&>" for e in root.iter())
    bars = [e for e in root.iter() if e.tag.endswith("rect") and any(c.tag.endswith("title") for c in e)]
    assert len(bars) == 2  # one per measured trial, with its figures as a tooltip


MACHINE = {"cpu-model": "Xeon", "packages": 2, "cores": 64, "cpus": 128, "gpus": ["nvidia"] * 8}


def test_a_tuned_file_reads_back_and_names_a_foreign_machine() -> None:
    text = render_tuned({"loader_cores": 2}, MACHINE, "2026-12-02T06:00:00+00:00", "about")
    tuned = parse_tuned(text, "t.yaml")
    assert tuned.values == {"loader_cores": 2} and tuned.argv() == ["--loader-cores", "2"]
    here = {**MACHINE, "cores": 2, "cpu-model": "EPYC"}
    assert machine_differences(tuned.machine, here) == ["cpu-model 'Xeon' there, 'EPYC' here",
                                                        "cores 64 there, 2 here"]
    assert machine_differences(tuned.machine, MACHINE) == []


@pytest.mark.parametrize("text", ["options: [1]", "affrun-tuned: 1\noptions:\n  mode: sideways\n",
                                  "affrun-tuned: 1\noptions:\n  loader-cores: -1\n",
                                  "affrun-tuned: 1\noptions:\n  colour: red\n", "{", "options: {}\n"])
def test_a_bad_tuned_file_is_one_error_naming_it(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--tuned .?t\.yaml"):
        parse_tuned(text, "t.yaml")


def test_a_loop_starved_by_data_tries_the_most_loader_cores_and_workers_first() -> None:
    """A default starved by data: the first round walks down from half the rank's cores with two workers each,
    so that a short budget spends its few trials where the feed most likely is."""
    from launcher.tune.session import _first_round
    from launcher.tune.trial import TrialRun

    order: list[Candidate] = []

    def run(result: TrialResult) -> TrialRun:
        order.append(result.candidate)
        assert result.candidate.loader_cores is not None and result.candidate.workers is not None
        result.rates.append(10.0 + 10 * result.candidate.loader_cores + result.candidate.workers)  # more feeds it
        result.waits.append(0.0)
        return None  # type: ignore[return-value]  # _first_round reads only the result

    starved: list[TrialResult] = []
    _first_round(starved, 8, run, starved=True)
    assert order[0] == Candidate(4, 8) and order[1] == Candidate(4, 4)
    calm: list[TrialResult] = []
    order.clear()
    _first_round(calm, 8, run, starved=False)
    assert order[0] == Candidate(0, 0)
