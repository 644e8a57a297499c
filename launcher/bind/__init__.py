"""The hand-off of the plan to each rank, and applying it: mask, memory policy, exec, in-process binding, read-back."""
