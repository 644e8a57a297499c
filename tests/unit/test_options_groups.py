"""The option records (launcher.options.groups) are the option table's groups, and the flags they write read back
as the same options."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from launcher.errors import ConfigError
from launcher.options.groups import ApplyOptions, BindingOptions, SourceOptions
from launcher.options.plan_options import PlanOptions
from launcher.options.table import add_binding_arguments, options_in


@pytest.mark.parametrize("record,groups", [(SourceOptions, ("topology",)), (PlanOptions, ("plan",)),
                                           (ApplyOptions, ("env", "apply"))])
def test_each_record_is_its_groups_of_the_table(record: type, groups: tuple[str, ...]) -> None:
    specs = options_in(*groups)
    assert sorted(f.name for f in fields(record)) == sorted(s.dest for s in specs)
    made = record()
    assert {s.dest: getattr(made, s.dest) for s in specs} == {s.dest: s.default for s in specs}


def parse(argv: list[str], prefix: str = "") -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_binding_arguments(parser, prefix=prefix)
    parser.add_argument("--verbose", action="store_true", dest=prefix + "verbose")
    return parser.parse_args(argv)


GIVEN = BindingOptions(SourceOptions(fsroot="/srv/tree", topology_file=None, cpus="0-7"),
                       PlanOptions(mode="numa", loader_cores=2, reserve="0", spill="none"),
                       ApplyOptions(omp_bind="core", env_policy="override", mem_policy="membind",
                                    mem_backend="numactl"),
                       verbose=True)


def test_flags_read_back_as_the_same_options() -> None:
    assert BindingOptions.from_args(parse(GIVEN.to_argv())) == GIVEN
    assert BindingOptions.from_args(parse([])) == BindingOptions()
    assert BindingOptions().to_argv() == []


def test_torchrun_prefix() -> None:
    """``affrun torchrun`` keeps its options under ``affrun_`` dests, beside torchrun's own."""
    assert BindingOptions.from_args(parse(GIVEN.to_argv(), prefix="affrun_"), prefix="affrun_") == GIVEN


def test_values_by_dest_and_a_stray_key() -> None:
    opts = BindingOptions.from_values({"mode": "socket", "mem_policy": "none", "cpus": "1", "verbose": True})
    assert (opts.plan.mode, opts.apply.mem_policy, opts.source.cpus, opts.verbose) == ("socket", "none", "1", True)
    assert opts.plan.loader_cores == PlanOptions().loader_cores
    with pytest.raises(TypeError, match="json"):
        BindingOptions.from_values({"json": True})


def test_a_wrong_choice_names_its_option() -> None:
    with pytest.raises(ConfigError) as caught:
        ApplyOptions(mem_policy="fastest").check()  # type: ignore[arg-type]
    assert str(caught.value).startswith("mem_policy='fastest': choose one of auto,")
