"""Benchmarks: ours against a reference or the physical limit, side by side in one run."""
