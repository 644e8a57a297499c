"""affrun sbatch: the batch script, site profiles, and its options."""
