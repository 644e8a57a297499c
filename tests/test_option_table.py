"""One table of binding options: every front end offers the same flags with the same defaults."""

from __future__ import annotations

import argparse
from dataclasses import fields

from launcher.exec_cmd import add_binding_arguments, build_parser, plan_options_from
from launcher.option_table import BINDING_OPTIONS, options_in
from launcher.options import PlanOptions
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
