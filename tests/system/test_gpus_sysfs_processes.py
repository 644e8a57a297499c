"""test_gpus_sysfs: the tests that start processes or load real runtimes (tests/system). The in-process ones are tests/unit/test_gpus_sysfs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.fakesys import FakeGPU, write_tree
from tests.launch import affrun
from tests.machines import FAKE_PYNVML, four_gpu_tree, two_node_machine


def test_cli_hidden_gpus_with_no_gpu_run(tmp_path: Path) -> None:
    """CUDA_VISIBLE_DEVICES=-1 once failed the rank ("'-1' is not a GPU index", exit 2), even with --no-gpu."""
    root = four_gpu_tree(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_", "AFFRUN_"))}
    env["CUDA_VISIBLE_DEVICES"] = "-1"
    for extra in (["--no-gpu"], []):
        result = subprocess.run([sys.executable, "-m", "launcher", "exec", "--fsroot", str(root), *extra,
                                 "--", sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                                env=env, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
    plan = subprocess.run([sys.executable, "-m", "launcher", "topology", "--fsroot", str(root)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert plan.returncode == 0 and "no GPU is visible" in plan.stdout + plan.stderr


def test_reading_gpus_loads_no_optional_module(tmp_path: Path) -> None:
    """The exec path reads sysfs: it must not import pynvml, the NVML module or the XML parser."""
    m = two_node_machine()
    m.gpus = [FakeGPU(pci="0000:17:00.0", numa_node=0)]
    root = write_tree(tmp_path, m)
    code = (
        "import sys; from launcher.topology import load_topology; "
        f"t = load_topology(fsroot={str(root)!r}, environ={{}}); assert len(t.gpus) == 1; "
        "bad = [m for m in ('pynvml', 'launcher.topology.nvml', 'xml.etree.ElementTree', 'launcher.topology.hwloc_xml',"
        " 'click', 'psutil', 'yaml', 'cpuinfo', 'submitit', 'torch') if m in sys.modules]; assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_topology_nvml_flag_adds_uuids_and_warns(tmp_path: Path) -> None:
    """``affrun topology --nvml`` with nvidia-ml-py's module on the path (NVML needs a GPU: its answers are stated)."""
    m = two_node_machine()
    m.gpus = [FakeGPU(pci="0000:17:00.0", numa_node=0)]
    root = write_tree(tmp_path / "m", m)
    fake = tmp_path / "nvml"
    fake.mkdir()
    (fake / "pynvml.py").write_text(FAKE_PYNVML.format(gpus=[("00000000:17:00.0", "GPU-abc"),
                                                             ("00000000:ff:00.0", "GPU-other")]))
    env = {"PYTHONPATH": f"{fake}:{os.environ.get('PYTHONPATH', '')}"}
    plain = affrun("topology", "--fsroot", str(root), "--json", env=env)
    checked = affrun("topology", "--fsroot", str(root), "--json", "--nvml", env=env)
    assert plain.returncode == checked.returncode == 0, checked.stderr
    assert [g["uuid"] for g in json.loads(plain.stdout)["gpus"]] == [None]
    data = json.loads(checked.stdout)
    assert [g["uuid"] for g in data["gpus"]] == ["GPU-abc"]
    assert any("0000:ff:00.0" in w and "not found in sysfs" in w for w in data["warnings"])
