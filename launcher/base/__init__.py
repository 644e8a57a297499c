"""Pure parsers of untrusted text (CPU lists, numbers, JSON, Slurm variables) and the one reader of each live source
that a rank shares with the tools (sibling cores, schedstat, NVML): no other affrun import."""
