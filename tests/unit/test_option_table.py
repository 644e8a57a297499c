"""One table of binding options: every front end offers the same flags with the same defaults."""

from __future__ import annotations

from dataclasses import fields

import pytest

from launcher.options.record import ORDER, Options
from launcher.options.table import BINDING_OPTIONS


def test_the_record_is_the_table() -> None:
    """Options' fields are the table's rows by their Python keyword, with the table's defaults: an option added to
    the table and not to the record (or the other way round) fails here."""
    assert sorted(ORDER, key=BINDING_OPTIONS.index) == list(BINDING_OPTIONS)
    assert [(f.name, f.default) for f in fields(Options)] == [
        *((spec.name("python"), spec.default) for spec in ORDER), ("verbose", False)]


def test_a_planner_error_reads_in_the_vocabulary_of_its_front_end() -> None:
    from launcher.errors import PlanError
    from launcher.options.table import spell_error
    from launcher.plan.planner import Request, validate_request

    cases = [
        (Request(nproc=2, mode="map", cpu_map=(frozenset({0}),) * 3),
         ("--map gives 3 CPU list(s) for 2 ranks", "cpu_map= gives 3 CPU list(s) for 2 ranks",
          "map gives 3 CPU list(s) for 2 ranks")),
        (Request(nproc=1, mode="map"),
         ("--mode map needs --map with", "mode='map' needs cpu_map= with", "mode: map needs map with")),
        (Request(nproc=1, loader_cores=-1),
         ("--loader-cores must be >= 0", "loader_cores= must be >= 0", "loader-cores must be >= 0")),
    ]
    for request, (cli, python, profile) in cases:
        with pytest.raises(PlanError) as caught:
            validate_request(request)
        assert str(spell_error(caught.value)).startswith(cli), str(caught.value)
        spell_error(caught.value, "python")
        assert str(caught.value).startswith(python), str(caught.value)
        spell_error(caught.value, "profile", {"cpu_map", "mode", "loader_cores"})
        assert str(caught.value).startswith(profile), str(caught.value)
