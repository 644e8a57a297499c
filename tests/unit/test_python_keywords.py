"""Python values are checked where they are given: one check per keyword serves bind_rank, ensure_affinity and the
submitit executor (issue 26, class 10).

A count above any machine (``loader_cores=10**50``), a CPU list that names no CPU (``cpus=' '``), a flag that is
not a bool (``quiet='no'``, ``warn=1``, ``verbose='yes'``): one ``ConfigError`` naming the keyword, raised by the
call that was given it (the executor's constructor, not each task after the queue wait), in the same words from
every front end.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from launcher.base.cpulist import MAX_CPU_ID
from launcher.errors import ConfigError
from launcher.options.table import BINDING_OPTIONS

MAX_COUNT = MAX_CPU_ID + 1  # no machine has more CPUs than affrun has CPU ids


def refusal(call: Callable[..., object], **kwargs: object) -> str:
    """The one ConfigError ``call(**kwargs)`` raises, as text; nothing bound meanwhile."""
    before = os.sched_getaffinity(0)
    with pytest.raises(ConfigError) as caught:
        call(**kwargs)
    assert os.sched_getaffinity(0) == before
    text = str(caught.value)
    assert "\n" not in text and len(text) < 300, text
    return text


def front_ends(tmp_path: Path) -> dict[str, Callable[..., object]]:
    """Each Python front end that takes affrun's options as keywords, called with ``**options``."""
    from launcher import bind_rank
    from launcher.submitit import AffinityExecutor, AffinityOptions

    updated = AffinityExecutor(folder=tmp_path / "update", cluster="local")
    return {
        "bind_rank": lambda **kw: bind_rank(0, 1, quiet=True, **kw),
        "AffinityExecutor": lambda **kw: AffinityExecutor(folder=tmp_path / "logs", cluster="local", **kw),
        "update_parameters": lambda **kw: updated.update_parameters(**kw),
        "AffinityOptions": lambda **kw: AffinityOptions.from_kwargs(**kw),
    }


COUNTS = [spec.name("python") for spec in BINDING_OPTIONS if spec.kind == "count"]
TOO_MANY: list[object] = [10**50, MAX_COUNT + 1, 2**64, 2**31]


@pytest.mark.parametrize("keyword", COUNTS)
@pytest.mark.parametrize("value", TOO_MANY, ids=str)
def test_a_count_above_any_machine_is_refused_by_every_front_end_alike(unbound: None, tmp_path: Path, keyword: str,
                                                                       value: object) -> None:
    texts = {name: refusal(call, **{keyword: value}) for name, call in front_ends(tmp_path).items()}
    assert all(t.startswith(f"{keyword}=") for t in texts.values()), texts
    assert len(set(texts.values())) == 1, texts


BLANK = [" ", "", "\t", "\n", ",", " , ", ",,"]
NOT_A_LIST = ["x", "0-", "999999", "1-0x"]


@pytest.mark.parametrize("value", BLANK + NOT_A_LIST, ids=repr)
def test_a_cpu_list_string_is_read_where_it_is_given(unbound: None, tmp_path: Path, value: str) -> None:
    texts = {name: refusal(call, cpus=value) for name, call in front_ends(tmp_path).items()}
    assert all(t.startswith("cpus=") for t in texts.values()), texts
    assert len(set(texts.values())) == 1, texts


def test_the_executor_refuses_at_construction_and_queues_nothing(tmp_path: Path) -> None:
    from launcher.submitit import AffinityExecutor

    for kwargs in ({"loader_cores": 10**50}, {"cpus": " "}, {"verbose": "yes"}):
        with pytest.raises(ConfigError):
            AffinityExecutor(folder=tmp_path / "logs", cluster="local", **kwargs)
    assert not any((tmp_path / "logs").glob("**/*.pkl"))


NOT_BOOLS: list[object] = ["no", "False", 1, 0, None, "", [], 1.0]


@pytest.mark.parametrize("value", NOT_BOOLS, ids=repr)
def test_a_flag_keyword_is_a_bool_in_every_function(unbound: None, tmp_path: Path, value: object) -> None:
    """bind_rank(quiet=), ensure_affinity(warn=), the executor's verbose=: one check, the same words."""
    from launcher import bind_rank, ensure_affinity
    from launcher.submitit import AffinityExecutor

    before = dict(os.environ)
    texts = {
        "quiet": refusal(lambda: bind_rank(0, 1, quiet=value)),
        "warn": refusal(lambda: ensure_affinity(warn=value)),
        "verbose": refusal(lambda: AffinityExecutor(folder=tmp_path / "logs", cluster="local", verbose=value)),
    }
    assert dict(os.environ) == before
    assert texts["quiet"].startswith("bind_rank: quiet=") and texts["warn"].startswith("ensure_affinity: warn=")
    assert texts["verbose"].startswith("verbose=")
    tails = {t.split("=", 1)[1] for t in texts.values()}
    assert len(tails) == 1, texts


@pytest.mark.parametrize("value", TOO_MANY, ids=str)
def test_a_rank_count_above_any_machine_is_refused_alike(unbound: None, value: int) -> None:
    from launcher import bind_rank, ensure_affinity

    ranks = refusal(lambda: bind_rank(0, value, quiet=True))
    ensure = refusal(lambda: ensure_affinity(nproc_per_node=value))
    assert ranks.startswith(f"bind_rank: nproc_per_node={value}") and ensure.startswith("ensure_affinity: ")
    assert ranks.split(": ", 1)[1] == ensure.split(": ", 1)[1]


def test_counts_and_flags_that_fit_still_work(unbound: None, tmp_path: Path) -> None:
    from launcher import bind_rank
    from launcher.submitit import AffinityExecutor

    cpu = sorted(os.sched_getaffinity(0))[0]
    report = bind_rank(0, 1, quiet=False, cpus=f" {cpu} ", loader_cores=0)
    assert report.cpus == (cpu,)
    executor = AffinityExecutor(folder=tmp_path / "logs", cluster="local", loader_cores=MAX_COUNT, verbose=True,
                                reserve=" ")
    assert executor.options.loader_cores == MAX_COUNT


