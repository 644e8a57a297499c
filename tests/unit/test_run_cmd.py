"""``affrun run``'s own behaviour: the plan it hands down, the role of the first process, what reaches COMMAND."""

from __future__ import annotations

import pytest

from launcher.launch.run_cmd import top_role


@pytest.mark.parametrize(
    ("command", "role"),
    [
        (["accelerate", "launch", "train.py"], "launcher"),
        (["/venv/bin/torchrun", "--nproc-per-node", "2", "t.py"], "launcher"),
        (["deepspeed", "--num_gpus", "2", "t.py"], "launcher"),
        (["env", "A=1", "mpirun", "-n", "2", "python", "t.py"], "launcher"),
        (["python", "-m", "torch.distributed.run", "t.py"], "launcher"),
        (["python", "train.py"], "rank0"),
        (["python", "-m", "mypkg.train"], "rank0"),
        # read as the interpreter reads its argv: -mMODULE, a launcher's console script run by python, a runner
        (["python3", "-mtorch.distributed.run", "t.py"], "launcher"),
        (["python", "/venv/bin/torchrun", "t.py"], "launcher"),
        (["uv", "run", "python", "-u", "-m", "deepspeed.launcher.runner", "t.py"], "launcher"),
        (["python", "-c", "import t", "-m", "torch.distributed.run"], "rank0"),  # -c runs the code; -m is its argv
        (["python", "train.py", "-m", "torch.distributed.run"], "rank0"),
    ],
)
def test_top_role(command: list[str], role: str) -> None:
    assert top_role(command) == role


