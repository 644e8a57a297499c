"""The batch-script templates of ``affrun sbatch``, shipped as package data (see README.md here)."""
