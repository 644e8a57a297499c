"""One table of binding options: every front end offers the same flags with the same defaults."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from launcher.launch.exec_cmd import build_parser
from launcher.options.plan_options import PlanOptions, plan_options_from
from launcher.options.table import add_binding_arguments, options_in
from launcher.submitit import AffinityOptions


def test_plan_options_are_the_table_plan_group_with_the_same_defaults() -> None:
    table = {o.dest: o.default for o in options_in("plan")}
    assert table == {f.name: f.default for f in fields(PlanOptions)}


def test_exec_defaults_are_plan_options_defaults() -> None:
    args = build_parser().parse_args([])
    assert plan_options_from(args) == PlanOptions()
    parser = argparse.ArgumentParser()
    add_binding_arguments(parser, prefix="affrun_")
    prefixed = parser.parse_args([])
    assert plan_options_from(prefixed, prefix="affrun_") == PlanOptions()


def test_submitit_options_have_the_table_defaults() -> None:
    defaults = AffinityOptions()
    for spec in options_in("plan", "env", "apply"):
        assert getattr(defaults, spec.dest) == spec.default, spec.flag










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
