"""Merlin: a desktop chat app for Qwen3-VL models with its own NumPy + Numba inference engine.

Two subpackages with a one-way arrow between them: ``merlin.app`` (Qt) uses
``merlin.engine`` (numerics, never Qt). The contracts are in pyproject.toml (import-linter).
"""
