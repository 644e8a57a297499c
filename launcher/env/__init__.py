"""Plan -> variables, pure: the environment policy, OpenMP place syntax, the rank line."""
