"""What the meter adds to its figures for issue 39 (the loop thread's CPU wait, the rank's GPU, the verdict in its
line), how readers take figures with and without them, tune's verdict column, and the bounded merge of issue 40."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from launcher.base.pci import pci_address
from launcher.base.schedstat import thread_schedstat
from launcher.feed import files
from launcher.feed.cpuwait import CpuWait
from launcher.feed.figures import figures_of
from launcher.feed.gpubusy import NO_GPU, environment_choice
from launcher.feed.meter import feed_line
from launcher.feed.verdict import Signals, judge
from launcher.tune.candidates import DEFAULT, Candidate
from launcher.tune.measure import reading, window
from launcher.tune.result import TrialResult, table, to_json

OLD = {"rank": 1, "batches": 3, "seconds": 1.5, "batches_per_s": 2.0, "data_wait_fraction": 0.25, "loaders": 1,
       "num_workers": [2], "workers_source": "asked", "final": True, "pid": 7, "host": "h"}


def _schedstat(root: Path, tid: int, wait_ns: int) -> None:
    where = root / "self" / "task" / str(tid)
    where.mkdir(parents=True, exist_ok=True)
    (where / "schedstat").write_text(f"123456 {wait_ns} 42\n")


def test_the_cpu_wait_is_the_run_queue_delay_over_the_time_between_readings(tmp_path: Path) -> None:
    tid = threading.get_native_id()
    _schedstat(tmp_path, tid, 1_000_000_000)
    wait = CpuWait(str(tmp_path))
    wait.start(10.0)
    assert wait.read(10.0) is None  # no time has passed: not measured, never 0
    _schedstat(tmp_path, tid, 1_500_000_000)
    assert wait.read(12.0) == pytest.approx(0.25)
    (tmp_path / "self" / "task" / str(tid) / "schedstat").unlink()  # the thread ended: the last figure stays
    assert wait.read(13.0) == pytest.approx(0.25)


def test_without_schedstat_the_cpu_wait_is_absent(tmp_path: Path) -> None:
    wait = CpuWait(str(tmp_path))
    wait.start(1.0)
    assert wait.read(5.0) is None
    (tmp_path / "1" / "task" / "2").mkdir(parents=True)
    (tmp_path / "1" / "task" / "2" / "schedstat").write_text("not numbers")
    assert thread_schedstat(1, 2, str(tmp_path)) is None and thread_schedstat(1, 3, str(tmp_path)) is None


@pytest.mark.parametrize(("environ", "choice"), [
    ({"AFFRUN_GPU_PCI": "0000:17:00.0", "CUDA_VISIBLE_DEVICES": "3"}, ("pci", "0000:17:00.0")),
    ({"CUDA_VISIBLE_DEVICES": "2,3", "LOCAL_RANK": "1"}, ("index", "3")),
    ({"CUDA_VISIBLE_DEVICES": "GPU-abc,GPU-def"}, ("uuid", "GPU-abc")),
    ({"LOCAL_RANK": "2"}, ("index", "2")),
    ({"CUDA_VISIBLE_DEVICES": ""}, NO_GPU),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, NO_GPU),
    ({"CUDA_VISIBLE_DEVICES": "0", "LOCAL_RANK": "1"}, None),  # not visible at that rank: torch may say
    ({"AFFRUN_GPU_PCI": ""}, None),  # affrun gave the rank no GPU, the environment nothing: torch's, if any
])
def test_the_rank_s_gpu_from_its_environment(environ: dict[str, str], choice: tuple[str, str] | None) -> None:
    assert environment_choice(environ) == choice


def test_pci_addresses_of_sysfs_and_nvml_are_one_key() -> None:
    assert pci_address("0000:17:00.0") == pci_address("00000000:17:00.0") == pci_address("17:00.0") is not None
    assert pci_address("0000:18:00.0") != pci_address("0000:17:00.0") and pci_address("GPU-abc") is None


def test_figures_without_the_new_keys_are_still_read() -> None:
    old = figures_of(OLD)
    assert old is not None and old.cpu_wait_fraction is None and old.gpu_busy_fraction is None
    assert old.verdict is None and judge(old.signals()).kind == "unknown"
    new = {**OLD, "cpu_wait_fraction": 0.5, "gpu_busy_fraction": 0.3, "gpu_busy_source": "process",
           "verdict": judge(Signals(gpu_busy=0.3, data_wait=0.25, cpu_wait=0.5)).to_json()}
    read = figures_of(new)
    assert read is not None and (read.cpu_wait_fraction, read.gpu_busy_fraction) == (0.5, 0.3)
    assert read.verdict == "starved-of-cpu" and read.to_json()["gpu_busy_source"] == "process"
    for key, bad in [("cpu_wait_fraction", 1.5), ("gpu_busy_fraction", "half"), ("gpu_busy_source", "bus"),
                     ("verdict", {"verdict": "hungry"})]:
        assert figures_of({**new, key: bad}) is None, key


def _line(**extra: Any) -> str:
    figures = {**OLD, "cpu_wait_fraction": None, "gpu_busy_fraction": None, **extra}
    signals = Signals(gpu_busy=figures["gpu_busy_fraction"], data_wait=0.25, cpu_wait=figures["cpu_wait_fraction"])
    return feed_line({**figures, "verdict": judge(signals).to_json()})


def test_the_line_carries_what_was_measured_and_the_verdict() -> None:
    prefix = "affrun: rank 1 feed: 3 batches in 1.5 s, 2.0 batches/s, data wait 25.0%"
    assert _line() == f"{prefix} (unknown: no GPU signal; likely starved-by-data; more loader cores or " \
                      "DataLoader workers: affrun tune tries them)"
    assert _line(cpu_wait_fraction=0.031, gpu_busy_fraction=0.9) == f"{prefix}, cpu wait 3.1%, gpu busy 90% (fed)"
    assert _line(cpu_wait_fraction=0.6, gpu_busy_fraction=0.3).startswith(
        f"{prefix}, cpu wait 60.0%, gpu busy 30% (starved-of-cpu; find what keeps the main thread from a CPU")
    assert feed_line(OLD) == prefix  # an older meter's figures: no verdict to show


def test_a_merge_does_bounded_work_whatever_the_file_holds(tmp_path: Path) -> None:
    path = tmp_path / "feed.json"
    many = json.dumps([{**OLD, "rank": r} for r in range(1, 3000)]).encode()
    path.write_bytes(many)
    assert files.merge_json(str(path), {"rank": 0}, 0.05, most=64 << 10) == "large"
    assert path.read_bytes() == many  # left as it was, unread
    assert files.merge_json(str(path), {"rank": 0}, 0.05) == "written"  # at exit: whatever it holds
    assert len(json.loads(path.read_bytes())) == 3000
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000)  # not a list of objects: replaced, as a corrupt file is
    assert files.merge_json(str(path), {"rank": 0}, 0.05, most=64 << 10) == "written"
    path.write_text('[{"rank": 2}, {"no": "rank"}, {"rank": true}]')  # objects without a rank are no figures
    assert files.merge_json(str(path), {"rank": 0}, 0.05) == "written"
    assert json.loads(path.read_text()) == [{"rank": 0}, {"rank": 2}]


def _rank(seconds: float, wait: float, cpu: float | None, busy: float | None = None) -> dict[str, Any]:
    return {**OLD, "rank": 0, "batches": int(100 * seconds), "seconds": seconds, "data_wait_fraction": wait,
            "cpu_wait_fraction": cpu, "gpu_busy_fraction": busy, "final": False}


def test_tune_windows_the_cpu_wait_and_judges_each_trial() -> None:
    w = window(reading([_rank(2.0, 0.5, 0.5)]), reading([_rank(4.0, 0.5, 0.75)]))
    assert w is not None and w.cpu_wait_fraction == pytest.approx(1.0) and w.gpu_busy_fraction is None
    old = window(reading([OLD]), reading([{**OLD, "seconds": 3.0, "batches": 9}]))
    assert old is not None and old.cpu_wait_fraction is None  # an older meter's figures
    starved = TrialResult(DEFAULT, [10.0], [0.9], cpu_waits=[0.05], gpu_busies=[None])
    fed = TrialResult(Candidate(1, 2), [30.0], [0.05], cpu_waits=[0.02], gpu_busies=[0.9])
    unmeasured = TrialResult(Candidate(1, 4), cpu_waits=[None], pruned="pruned: x")
    text = table([starved, fed, unmeasured], "asked").splitlines()
    assert "cpu" in text[0] and "verdict" in text[0]
    assert "  5% " in text[1] and "~starved-by-data" in text[1]
    assert " fed " in text[2] and "3.00x" in text[2]
    assert text[-1].startswith("verdict: ~ is what the waits alone suggest")
    data = to_json([starved, fed, unmeasured], None, "asked", "")
    assert data["trials"][0]["verdict"]["likely"] == "starved-by-data" and data["trials"][1]["verdict"]["verdict"] == "fed"
    assert data["trials"][0]["cpu_wait_fraction"] == 0.05 and data["trials"][2]["verdict"] is None
