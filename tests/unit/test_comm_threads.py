"""launcher.bind.comm_threads.on_cpus with real threads and real masks: a thread started inside the wrapped call
is born on the comm CPUs, the caller gets its own mask back (also when the call raises), a nested call does not
narrow again, and a call already on those CPUs is left alone."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

from launcher.bind.comm_threads import MARK, on_cpus
from tests.conftest import need


def in_thread(body: Callable[[], Any]) -> Any:
    """``body()`` in a new thread of this process (its mask changes never reach the test's own thread)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = body()
        except BaseException as exc:  # handed back to the test
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def born_mask() -> frozenset[int]:
    """The mask of a thread started now, as it reads it first thing."""
    seen: dict[str, frozenset[int]] = {}
    t = threading.Thread(target=lambda: seen.setdefault("mask", frozenset(os.sched_getaffinity(0))))
    t.start()
    t.join()
    return seen["mask"]


def test_a_thread_started_inside_is_born_on_the_comm_cpus_and_the_caller_gets_its_mask_back() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    need(len(cpus) >= 2, "needs 2 CPUs")
    comm = frozenset(cpus[-1:])
    wrapped = on_cpus(born_mask, comm)
    assert getattr(wrapped, MARK) == comm and wrapped.__name__ == "born_mask"

    def body() -> tuple[frozenset[int], frozenset[int]]:
        return wrapped(), frozenset(os.sched_getaffinity(0))

    child, after = in_thread(body)
    assert child == comm
    assert after == frozenset(cpus)


def test_the_callers_mask_comes_back_when_the_call_raises_and_a_nested_call_does_not_narrow_again() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    need(len(cpus) >= 2, "needs 2 CPUs")
    comm = frozenset(cpus[-1:])
    seen: list[frozenset[int]] = []

    def inner() -> None:
        seen.append(frozenset(os.sched_getaffinity(0)))
        raise KeyError("the real call's own error")

    wrapped_inner = on_cpus(inner, comm)

    def outer() -> None:
        os.sched_setaffinity(0, comm)  # a call that moves its thread: the outermost wrapper still restores
        wrapped_inner()

    wrapped_outer = on_cpus(outer, frozenset(cpus[:1]))

    def body() -> frozenset[int]:
        with pytest.raises(KeyError, match="the real call's own error"):
            wrapped_outer()
        return frozenset(os.sched_getaffinity(0))

    assert in_thread(body) == frozenset(cpus)
    assert seen == [comm]  # the nested wrapper left the mask as the outer call had it


def test_a_caller_already_on_the_comm_cpus_runs_as_it_is() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    need(len(cpus) >= 2, "needs 2 CPUs")
    comm = frozenset(cpus[:1])

    def body() -> tuple[frozenset[int], frozenset[int]]:
        os.sched_setaffinity(0, comm)
        return on_cpus(born_mask, comm)(), frozenset(os.sched_getaffinity(0))

    assert in_thread(body) == (comm, comm)
