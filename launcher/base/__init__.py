"""Pure parsers of untrusted text (CPU lists, numbers, JSON, Slurm variables): no other affrun import."""
