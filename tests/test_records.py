"""launcher.base.records makes the exec path's classes without importing dataclasses: they must behave as the
dataclasses mypy checks them as, for what affrun uses."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from launcher.base import records


def _pair(frozen: bool) -> tuple[type, type]:
    def body() -> dict[str, object]:
        return {"__annotations__": {"a": "int", "b": "tuple[int, ...]", "c": "dict[int, int]", "d": "str | None"},
                "b": (), "c": records.field(default_factory=dict, compare=False), "d": None}

    mine = records._dataclass(type("Thing", (), body()), frozen=frozen)
    theirs = dataclasses.dataclass(frozen=frozen)(
        type("Thing", (), body() | {"c": dataclasses.field(default_factory=dict, compare=False)}))
    return mine, theirs


@pytest.mark.parametrize("frozen", [True, False])
def test_a_record_behaves_as_the_dataclass(frozen: bool) -> None:
    mine, theirs = _pair(frozen)
    for args, kwargs in [((1,), {}), ((1, (2, 3)), {"d": "x"}), ((), {"a": 4, "c": {1: 2}})]:
        m, t = mine(*args, **kwargs), theirs(*args, **kwargs)
        assert repr(m) == repr(t)
        assert m == mine(*args, **kwargs) and m != mine(99)
        assert (m == mine(*args, **{**kwargs, "c": {7: 7}})) == (t == theirs(*args, **{**kwargs, "c": {7: 7}}))
        assert records.replace(m, a=5) == mine(5, m.b, m.c, m.d)
        assert [(f.name, "-" if f.default is records.MISSING else f.default) for f in records.fields(m)] == [
            (f.name, "-" if f.default is dataclasses.MISSING else f.default) for f in dataclasses.fields(t)]
        if frozen:
            assert hash(m) == hash(mine(*args, **kwargs))
            with pytest.raises(AttributeError):
                m.a = 2
        else:
            with pytest.raises(TypeError):
                hash(m)
            m.a = 2
            assert m.a == 2
    for bad_args, bad_kwargs in [((), {}), ((1, 2, 3, 4, 5), {}), ((1,), {"a": 1}), ((1,), {"nope": 1})]:
        with pytest.raises(TypeError):
            mine(*bad_args, **bad_kwargs)
        with pytest.raises(TypeError):
            theirs(*bad_args, **bad_kwargs)


def test_fields_and_replace_take_real_dataclasses_too() -> None:
    _, theirs = _pair(True)
    t = theirs(1)
    assert records.replace(t, a=2) == theirs(2)
    assert [f.name for f in records.fields(t)] == ["a", "b", "c", "d"]


def test_a_subclass_inherits_the_fields_and_pickles() -> None:
    from launcher.options.plan_options import PlanOptions
    from launcher.submitit import AffinityOptions

    opts = AffinityOptions(mode="numa", verbose=True)
    assert [f.name for f in records.fields(opts)][: len(records.fields(PlanOptions))] == [
        f.name for f in records.fields(PlanOptions)]
    assert pickle.loads(pickle.dumps(opts)) == opts
