"""One table of binding options: every front end offers the same flags with the same defaults."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from launcher.launch.exec_cmd import build_parser
from launcher.options.plan_options import PlanOptions, plan_options_from
from launcher.options.table import BINDING_OPTIONS, add_binding_arguments, options_in
from launcher.submitit import AffinityOptions
from tests.launch import affrun


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


def test_every_front_end_offers_every_option() -> None:
    exec_help = affrun("exec", "--help").stdout
    torchrun_help = affrun("torchrun", "--help").stdout
    plan_help = affrun("plan", "--help").stdout
    sbatch_help = affrun("sbatch", "--help").stdout
    for spec in BINDING_OPTIONS:
        assert spec.flag in exec_help and spec.flag in torchrun_help, spec.flag
        if spec.group != "apply":
            assert spec.flag in plan_help, spec.flag
        if spec.group in ("plan", "env"):
            assert spec.flag in sbatch_help, spec.flag


def test_bad_values_are_refused_alike_by_exec_and_plan() -> None:
    for flag, value in (("--mode", "bogus"), ("--loader-cores", "-1"), ("--gpu-order", "nearest")):
        by_exec = affrun("exec", flag, value, "--", "true")
        by_plan = affrun("plan", flag, value)
        assert by_exec.returncode == 2 and by_plan.returncode == 2, (flag, by_exec.stderr, by_plan.stderr)
        assert "Traceback" not in by_exec.stderr + by_plan.stderr


def test_sbatch_table_fills_every_sbatch_spec_field_but_affrun_s_own() -> None:
    from launcher.slurm.options import SBATCH_OPTIONS
    from launcher.slurm.profile import KEYS
    from launcher.slurm.script import SbatchSpec

    filled = {o.field for o in SBATCH_OPTIONS if o.field is not None}
    affruns = {"command", "plan", "omp_bind", "env_policy", "mem_policy", "verbose"}
    assert filled | affruns == {f.name for f in fields(SbatchSpec)} and not filled & affruns
    assert {o.key for o in SBATCH_OPTIONS} <= set(KEYS)
    sbatch_help = affrun("sbatch", "--help").stdout
    for option in SBATCH_OPTIONS:
        assert all(flag.split("/")[0] in sbatch_help for flag in option.flags), option.flags


def test_each_front_end_s_name_of_an_option_is_one_it_takes() -> None:
    """Errors spell options with :meth:`OptionSpec.name`: each name must be what that front end accepts."""
    from launcher.slurm.profile import KEYS
    from launcher.submitit import AFFRUN_OPTIONS

    exec_help = affrun("exec", "--help").stdout
    for spec in BINDING_OPTIONS:
        assert spec.name("cli") in exec_help, spec.flag
        assert spec.name("python") in AFFRUN_OPTIONS, spec.flag
        if spec.group in ("plan", "env"):
            assert spec.name("profile") in KEYS, spec.flag


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
