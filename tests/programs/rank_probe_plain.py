"""A rank that only records itself (DeepSpeed's launcher passes --local_rank=N, ignored here)."""

from probe_record import record

record("rank")
