"""Merlin's inference engine: NumPy + Numba, no Qt. Usable headless (CLI, tests, benchmarks)."""
