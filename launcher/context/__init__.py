"""What the process already is: its local rank, its launcher, other binders, its inherited mask, the runtimes it loaded."""
