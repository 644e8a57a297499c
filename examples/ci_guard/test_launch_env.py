"""CI guard: the job's launch environment must not starve the CPUs of the production node.

machine.json is the node's topology, saved there with `affrun topology --save machine.json`.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_launch_environment_is_safe(affinity_doctor):
    env = affinity_doctor.load_env_file(HERE / "launch.env")
    # 8 ranks (one per GPU) with torch's libgomp; fails on any finding of severity "error".
    affinity_doctor.assert_safe(env, nproc_per_node=8, topology=HERE / "machine.json", openmp=["libgomp"])
