"""Bounds and defaults that commands check before any heavy module is imported."""

DEFAULT_POLL_LIMIT = 100
POLL_LIMIT_RANGE = (1, 1000)
