"""The one verdict a rank gets (launcher/feed/verdict.py): the meter, doctor --pid and tune share it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from launcher.feed import verdict as v

fraction = st.one_of(st.none(), st.floats(0.0, 1.0))


def test_a_busy_gpu_is_fed_whatever_the_cpu_side_says() -> None:
    out = v.judge(v.Signals(gpu_busy=0.95, data_wait=0.5, cpu_wait=0.5))
    assert out.kind == v.FED and out.fix == ""
    assert "busy 95%" in out.evidence


def test_no_gpu_signal_is_unknown_but_says_what_the_cpu_side_suggests() -> None:
    out = v.judge(v.Signals(data_wait=0.065, cpu_wait=0.79, cpu_cause=v.COLLAPSE, cause_text="every process on CPU 0"))
    assert out.kind == v.UNKNOWN and out.likely == v.CPU and out.cause == v.COLLAPSE
    assert "no GPU signal" in out.evidence and "79%" in out.evidence and "CPU 0" in out.evidence
    assert out.fix == v.CPU_FIXES[v.COLLAPSE]


def test_the_collapsed_h200_job_is_starved_of_cpu_not_of_data() -> None:
    # the first GPU run: GPU 11% busy, the loop 6.5% in next(), the main thread waiting for CPU 0
    out = v.judge(v.Signals(gpu_busy=0.11, data_wait=0.065, cpu_wait=0.6, cpu_cause=v.COLLAPSE))
    assert out.kind == v.CPU and out.cause == v.COLLAPSE


def test_a_data_wait_that_is_the_main_threads_cpu_wait_is_not_data_starvation() -> None:
    # 74% in next(), of which 79%-worth was waiting for a CPU: the CPU starves it
    assert v.judge(v.Signals(gpu_busy=0.3, data_wait=0.74, cpu_wait=0.79)).kind == v.CPU
    assert v.judge(v.Signals(gpu_busy=0.3, data_wait=0.74, cpu_wait=0.02)).kind == v.DATA


def test_a_cause_nobody_measured_is_not_named() -> None:
    """The meter sees the main thread's wait for a CPU, not what causes it: no cause (it said "oversubscribed" for a
    neighbour's spin), and a fix that says how to find it."""
    for gpu in (None, 0.3):
        out = v.judge(v.Signals(gpu_busy=gpu, data_wait=0.05, cpu_wait=0.6))
        assert out.cause is None and "affrun doctor --pid" in out.fix and "oversubscribed" not in out.evidence


def test_throttling_is_named_as_the_cause_when_the_caller_found_none() -> None:
    out = v.judge(v.Signals(gpu_busy=0.2, data_wait=0.1, cpu_wait=0.57, throttled=0.4))
    assert out.kind == v.CPU and out.cause == v.THROTTLED and "quota" in out.fix


def test_an_idle_gpu_with_a_fed_cpu_side_is_underused_and_without_a_data_figure_unknown() -> None:
    assert v.judge(v.Signals(gpu_busy=0.27, data_wait=0.04, cpu_wait=0.01)).kind == v.UNDERUSED
    out = v.judge(v.Signals(gpu_busy=0.27, cpu_wait=0.01))
    assert out.kind == v.UNKNOWN and "--feed-report" in out.evidence


@given(fraction, fraction, fraction, fraction)
def test_every_verdict_is_one_of_the_kinds_with_a_fix_unless_fed(
    gpu: float | None, data: float | None, cpu: float | None, throttled: float | None
) -> None:
    out = v.judge(v.Signals(gpu_busy=gpu, data_wait=data, cpu_wait=cpu, throttled=throttled))
    assert out.kind in v.KINDS
    assert (out.kind == v.FED) == (gpu is not None and gpu >= v.FED_BUSY)
    assert (out.kind == v.UNKNOWN) <= (gpu is None or data is None)
    if out.kind in (v.CPU, v.DATA, v.UNDERUSED):
        assert out.fix
    assert set(out.to_json()) == {"verdict", "evidence", "fix", "likely", "cause"}
