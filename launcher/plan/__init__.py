"""Request -> per-rank plan, pure: homes, closest order, spill, the wire format."""
