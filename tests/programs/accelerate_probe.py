"""One accelerate process: records its local rank, mask and thread variables, then waits for the others."""

from accelerate import Accelerator
from probe_record import record

acc = Accelerator(cpu=True)
record("rank", local_rank=acc.local_process_index, world=acc.num_processes, distributed=str(acc.distributed_type))
acc.wait_for_everyone()
