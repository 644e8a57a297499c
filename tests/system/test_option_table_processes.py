"""test_option_table: the tests that start processes or load real runtimes (tests/system). The in-process ones are tests/unit/test_option_table.py."""

from __future__ import annotations

from dataclasses import fields

from launcher.options.table import BINDING_OPTIONS
from tests.launch import affrun


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

    filled = {o.dest for o in SBATCH_OPTIONS if o.dest != "template"}  # the template is the command's own
    affruns = {"command", "options", "verbose", "tuned"}  # affrun's own options: Options, --tuned
    assert filled | affruns == {f.name for f in fields(SbatchSpec)} and not filled & affruns
    assert {o.name("profile") for o in SBATCH_OPTIONS} <= set(KEYS)
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
