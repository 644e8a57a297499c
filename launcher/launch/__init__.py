"""The front ends that start ranks (argparse, light): affrun exec, affrun run, affrun torchrun."""
